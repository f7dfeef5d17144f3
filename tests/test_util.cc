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

std::string WireVarint(uint64_t value) {
  std::string out;
  do {
    uint8_t group = value & 0x7F;
    value >>= 7;
    if (value != 0) group |= 0x80;
    out.push_back(static_cast<char>(group));
  } while (value != 0);
  return out;
}

std::string WireTag(int number, int wire_type) {
  return WireVarint((static_cast<uint64_t>(number) << 3) | static_cast<uint64_t>(wire_type));
}

std::string WireLen(int number, absl::string_view payload) {
  return WireTag(number, 2) + WireVarint(payload.size()) + std::string(payload);
}

std::string WireUint(int number, uint64_t value) { return WireTag(number, 0) + WireVarint(value); }

}  // namespace tandem::testing
