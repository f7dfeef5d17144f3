// Helpers shared by tests: locating ../shared and reading its files.
#ifndef TANDEM_TESTS_TEST_UTIL_H_
#define TANDEM_TESTS_TEST_UTIL_H_

#include <string>

namespace tandem::testing {

// Absolute path of <checkout>/../shared/<relative>. $TANDEM_SHARED_DIR
// overrides the compiled-in location.
std::string SharedPath(const std::string& relative);
// Whole file as bytes; fails the current test (ADD_FAILURE) and returns ""
// when it cannot be read.
std::string ReadFileOrDie(const std::string& path);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TEST_UTIL_H_
