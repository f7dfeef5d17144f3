// Text <-> token ids for a GGUF model's vocabulary, as llama.cpp (commit
// c392e50, src/llama-vocab.cpp) tokenizes:
//
//   tokenizer.ggml.model = "llama": SentencePiece-style (SPM,
//     llm_tokenizer_spm): spaces escaped to U+2581, one space prefixed to
//     the text and after each special token (add_space_prefix), merges by
//     highest vocab score, byte fallback <0xXX>.
//   tokenizer.ggml.model = "gpt2": byte-level BPE (llm_tokenizer_bpe): a
//     regex pre-tokenizer chosen by tokenizer.ggml.pre, bytes mapped to
//     GPT-2's printable stand-ins, merges by rank in tokenizer.ggml.merges.
//
// Before either, the text is partitioned on added tokens written in it
// (llama.cpp's tokenizer_st_partition): every CONTROL, USER_DEFINED and
// UNKNOWN token, longest text first (equal lengths: lower id first), is cut
// out of the remaining raw text wherever it occurs, leftmost first;
// USER_DEFINED tokens always, CONTROL and UNKNOWN only with parse_special.
// The LSTRIP/RSTRIP attributes llama.cpp sets for a few model names
// (phi-3, jina-v2) are not applied.
//
// No Unicode normalization is applied, as in llama.cpp. Hugging Face
// tokenizers (and so vLLM) apply the NFC normalizer that Qwen's
// tokenizer.json declares, so text that is not already NFC (e.g. a letter
// followed by a combining accent) can tokenize differently there.
//
// Owns: the vocabulary, merge ranks, compiled pre-tokenizer regexes.
// Does not touch: model weights.
// Threads: immutable after FromGguf; every method is thread-safe.
#ifndef TANDEM_ENGINE_TOKENIZER_TOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/types.h"

namespace tandem::tokenizer {

namespace internal {
struct Vocab;
class SpmEncoder;
class BpeEncoder;
}  // namespace internal

struct EncodeOptions {
  // Prepend BOS (the BOS half of llama.cpp's add_special); nothing when the
  // vocabulary has no BOS id.
  bool add_bos = false;
  // Match CONTROL (and UNKNOWN) tokens written in the text, as llama.cpp's
  // parse_special. USER_DEFINED tokens are matched either way.
  bool parse_special = false;
};

class Tokenizer {
 public:
  // Builds the tokenizer from tokenizer.ggml.* metadata (llama_vocab::impl::
  // load). Required: model ("llama" or "gpt2"), tokens, and for gpt2 merges.
  // Optional, with llama.cpp's defaults: scores (0), token_type (normal),
  // bos/eos/unknown_token_id (SPM 1/2/0; BPE 11/11/none), eot/eom/fim ids
  // (found by token text when absent), add_bos_token (SPM true; BPE false,
  // true for the llama3 pre-tokenizer family), add_space_prefix (SPM true),
  // pre (BPE only; absent means "default"; SPM ignores it).
  // Errors: INVALID_ARGUMENT naming the file and key for a missing required
  // key, an unsupported model or pre-tokenizer (listing the supported
  // values), a wrongly typed value, a per-token array whose length differs
  // from `tokens`, or a token id outside the vocabulary. `file` may be closed
  // afterwards (everything is copied).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(
      const gguf::GgufFile& file);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text -> ids (llama_vocab::impl::tokenize; add_eos_token is not applied).
  // Empty text gives no ids (only BOS with add_bos). Any bytes are accepted:
  // byte-level BPE keeps invalid UTF-8 bytes as their byte tokens, SPM as
  // byte-fallback tokens (llama.cpp's BPE throws on invalid UTF-8).
  std::vector<int32_t> Encode(std::string_view text, const EncodeOptions& options) const;
  // Encode(text, {add_bos, /*parse_special=*/false}).
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;

  // The bytes one token renders as (llama.cpp's token_to_piece with
  // special = false): NORMAL -> SPM text with U+2581 as ' ', or for BPE each
  // stand-in character mapped back to its byte; USER_DEFINED -> its text as
  // stored; BYTE (SPM) -> that byte; CONTROL, UNKNOWN, UNUSED, UNDEFINED and
  // ids outside the vocabulary -> "". May be an incomplete UTF-8 sequence.
  std::string TokenBytes(int32_t id) const;

