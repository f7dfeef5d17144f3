// Vocabulary loading: llama.cpp's llama_vocab::impl::load (src/llama-vocab.cpp
// at c392e50), reimplemented; see vocab.h.
#include "engine/tokenizer/vocab.h"

#include <algorithm>
#include <array>
#include <limits>
#include <set>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::tokenizer::internal {
namespace {

// Token texts llama.cpp recognises when no key names the token. When several
// tokens of one list exist, the lowest id is taken (llama.cpp takes the
// first its unordered_map yields; real vocabularies have one).
constexpr std::array<std::string_view, 8> kEotTexts = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "_<EOT>",
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",  // DeepSeek
};
constexpr std::array<std::string_view, 1> kEomTexts = {"<|eom_id|>"};
constexpr std::array<std::string_view, 4> kFimPreTexts = {"<|fim_prefix|>", "<fim-prefix>",
                                                          "<\xEF\xBD\x9C"
                                                          "fim\xE2\x96\x81"
                                                          "begin\xEF\xBD\x9C>",
                                                          "<PRE>"};
constexpr std::array<std::string_view, 4> kFimSufTexts = {"<|fim_suffix|>", "<fim-suffix>",
                                                          "<\xEF\xBD\x9C"
                                                          "fim\xE2\x96\x81hole\xEF\xBD\x9C>",
                                                          "<SUF>"};
constexpr std::array<std::string_view, 4> kFimMidTexts = {"<|fim_middle|>", "<fim-middle>",
                                                          "<\xEF\xBD\x9C"
                                                          "fim\xE2\x96\x81"
                                                          "end\xEF\xBD\x9C>",
                                                          "<MID>"};
constexpr std::array<std::string_view, 3> kFimPadTexts = {"<|fim_pad|>", "<fim-pad>", "<PAD>"};
constexpr std::array<std::string_view, 4> kFimRepTexts = {"<|fim_repo|>", "<|repo_name|>",
                                                          "<fim-repo>", "<REPO>"};
constexpr std::array<std::string_view, 1> kFimSepTexts = {"<|file_sep|>"};
// Every token with one of these texts ends generation.
constexpr std::array<std::string_view, 8> kEogTexts = {
    "<|eot_id|>",    "<|im_end|>", "<|end|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>",   "_<EOT>"};

// Reads an optional token id: `fallback` when absent, INVALID_ARGUMENT when
// it is not an integer or not an id of the vocabulary. UINT32_MAX (what
// converters write for "none") yields -1 when `none_ok`.
[[nodiscard]] absl::StatusOr<int32_t> OptionalId(const gguf::GgufFile& file, std::string_view key,
                                                 int32_t fallback, size_t n_vocab, bool none_ok) {
  absl::StatusOr<uint64_t> v = file.GetUint(key);
  if (absl::IsNotFound(v.status())) return fallback;
  if (!v.ok()) return KeyError(file, key, v.status().message());
  if (none_ok && *v == std::numeric_limits<uint32_t>::max()) return -1;
  if (*v >= n_vocab) {
    return KeyError(
        file, key, absl::StrCat("token id ", *v, " is out of range for a vocabulary of ", n_vocab));
  }
  return static_cast<int32_t>(*v);
}

[[nodiscard]] absl::StatusOr<bool> OptionalBool(const gguf::GgufFile& file, std::string_view key,
                                                bool fallback) {
  absl::StatusOr<bool> v = file.GetBool(key);
  if (absl::IsNotFound(v.status())) return fallback;
  if (!v.ok()) return KeyError(file, key, v.status().message());
  return *v;
}

// Optional per-token array of `n` elements of T; nullptr when absent.
template <typename T>
[[nodiscard]] absl::StatusOr<const std::vector<T>*> OptionalArray(const gguf::GgufFile& file,
                                                                  std::string_view key, size_t n) {
  const gguf::MetadataValue* v = file.Find(key);
  if (v == nullptr) return nullptr;
  const auto* arr = std::get_if<std::vector<T>>(v);
  if (arr == nullptr) return KeyError(file, key, "has the wrong array type");
  if (arr->size() != n) {
    return KeyError(file, key,
                    absl::StrCat("has ", arr->size(), " entries but there are ", n, " tokens"));
  }
  return arr;
}

[[nodiscard]] absl::Status ReadTokens(const gguf::GgufFile& file, Vocab* v) {
  const gguf::MetadataValue* tokens_value = file.Find("tokenizer.ggml.tokens");
  const auto* tokens =
      tokens_value == nullptr ? nullptr : std::get_if<std::vector<std::string>>(tokens_value);
  if (tokens == nullptr || tokens->empty() ||
      tokens->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": tokenizer.ggml.tokens is missing, empty or not a string array"));
  }
  const size_t n = tokens->size();
  v->text = *tokens;
  for (size_t i = 0; i < n; ++i) {
    if (v->text[i].empty()) v->text[i] = absl::StrCat("[EMPTY_", i, "]");
  }

  absl::StatusOr<const std::vector<float>*> scores =
      OptionalArray<float>(file, "tokenizer.ggml.scores", n);
  if (!scores.ok()) return scores.status();
  v->scores = *scores != nullptr ? **scores : std::vector<float>(n, 0.0f);

  absl::StatusOr<const std::vector<int32_t>*> types =
      OptionalArray<int32_t>(file, "tokenizer.ggml.token_type", n);
  if (!types.ok()) return types.status();
  v->types.assign(n, TokenType::kNormal);
  if (*types != nullptr) {
    for (size_t i = 0; i < n; ++i) {
      const int32_t ty = (**types)[i];
      if (ty < 0 || ty > static_cast<int32_t>(TokenType::kByte)) {
        return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tokenizer.ggml.token_type[",
                                                       i, "] = ", ty, " is not a token type"));
      }
      v->types[i] = static_cast<TokenType>(ty);
    }
  }

  v->ids.reserve(n);
  for (size_t i = 0; i < n; ++i) v->ids[v->text[i]] = static_cast<int32_t>(i);
  return absl::OkStatus();
}

