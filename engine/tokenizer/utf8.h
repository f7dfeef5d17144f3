// Strict UTF-8 validation: the well-formed byte sequences of RFC 3629
// section 4 (the Unicode Standard's Table 3-7), as protobuf requires of a
// proto3 `string`. Used by the tokenizer's SanitizeUtf8 and by the servers'
// strict request parsing (common/server/strict_parse.h).
//
// Well-formed sequences (first byte, then each continuation byte's range):
//   00..7F
//   C2..DF  80..BF
//   E0      A0..BF  80..BF      (no overlong forms below U+0800)
//   E1..EC  80..BF  80..BF
//   ED      80..9F  80..BF      (no surrogates U+D800..U+DFFF)
//   EE..EF  80..BF  80..BF
//   F0      90..BF  80..BF 80..BF  (no overlong forms below U+10000)
//   F1..F3  80..BF  80..BF 80..BF
//   F4      80..8F  80..BF 80..BF  (nothing above U+10FFFF)
// Anything else (C0, C1, F5..FF, a stray continuation byte, a sequence cut
// short) is ill-formed.
//
// Threads: pure functions.
#ifndef TANDEM_ENGINE_TOKENIZER_UTF8_H_
#define TANDEM_ENGINE_TOKENIZER_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace tandem::tokenizer {

// Length in bytes (1..4) of the well-formed UTF-8 sequence that starts at
// bytes[pos], or 0 when no well-formed sequence starts there (see the table
// above; a sequence running past the end of `bytes` is ill-formed).
// Requires pos < bytes.size().
size_t WellFormedUtf8Length(absl::string_view bytes, size_t pos);

// Where a byte string stops being well-formed UTF-8.
struct Utf8Error {
  // Offset of the first byte of the first ill-formed subsequence: the byte
  // where decoding from the start fails (for "\xE2\x82" that is the lead
  // 0xE2 at 0, for "a\xED\xA0\x80" the lead 0xED at 1).
  size_t offset = 0;
  uint8_t byte = 0;  // bytes[offset]
};

// nullopt when all of `bytes` is well-formed UTF-8 (the empty string is);
// otherwise the first ill-formed position. O(size).
std::optional<Utf8Error> FindInvalidUtf8(absl::string_view bytes);

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_UTF8_H_
