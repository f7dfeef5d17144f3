// Pre-tokenizer regex table and splitting; see pre_tokenizer.h. Sources:
// llama.cpp src/llama-vocab.cpp (llm_tokenizer_bpe: the regexes per
// pre-tokenizer; llama_vocab::impl::load: names, ignore_merges, add_bos) and
// src/unicode.cpp (unicode_regex_split and its custom gpt2 / llama3
// splitters), at commit c392e50.
#include "engine/tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tokenizer/unicode.h"
#include "engine/tokenizer/vocab.h"

namespace tandem::tokenizer::internal {
namespace {

// llama.cpp's \s is Unicode White_Space (its flag table comes from Python
// regex's \s): PCRE2's UCP \s ([\t\n\v\f\r] and \p{Z}) plus U+0085. For use
// inside a character class.
#define TANDEM_WS "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}"
// White_Space without \r and \n.
#define TANDEM_WS_NO_NL "\\t\\x0B\\f\\x{85}\\p{Z}"

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
// llama.cpp runs this through unicode_regex_split_custom_gpt2, whose extra
// "\s+" fallback only re-emits the single whitespace character the regex
// leaves unmatched, which splitting keeps as a piece anyway.
constexpr const char kGpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" TANDEM_WS
                               "\\p{L}\\p{N}]+"
                               "|[" TANDEM_WS "]+(?![^" TANDEM_WS "])";

// The llama3 / qwen2 regex (tokenizer.json's, with llama.cpp's (?i:...)
// rewrite). \s*[\r\n]+ is written (?:[\s except \r\n]*[\r\n])+, which ends
// at the same place (the last \r or \n of the whitespace run) without
// quadratic backtracking on long runs.
#define TANDEM_LLAMA3_LIKE(NUMBERS)                           \
  "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])" \
  "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" NUMBERS "| ?[^" TANDEM_WS \
  "\\p{L}\\p{N}]+[\\r\\n]*"                                   \
  "|(?:[" TANDEM_WS_NO_NL "]*[\\r\\n])+|[" TANDEM_WS "]+(?![^" TANDEM_WS "])|[" TANDEM_WS "]+"
constexpr const char kLlama3[] = TANDEM_LLAMA3_LIKE("\\p{N}{1,3}");
constexpr const char kQwen2[] = TANDEM_LLAMA3_LIKE("\\p{N}");

// deepseek-llm (DeepSeek LLM's tokenizer.json). llama.cpp matches these
// with std::wregex on text whose non-ASCII whitespace has been replaced by
// U+000B, so its literal classes never match a whitespace character: U+3000
// is cut out of the punctuation class and the whitespace code points out of
// the CJK class (U+0800-U+4E00, U+4E00-U+9FA5, U+AC00-U+D7FF). The letter
// class is DeepSeek's list of cased-letter ranges.
constexpr const char kDeepseekLetters[] =
    "[" TANDEM_WS
    "]?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}"
    "\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}"
    "\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}"
    "\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}"
    "\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}"
    "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}"
    "\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}"
    "\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"
    "\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"
    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}"
    "\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}"
    "\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}"
    "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"
    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+";
constexpr const char kDeepseekPunct[] =
    "[" TANDEM_WS
    "]?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}"
    "\\x{3001}-\\x{3002}]+";
// \s+$ (an ECMAScript $: end of the piece only). The lookbehind only skips
// start positions inside a whitespace run, which cannot begin the leftmost
// match, so a long run costs linear time.
constexpr const char kDeepseekTrailingSpace[] = "(?<![" TANDEM_WS "])[" TANDEM_WS "]++$";
constexpr const char kDeepseekCjk[] =
    "[\\x{800}-\\x{167F}\\x{1681}-\\x{1FFF}\\x{200B}-\\x{2027}\\x{202A}-\\x{202E}"
    "\\x{2030}-\\x{205E}\\x{2060}-\\x{2FFF}\\x{3001}-\\x{9FA5}\\x{AC00}-\\x{D7FF}]+";

struct Definition {
  std::initializer_list<const char*> names;
  std::initializer_list<const char*> regexes;
  bool ignore_merges;
  bool add_bos;
};

// llama.cpp's LLAMA_VOCAB_PRE_TYPE_{DEFAULT,GPT2,LLAMA3,QWEN2,STABLELM2,
// DEEPSEEK_LLM} rows; a pre-tokenizer not listed here is refused at load.
const Definition kDefinitions[] = {
    // DEFAULT: what llama.cpp runs for a gpt2 vocab with tokenizer.ggml.pre
    // absent (after warning) or "default".
    {{"default"}, {"[\\p{P}$+<=>^~|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}, false, false},
    {{"gpt-2", "phi-2"}, {kGpt2}, false, false},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {kLlama3}, true, true},
    {{"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"}, {kQwen2}, false, false},
    {{"deepseek-llm"},
     {"[\\r\\n]", kDeepseekLetters, kDeepseekPunct, kDeepseekTrailingSpace, kDeepseekCjk,
      "\\p{N}+"},
     false,
     false},
};

#undef TANDEM_LLAMA3_LIKE
#undef TANDEM_WS_NO_NL
#undef TANDEM_WS

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::string_view name) {
  if (name.empty()) name = "default";
  const Definition* def = nullptr;
  for (const Definition& d : kDefinitions) {
    for (const char* n : d.names) {
      if (name == n) def = &d;
    }
  }
  if (def == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown pre-tokenizer '", AbslView(name), "'"));
  }
  std::unique_ptr<PreTokenizer> p(new PreTokenizer());
  p->ignore_merges_ = def->ignore_merges;
  p->default_add_bos_ = def->add_bos;
  for (const char* pattern : def->regexes) {
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    auto regex = std::make_unique<Regex>();
    regex->code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY,
                      &error, &error_offset, nullptr);
    if (regex->code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InternalError(absl::StrCat(
          "pre-tokenizer '", AbslView(name), "': regex '", pattern, "' does not compile at offset ",
          error_offset, ": ", reinterpret_cast<const char*>(message)));
    }
    // Without JIT (not built in, or out of memory) PCRE2 interprets.
    pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);
    p->regexes_.push_back(std::move(regex));
  }
  return p;
}

