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
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/gguf/gguf_file.h"

namespace tandem::tokenizer {

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model,tokens,scores,token_type,bos_token_id,
  // eos_token_id,unknown_token_id,add_bos_token,add_space_prefix}. `model`
  // and `tokens` are required; the rest default as in llama.cpp for SPM
  // (scores 0, type normal, BOS 1, EOS 2, UNK 0, add_bos and
  // add_space_prefix true). Errors: INVALID_ARGUMENT, naming the file and
  // key, for a missing required key, tokenizer.ggml.model != "llama", a
  // wrongly typed value, a per-token array whose length differs from
  // `tokens`, or a token id outside the vocabulary. `file` may be closed
  // afterwards (the vocabulary is copied).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const gguf::GgufFile& file);

  // Text -> ids (no special-token parsing). add_bos: prepend BOS. Empty
  // text gives no ids (only BOS when add_bos), as llama.cpp.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;
  // The bytes of one token: U+2581 -> ' ', <0xXX> -> that byte, control
  // tokens (BOS/EOS/UNK) -> "". May be an incomplete UTF-8 sequence.
  std::string TokenBytes(int32_t id) const;

  int32_t vocab_size() const;  // length of tokenizer.ggml.tokens
  int32_t bos_id() const;
  int32_t eos_id() const;
  // tokenizer.ggml.add_bos_token; absent -> true (llama.cpp's SPM default).
  bool add_bos() const;

 private:
  // tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
  enum class TokenType : int32_t {
    kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3,
    kUserDefined = 4, kUnused = 5, kByte = 6,
  };

  Tokenizer() = default;
  // SPM merge of one already-escaped fragment; appends ids to `out`.
  void EncodeFragment(std::string_view text, std::vector<int32_t>* out) const;
  // Id of the byte-fallback token for `byte` (<0xXX>, else the 1-char piece,
  // else UNK).
  int32_t ByteToken(uint8_t byte) const;
  // Id of `piece`, or -1 when it is not in the vocabulary.
  int32_t Lookup(const std::string& piece) const;

  // Const after construction.
  std::vector<std::string> pieces_;     // id -> vocab text (U+2581 escaped)
  std::vector<float> scores_;           // id -> merge score
  std::vector<TokenType> types_;        // id -> token type
  std::vector<std::string> bytes_;      // id -> TokenBytes(id)
  std::unordered_map<std::string, int32_t> piece_to_id_;
  int32_t byte_tokens_[256];            // byte -> id, -1 when absent
  int32_t bos_id_ = 1;
  int32_t eos_id_ = 2;
  int32_t unk_id_ = 0;
  bool add_bos_ = true;
  bool add_space_prefix_ = true;
};

// Incremental detokenizer: appends token bytes and releases only complete
// UTF-8 characters; an incomplete tail is held until the next token (or
// Flush()). What it returns is always valid UTF-8 (RFC 3629): a byte that
// cannot start or continue a well-formed sequence (a stray continuation
// byte, an overlong form, a surrogate, a tail cut off at Flush) becomes
// U+FFFD, so the text fits a protobuf `string` field. Generated text is not
// stripped: a first piece " Once" stays " Once" (as llama.cpp's server
// returns it).
// `bytes` with every ill-formed UTF-8 subsequence replaced by U+FFFD, one
// per offending byte (RFC 3629 well-formed sequences, Table 3-7 of the
// Unicode Standard).
std::string SanitizeUtf8(absl::string_view bytes);

class IncrementalDecoder {
 public:
  // `tokenizer` must outlive the decoder.
  explicit IncrementalDecoder(const Tokenizer& tokenizer);
  // Appends the bytes of `token_id`; returns the newly completed text.
  std::string Push(int32_t token_id);
  // Returns whatever is held back (an incomplete tail becomes U+FFFD) and
  // resets.
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // bytes not yet returned: an incomplete UTF-8 tail
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_TOKENIZER_H_
