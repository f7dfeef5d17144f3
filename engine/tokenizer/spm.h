// SentencePiece-style (SPM) merging of one text fragment, following
// llama.cpp's llm_tokenizer_spm_session (src/llama-vocab.cpp): split into
// UTF-8 characters, merge adjacent pairs whose concatenation is a token,
// highest score first (ties: leftmost), and emit any leftover piece that is
// not a token as byte tokens <0xXX>. Internal to engine/tokenizer/.
//
// Owns: the byte -> byte-token table. Does not touch: space escaping and
// prefixing, BOS, special tokens (Tokenizer does those).
// Threads: immutable after construction; thread-safe.
#ifndef TANDEM_ENGINE_TOKENIZER_SPM_H_
#define TANDEM_ENGINE_TOKENIZER_SPM_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/tokenizer/vocab.h"

namespace tandem::tokenizer::internal {

class SpmEncoder {
 public:
  // `vocab` must outlive the encoder.
  explicit SpmEncoder(const Vocab* vocab);

  // Appends the ids of `text` (spaces already escaped to U+2581) to `out`.
  // A truncated UTF-8 sequence at the end is one (short) character.
  void Encode(std::string_view text, std::vector<int32_t>* out) const;

 private:
  const Vocab* vocab_;
  // byte -> <0xXX> token, else the one-byte token, else UNK (llama.cpp's
  // byte_to_token for SPM).
  int32_t byte_tokens_[256];
};

}  // namespace tandem::tokenizer::internal

#endif  // TANDEM_ENGINE_TOKENIZER_SPM_H_
