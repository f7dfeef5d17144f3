// SPM merge: the algorithm of llama.cpp's llm_tokenizer_spm_session
// (src/llama-vocab.cpp), reimplemented; see spm.h.
#include "engine/tokenizer/spm.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "engine/tokenizer/pair_merge.h"

namespace tandem::tokenizer::internal {

SpmEncoder::SpmEncoder(const Vocab* vocab) : vocab_(vocab) {
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    int32_t id = vocab_->Find(hex);
    if (id < 0) id = vocab_->Find(std::string(1, static_cast<char>(b)));
    byte_tokens_[b] = id >= 0 ? id : vocab_->unk;
  }
}

void SpmEncoder::Encode(std::string_view text, std::vector<int32_t>* out) const {
  // Merge the best-scoring adjacent pair (the merged piece's vocab score)
  // until no pair is in the vocab.
  const auto pair_key = [&](std::string_view left,
                            std::string_view right) -> std::optional<double> {
    const int32_t id = vocab_->Find(std::string_view(left.data(), left.size() + right.size()));
    if (id < 0) return std::nullopt;
    return -static_cast<double>(vocab_->scores[static_cast<size_t>(id)]);
  };
  // Every merged piece is a vocab piece by construction; a lone character
  // that is not falls back to its bytes.
  MergeAdjacentPairs(text, pair_key, [&](std::string_view piece) {
    const int32_t id = vocab_->Find(piece);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
    for (char c : piece) {
      const int32_t byte_id = byte_tokens_[static_cast<uint8_t>(c)];
      if (byte_id >= 0) out->push_back(byte_id);  // no byte token and no UNK: dropped
    }
  });
}

}  // namespace tandem::tokenizer::internal
