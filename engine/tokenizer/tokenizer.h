// SentencePiece-style (SPM) tokenizer read from GGUF metadata, following
// llama.cpp's llm_tokenizer_spm (llama-vocab.cpp): escape spaces to U+2581,
// prefix one space, split into UTF-8 characters, merge adjacent pairs by
// highest vocab score (ties: leftmost), byte fallback <0xXX> for pieces
// not in the vocab, BOS prepended when add_bos.
//
// Owns: the vocabulary and text <-> ids. Does not touch: model weights.
// Threads: immutable after construction; thread-safe.
#ifndef TANDEM_ENGINE_TOKENIZER_TOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"

namespace tandem::tokenizer {

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model,tokens,scores,token_type,bos_token_id,
  // eos_token_id,unknown_token_id,add_bos_token,add_space_prefix}. Errors:
  // INVALID_ARGUMENT for a missing key or tokenizer.ggml.model != "llama".
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const gguf::GgufFile& file);

  // Text -> ids (no special-token parsing). add_bos: prepend BOS.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;
  // The bytes of one token: U+2581 -> ' ', <0xXX> -> that byte, control
  // tokens (BOS/EOS/UNK) -> "". May be an incomplete UTF-8 sequence.
  std::string TokenBytes(int32_t id) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  bool add_bos() const;  // llama.cpp default for SPM: true
};

// Incremental detokenizer: appends token bytes and releases only complete
// UTF-8 characters; an incomplete tail is held until the next token (or
// Flush(), which returns it as-is). Generated text is not stripped: a
// first piece " Once" stays " Once" (as llama.cpp's server returns it).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer);
  std::string Push(int32_t token_id);
  std::string Flush();
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_TOKENIZER_H_