// Special ids that only feed the end-of-generation set.
struct EogSources {
  int32_t eot = -1;
  int32_t eom = -1;
  int32_t fim_pre = -1;
  int32_t fim_suf = -1;
  int32_t fim_mid = -1;
  int32_t fim_pad = -1;
  int32_t fim_rep = -1;
  int32_t fim_sep = -1;
};

[[nodiscard]] absl::Status ReadIds(const gguf::GgufFile& file, const VocabDefaults& d, Vocab* v,
                                   EogSources* e) {
  const size_t n = v->text.size();
  auto in_range = [&](int32_t id) { return id >= 0 && static_cast<size_t>(id) < n ? id : -1; };
  struct Key {
    std::string_view name;
    int32_t* id;
    bool none_ok;
  };
  v->bos = in_range(d.bos);
  v->eos = in_range(d.eos);
  v->unk = in_range(d.unk);
  // In llama.cpp's order: the deprecated prefix/suffix/middle keys come last
  // and win.
  const Key keys[] = {
      {"tokenizer.ggml.bos_token_id", &v->bos, false},
      {"tokenizer.ggml.eos_token_id", &v->eos, false},
      {"tokenizer.ggml.eot_token_id", &e->eot, true},
      {"tokenizer.ggml.eom_token_id", &e->eom, true},
      {"tokenizer.ggml.unknown_token_id", &v->unk, true},
      {"tokenizer.ggml.fim_pre_token_id", &e->fim_pre, true},
      {"tokenizer.ggml.fim_suf_token_id", &e->fim_suf, true},
      {"tokenizer.ggml.fim_mid_token_id", &e->fim_mid, true},
      {"tokenizer.ggml.fim_pad_token_id", &e->fim_pad, true},
      {"tokenizer.ggml.fim_rep_token_id", &e->fim_rep, true},
      {"tokenizer.ggml.fim_sep_token_id", &e->fim_sep, true},
      {"tokenizer.ggml.prefix_token_id", &e->fim_pre, true},
      {"tokenizer.ggml.suffix_token_id", &e->fim_suf, true},
      {"tokenizer.ggml.middle_token_id", &e->fim_mid, true},
  };
  for (const Key& k : keys) {
    absl::StatusOr<int32_t> id = OptionalId(file, k.name, *k.id, n, k.none_ok);
    if (!id.ok()) return id.status();
    *k.id = *id;
  }
  absl::StatusOr<bool> add_bos = OptionalBool(file, "tokenizer.ggml.add_bos_token", d.add_bos);
  if (!add_bos.ok()) return add_bos.status();
  absl::StatusOr<bool> add_space =
      OptionalBool(file, "tokenizer.ggml.add_space_prefix", d.add_space_prefix);
  if (!add_space.ok()) return add_space.status();
  v->add_bos = *add_bos;
  v->add_space_prefix = *add_space;
  return absl::OkStatus();
}

// llama.cpp's "auto-detect special tokens by text" and end-of-generation
// list: fills unset EOT/EOM/FIM ids from token texts, marks each found token
// CONTROL, and builds eog_ids. Texts are looked up in the text -> id map,
// so only the id a text resolves to takes part (llama.cpp iterates that
// map).
void DetectSpecialTokens(Vocab* v, EogSources* e) {
  // The lowest id among the tokens with one of `texts`, -1 when none.
  auto find_first = [v](const auto& texts) {
    int32_t best = -1;
    for (std::string_view text : texts) {
      const int32_t id = v->Find(text);
      if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    return best;
  };
  auto detect = [&](int32_t* id, const auto& texts) {
    if (*id != -1) return;
    *id = find_first(texts);
    if (*id >= 0) v->types[*id] = TokenType::kControl;
  };
  detect(&e->eot, kEotTexts);
  detect(&e->eom, kEomTexts);
  detect(&e->fim_pre, kFimPreTexts);
  detect(&e->fim_suf, kFimSufTexts);
  detect(&e->fim_mid, kFimMidTexts);
  detect(&e->fim_pad, kFimPadTexts);
  detect(&e->fim_rep, kFimRepTexts);
  detect(&e->fim_sep, kFimSepTexts);

  std::set<int32_t> eog;
  for (int32_t id : {e->fim_pad, e->fim_rep, e->fim_sep}) {
    if (id >= 0) eog.insert(id);
  }
  for (std::string_view text : kEogTexts) {
    if (const int32_t id = v->Find(text); id >= 0) {
      eog.insert(id);
      v->types[id] = TokenType::kControl;
    }
  }
  for (int32_t id : {v->eos, e->eot, e->eom}) {
    if (id >= 0) eog.insert(id);
  }
  v->eog_ids.assign(eog.begin(), eog.end());
}

}  // namespace

absl::Status KeyError(const gguf::GgufFile& file, std::string_view key, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(file.path(), ": tokenizer key '", AbslView(key), "': ", message));
}

absl::StatusOr<Vocab> LoadVocab(const gguf::GgufFile& file, const VocabDefaults& defaults) {
  Vocab v;
  if (absl::Status s = ReadTokens(file, &v); !s.ok()) return s;
  EogSources e;
  if (absl::Status s = ReadIds(file, defaults, &v, &e); !s.ok()) return s;
  DetectSpecialTokens(&v, &e);
  return v;
}

}  // namespace tandem::tokenizer::internal