std::string PreTokenizer::SupportedNames() {
  std::vector<std::string> names;
  for (const Definition& d : kDefinitions) {
    for (const char* n : d.names) names.push_back(n);
  }
  return absl::StrJoin(names, ", ");
}

PreTokenizer::~PreTokenizer() = default;

std::vector<std::string_view> PreTokenizer::Split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text);
  pcre2_match_data* match = pcre2_match_data_create(1, nullptr);
  std::vector<std::string_view> next;
  for (const auto& regex : regexes_) {
    next.clear();
    next.reserve(pieces.size() * 2);
    for (std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t unmatched = 0;  // start of the text not yet emitted
      size_t pos = 0;        // where the next search starts
      while (pos < piece.size()) {
        int rc = pcre2_match(regex->code, subject, piece.size(), pos, 0, match, nullptr);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
          // JIT stack or other resource limit: retry on the interpreter,
          // whose limits are far higher.
          rc = pcre2_match(regex->code, subject, piece.size(), pos, PCRE2_NO_JIT, match, nullptr);
        }
        if (rc < 0) break;  // no further match (or a hard limit): rest unmatched
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
        const size_t begin = ov[0];
        const size_t end = ov[1];
        if (begin > unmatched) next.push_back(piece.substr(unmatched, begin - unmatched));
        if (end > begin) {
          next.push_back(piece.substr(begin, end - begin));
          unmatched = end;
          pos = end;
        } else {
          // An empty match (none of the table's regexes has one): move on by
          // one character so the loop ends.
          pos = begin + std::min(Utf8Len(static_cast<uint8_t>(piece[begin])), piece.size() - begin);
          unmatched = begin;
        }
      }
      if (unmatched < piece.size()) next.push_back(piece.substr(unmatched));
    }
    pieces.swap(next);
  }
  pcre2_match_data_free(match);
  return pieces;
}

}  // namespace tandem::tokenizer::internal
