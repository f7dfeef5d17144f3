#include "engine/tokenizer/utf8.h"

#include <cstring>

namespace tandem::tokenizer {

size_t WellFormedUtf8Length(absl::string_view bytes, size_t pos) {
  const size_t n = bytes.size();
  auto at = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  // True when bytes[i] exists and lies in [lo, hi].
  auto cont = [&](size_t i, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return i < n && at(i) >= lo && at(i) <= hi;
  };
  const uint8_t c = at(pos);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(pos + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const uint8_t lo = c == 0xE0 ? 0xA0 : 0x80;  // no overlong forms
    const uint8_t hi = c == 0xED ? 0x9F : 0xBF;  // no surrogates
    return cont(pos + 1, lo, hi) && cont(pos + 2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const uint8_t lo = c == 0xF0 ? 0x90 : 0x80;  // no overlong forms
    const uint8_t hi = c == 0xF4 ? 0x8F : 0xBF;  // <= U+10FFFF
    return cont(pos + 1, lo, hi) && cont(pos + 2) && cont(pos + 3) ? 4 : 0;
  }
  return 0;  // 80..C1 (continuation bytes, overlong leads), F5..FF
}

std::optional<Utf8Error> FindInvalidUtf8(absl::string_view bytes) {
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs, eight bytes at a time.
    if (n - i >= 8) {
      uint64_t word;
      std::memcpy(&word, bytes.data() + i, sizeof(word));
      if ((word & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const size_t len = WellFormedUtf8Length(bytes, i);
    if (len == 0) return Utf8Error{i, static_cast<uint8_t>(bytes[i])};
    i += len;
  }
  return std::nullopt;
}

}  // namespace tandem::tokenizer
