#include "tests/test_util.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace tandem::testing {

std::string SharedPath(const std::string& relative) {
  const char* env = std::getenv("TANDEM_SHARED_DIR");
  std::string base = (env != nullptr && *env != '\0') ? env : TANDEM_SHARED_DIR;
  return base + "/" + relative;
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return "";
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace tandem::testing
