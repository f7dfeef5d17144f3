// IncrementalDecoder and SanitizeUtf8; see tokenizer.h.
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace tandem::tokenizer {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

std::string SanitizeUtf8(absl::string_view bytes) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(bytes.size());
  const size_t n = bytes.size();
  auto at = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  auto cont = [&](size_t i, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return i < n && at(i) >= lo && at(i) <= hi;
  };
  for (size_t i = 0; i < n;) {
    const uint8_t c = at(i);
    size_t len = 0;  // 0 = ill-formed at i
    if (c < 0x80) {
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = cont(i + 1) ? 2 : 0;
    } else if (c >= 0xE0 && c <= 0xEF) {
      const uint8_t lo = c == 0xE0 ? 0xA0 : 0x80;
      const uint8_t hi = c == 0xED ? 0x9F : 0xBF;  // no surrogates
      len = cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
    } else if (c >= 0xF0 && c <= 0xF4) {
      const uint8_t lo = c == 0xF0 ? 0x90 : 0x80;
      const uint8_t hi = c == 0xF4 ? 0x8F : 0xBF;  // <= U+10FFFF
      len = cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
    }
    if (len == 0) {
      out += kReplacement;
      ++i;
    } else {
      out.append(bytes.data() + i, len);
      i += len;
    }
  }
  return out;
}

std::string IncrementalDecoder::Push(int32_t token_id) {
  pending_ += tokenizer_->TokenBytes(token_id);
  // Find the last lead byte within the final 4 bytes; hold it back if its
  // sequence is not complete yet. Stray continuation bytes are released.
  size_t keep = 0;
  const size_t size = pending_.size();
  for (size_t back = 1; back <= 4 && back <= size; ++back) {
    const uint8_t c = static_cast<uint8_t>(pending_[size - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    if (c >= 0xC0 && internal::Utf8Len(c) > back) keep = back;
    break;
  }
  std::string ready = SanitizeUtf8(absl::string_view(pending_).substr(0, size - keep));
  pending_.erase(0, size - keep);
  return ready;
}

std::string IncrementalDecoder::Flush() {
  std::string rest = SanitizeUtf8(pending_);
  pending_.clear();
  return rest;
}

}  // namespace tandem::tokenizer