  VocabType vocab_type() const { return vocab_type_; }
  // The tokenizer.ggml.pre value in use: for BPE as written in the file
  // ("default" when absent); for SPM always "default" (llama.cpp ignores it).
  const std::string& pre_tokenizer() const { return pre_tokenizer_; }
  int32_t vocab_size() const;  // length of tokenizer.ggml.tokens
  int32_t bos_id() const;      // -1 when none
  int32_t eos_id() const;      // -1 when none
  // Whether callers should prepend BOS: tokenizer.ggml.add_bos_token, else
  // llama.cpp's default for the vocab type and pre-tokenizer.
  bool add_bos() const;
  // End-of-generation ids, ascending (llama.cpp's special_eog_ids): the
  // FIM pad/repo/file-separator tokens, every token whose text is one of
  // <|eot_id|> <|im_end|> <|end|> <end_of_turn> <|endoftext|> <|eom_id|>
  // <EOT> _<EOT>, and the eos, eot and eom ids.
  const std::vector<int32_t>& eog_ids() const;
  bool IsEog(int32_t id) const;  // whether `id` is in eog_ids()

  // Type of `id` after llama.cpp's load-time overrides (tokens found as
  // EOT/EOM/FIM/end-of-generation by their text become kControl);
  // kUndefined for ids outside the vocabulary.
  TokenType token_type(int32_t id) const;
  bool IsControl(int32_t id) const { return token_type(id) == TokenType::kControl; }

 private:
  // One piece of the partitioned text: a token id, or raw text when id < 0.
  struct Fragment {
    int32_t id;
    std::string_view text;
  };

  Tokenizer();
  // llama.cpp's tokenizer_st_partition over `text`.
  std::vector<Fragment> Partition(std::string_view text, bool parse_special) const;

  // Const after construction.
  VocabType vocab_type_ = VocabType::kSpm;
  std::string pre_tokenizer_;
  std::unique_ptr<internal::Vocab> vocab_;
  std::unique_ptr<internal::SpmEncoder> spm_;  // kSpm only
  std::unique_ptr<internal::BpeEncoder> bpe_;  // kBpe only
  std::vector<int32_t> special_tokens_;        // partition order: longest text first
  std::vector<std::string> bytes_;             // id -> TokenBytes(id)
};

// `bytes` with every ill-formed UTF-8 subsequence replaced by U+FFFD, one
// per offending byte (RFC 3629 well-formed sequences, Table 3-7 of the
// Unicode Standard).
std::string SanitizeUtf8(absl::string_view bytes);

// Incremental detokenizer: appends token bytes and releases only complete
// UTF-8 characters; an incomplete tail is held until the next token (or
// Flush()). What it returns is always valid UTF-8 (RFC 3629): a byte that
// cannot start or continue a well-formed sequence (a stray continuation
// byte, an overlong form, a surrogate, a tail cut off at Flush) becomes
// U+FFFD, so the text fits a protobuf `string` field. Generated text is not
// stripped: a first piece " Once" stays " Once" (as llama.cpp's server
// returns it).
class IncrementalDecoder {
 public:
  // `tokenizer` must outlive the decoder.
  explicit IncrementalDecoder(const Tokenizer& tokenizer);
  // A decoder of raw bytes: PushBytes only (Push needs a tokenizer), e.g.
  // to find where each token's text starts in the decoded text.
  IncrementalDecoder() = default;
  // Appends the bytes of `token_id`; returns the newly completed text.
  std::string Push(int32_t token_id);
  // Appends `bytes` (one token's); returns the newly completed text: valid
  // UTF-8 with one U+FFFD per invalid byte, an incomplete last character
  // held back until its bytes arrive.
  std::string PushBytes(absl::string_view bytes);
  // Returns whatever is held back (an incomplete tail becomes U+FFFD) and
  // resets.
  std::string Flush();

 private:
  const Tokenizer* tokenizer_ = nullptr;
  std::string pending_;  // bytes not yet returned: an incomplete UTF-8 tail
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_TOKENIZER_H_
