// IncrementalDecoder and SanitizeUtf8; see tokenizer.h.
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "engine/tokenizer/utf8.h"

namespace tandem::tokenizer {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

std::string SanitizeUtf8(absl::string_view bytes) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const size_t len = WellFormedUtf8Length(bytes, i);
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
  return PushBytes(tokenizer_->TokenBytes(token_id));
}

std::string IncrementalDecoder::PushBytes(absl::string_view bytes) {
  pending_.append(bytes.data(), bytes.size());
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
