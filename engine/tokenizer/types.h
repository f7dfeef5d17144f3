// Vocabulary and token kinds shared by the tokenizer's parts (tokenizer.h
// re-exports them).
#ifndef TANDEM_ENGINE_TOKENIZER_TYPES_H_
#define TANDEM_ENGINE_TOKENIZER_TYPES_H_

#include <cstdint>

namespace tandem::tokenizer {

// tokenizer.ggml.model: "llama" -> kSpm (SentencePiece-style, merges by
// score), "gpt2" -> kBpe (byte-level BPE, merges by rank). llama.cpp's
// LLAMA_VOCAB_TYPE_SPM / LLAMA_VOCAB_TYPE_BPE.
enum class VocabType { kSpm, kBpe };

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type; the GGUF
// stores these numbers, so the values are fixed).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_TYPES_H_
