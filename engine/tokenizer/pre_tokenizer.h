// Byte-level BPE pre-tokenizers: the regex splits llama.cpp runs before BPE
// merging, chosen by tokenizer.ggml.pre (llm_tokenizer_bpe's regex_exprs and
// unicode.cpp's unicode_regex_split). Internal to engine/tokenizer/.
//
// A pre-tokenizer is a list of regexes. The first splits the text; each next
// one splits every piece of the previous split. Text a regex does not match
// stays a piece of its own, so the pieces always cover the text exactly.
// Each regex sees one piece at a time (lookaheads and `$` stop at the
// piece's end).
//
// The regexes run on PCRE2 (UTF + UCP, JIT). llama.cpp runs them through
// hand-written splitters (gpt-2, llama3) or std::regex over a "collapsed"
// text; the table in pre_tokenizer.cc spells each one so that PCRE2 gives
// llama.cpp's pieces: \s becomes Unicode White_Space (PCRE2's \s lacks
// U+0085), literal classes of the deepseek-llm regexes drop the whitespace
// characters llama.cpp replaces before matching, and backtracking-heavy
// alternatives are written in equivalent linear-time forms.
//
// Owns: the compiled regexes. Threads: immutable after Create; Split is
// thread-safe (match data is per call).
#ifndef TANDEM_ENGINE_TOKENIZER_PRE_TOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::tokenizer::internal {

class PreTokenizer {
 public:
  // The pre-tokenizer llama.cpp uses for `name` (a tokenizer.ggml.pre
  // value; "" means the key is absent, which llama.cpp treats as "default").
  // Names and aliases as llama.cpp's llama_vocab::impl::load accepts them:
  // default; gpt-2, phi-2; llama3, llama-v3, llama-bpe, falcon3; qwen2,
  // deepseek-r1-qwen, megrez, stablelm2; deepseek-llm. Errors: NOT_FOUND for
  // another name; INTERNAL if a regex fails to compile (a bug in the table).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(std::string_view name);
  // The accepted names, comma-separated, for error messages.
  static std::string SupportedNames();

  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // llama.cpp's per-pre-tokenizer flags: ignore_merges (a whole piece that
  // is a token is emitted before merging) and the add_bos default (true for
  // the llama3 family).
  bool ignore_merges() const { return ignore_merges_; }
  bool default_add_bos() const { return default_add_bos_; }

  // Splits `text` into pieces (views into `text`, in order, covering it).
  // Bytes that are not valid UTF-8 never match a regex and so stay inside
  // unmatched pieces (llama.cpp rejects such text with an exception).
  std::vector<std::string_view> Split(std::string_view text) const;

 private:
  struct Regex;
  PreTokenizer() = default;

  std::vector<std::unique_ptr<Regex>> regexes_;
  bool ignore_merges_ = false;
  bool default_add_bos_ = false;
};

}  // namespace tandem::tokenizer::internal

#endif  // TANDEM_ENGINE_TOKENIZER_PRE_TOKENIZER_H_
