// The vocabulary read from GGUF metadata: token texts, scores and types,
// the text -> id map, special token ids and the end-of-generation set, as
// llama.cpp's llama_vocab::impl::load builds them. Internal to
// engine/tokenizer/ (Tokenizer is the public face).
//
// Owns: copies of the token list and the ids derived from it.
// Does not touch: the tokenization algorithms (spm.h, bpe.h).
// Threads: immutable after LoadVocab; thread-safe to read.
#ifndef TANDEM_ENGINE_TOKENIZER_VOCAB_H_
#define TANDEM_ENGINE_TOKENIZER_VOCAB_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/types.h"

namespace tandem::tokenizer::internal {

// Debian's Abseil has its own string_view type; hash lookups and StrCat
// take that one.
inline absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

struct Vocab {
  // id -> token text as stored (an empty text becomes "[EMPTY_<id>]", as
  // llama.cpp renames it).
  std::vector<std::string> text;
  std::vector<float> scores;  // id -> tokenizer.ggml.scores (0 when absent)
  // id -> type after llama.cpp's load-time overrides: a token found as EOT,
  // EOM, a FIM token or an end-of-generation marker by its text becomes
  // kControl.
  std::vector<TokenType> types;
  // text -> id; a duplicated text resolves to its last id (llama.cpp's
  // token_to_id[word] = i).
  absl::flat_hash_map<std::string, int32_t> ids;

  // Special ids, -1 for none.
  int32_t bos = -1;
  int32_t eos = -1;
  int32_t unk = -1;
  bool add_bos = false;
  bool add_space_prefix = false;  // SPM only
  std::vector<int32_t> eog_ids;   // ascending

  // Id of `text`, -1 when it is not in the vocabulary.
  int32_t Find(std::string_view text) const {
    auto it = ids.find(AbslView(text));
    return it == ids.end() ? -1 : it->second;
  }
  int32_t size() const { return static_cast<int32_t>(text.size()); }
};

// Defaults llama.cpp uses for one vocabulary type and pre-tokenizer.
struct VocabDefaults {
  int32_t bos;  // SPM 1, BPE 11
  int32_t eos;  // SPM 2, BPE 11
  int32_t unk;  // SPM 0, BPE none (-1)
  bool add_bos;
  bool add_space_prefix;
};

// Reads tokenizer.ggml.{tokens,scores,token_type,bos_token_id,
// eos_token_id,unknown_token_id,eot_token_id,eom_token_id,fim_*_token_id,
// prefix/suffix/middle_token_id,add_bos_token,add_space_prefix} and derives
// the special ids and end-of-generation set by llama.cpp's rules (ids from
// the keys, else found by token text; eog = FIM pad/repo/sep, every token
// whose text is an end marker, eos, eot, eom). Errors: INVALID_ARGUMENT,
// naming the file and key, for missing or mistyped tokens, a per-token array
// whose length differs from the token list, a token type outside 0..6, or an
// id key outside the vocabulary (llama.cpp warns and keeps its default;
// Tandem refuses the file). Source: llama.cpp llama_vocab::impl::load.
[[nodiscard]] absl::StatusOr<Vocab> LoadVocab(const gguf::GgufFile& file,
                                              const VocabDefaults& defaults);

// "path: tokenizer key 'key': message" as INVALID_ARGUMENT.
[[nodiscard]] absl::Status KeyError(const gguf::GgufFile& file, std::string_view key,
                                    absl::string_view message);

}  // namespace tandem::tokenizer::internal

#endif  // TANDEM_ENGINE_TOKENIZER_VOCAB_H_
