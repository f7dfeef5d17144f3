// Byte-level BPE (tokenizer.ggml.model = gpt2), following llama.cpp's
// llm_tokenizer_bpe_session (src/llama-vocab.cpp): pre-tokenize the text
// (pre_tokenizer.h), map each piece's bytes to GPT-2's printable stand-ins
// (unicode.h), then merge each piece on its own: start from its characters,
// repeatedly merge the adjacent pair with the lowest rank in
// tokenizer.ggml.merges (ties: leftmost), and emit each final symbol's
// token. With ignore_merges (llama3 family) a piece that is itself a token
// is emitted whole first. A final symbol that is not a token falls back to
// its single bytes' tokens (dropping bytes without one), as llama.cpp does.
// No Unicode normalization (see tokenizer.h).
// Internal to engine/tokenizer/.
//
// Owns: the merge ranks and the pre-tokenizer. Does not touch: special
// tokens and BOS (Tokenizer does those).
// Threads: immutable after Create; thread-safe.
#ifndef TANDEM_ENGINE_TOKENIZER_BPE_H_
#define TANDEM_ENGINE_TOKENIZER_BPE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "engine/tokenizer/vocab.h"

namespace tandem::tokenizer::internal {

class BpeEncoder {
 public:
  // Reads tokenizer.ggml.merges: strings "first second", split at the first
  // space after the first byte; rank = index (the first of duplicate pairs
  // wins; an entry without such a space is ignored, as llama.cpp stores it
  // as the never-matching pair ("", "")). `vocab` must outlive the encoder.
  // Errors: INVALID_ARGUMENT naming the file and key when merges are
  // missing or not a string array. Source: llama_vocab::impl::load.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BpeEncoder>> Create(
      const gguf::GgufFile& file, const Vocab* vocab, std::unique_ptr<PreTokenizer> pre_tokenizer);

  // Appends the ids of one raw text fragment (no special tokens) to `out`.
  void Encode(std::string_view text, std::vector<int32_t>* out) const;

 private:
  BpeEncoder() = default;
  // Merges one byte-encoded piece.
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  // Rank of merging `left` and `right`, -1 when they do not merge. `key` is
  // scratch space.
  int32_t Rank(std::string_view left, std::string_view right, std::string* key) const;

  const Vocab* vocab_ = nullptr;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  absl::flat_hash_map<std::string, int32_t> ranks_;  // "first second" -> rank
};

}  // namespace tandem::tokenizer::internal

#endif  // TANDEM_ENGINE_TOKENIZER_BPE_H_
