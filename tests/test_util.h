// Helpers shared by tests: locating ../shared and reading its files;
// hand-encoding protobuf wire bytes.
#ifndef TANDEM_TESTS_TEST_UTIL_H_
#define TANDEM_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace tandem::testing {

// Absolute path of <checkout>/../shared/<relative>. $TANDEM_SHARED_DIR
// overrides the compiled-in location.
std::string SharedPath(const std::string& relative);
// Whole file as bytes; fails the current test (ADD_FAILURE) and returns ""
// when it cannot be read.
std::string ReadFileOrDie(const std::string& path);

// Protocol Buffers wire format (protobuf.dev/programming-guides/encoding),
// for tests that hand-encode messages a typed setter would not produce
// (text that is not UTF-8, truncated bytes). A message is the
// concatenation of its fields, e.g. WireLen(1, "\xFF") + WireUint(2, 4).
// Base-128 varint, low groups first.
std::string WireVarint(uint64_t value);
// The tag of field `number` with `wire_type` (0 varint, 1 fixed64, 2
// length-delimited, 3/4 group start/end, 5 fixed32).
std::string WireTag(int number, int wire_type);
// A length-delimited field (string, bytes, message, packed array).
std::string WireLen(int number, absl::string_view payload);
// A varint field (int32 >= 0, uint32, uint64, bool, enum).
std::string WireUint(int number, uint64_t value);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TEST_UTIL_H_
