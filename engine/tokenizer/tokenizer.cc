// Tokenizer: loading, added-token partition, SPM/BPE dispatch and token
// rendering, following llama.cpp's llama_vocab::impl (src/llama-vocab.cpp at
// c392e50); see tokenizer.h.
#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "engine/tokenizer/spm.h"
#include "engine/tokenizer/unicode.h"
#include "engine/tokenizer/vocab.h"

namespace tandem::tokenizer {
namespace {

using internal::Vocab;

constexpr char kSpaceEscape[] = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK
constexpr size_t kSpaceEscapeLen = 3;

std::string EscapeSpaces(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 2);
  for (char c : text) {
    if (c == ' ') {
      out.append(kSpaceEscape, kSpaceEscapeLen);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string UnescapeSpaces(const std::string& piece) {
  std::string out;
  out.reserve(piece.size());
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpaceEscapeLen, kSpaceEscape) == 0) {
      out.push_back(' ');
      i += kSpaceEscapeLen;
    } else {
      out.push_back(piece[i++]);
    }
  }
  return out;
}

// Parses a byte token's text "<0xXX>"; -1 when malformed.
int ParseByteToken(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = piece[i];
    int digit;
    if (c >= '0' && c <= '9')
      digit = c - '0';
    else if (c >= 'A' && c <= 'F')
      digit = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      digit = c - 'a' + 10;
    else
      return -1;
    value = value * 16 + digit;
  }
  return value;
}

// llama.cpp's token_to_piece(special = false) for one token.
std::string RenderToken(const Vocab& v, VocabType type, int32_t id) {
  const std::string& text = v.text[id];
  switch (v.types[id]) {
    case TokenType::kNormal:
      return type == VocabType::kSpm ? UnescapeSpaces(text) : internal::DecodeByteLevel(text);
    case TokenType::kUserDefined:
      return text;
    case TokenType::kByte:
      if (type == VocabType::kSpm) {
        const int byte = ParseByteToken(text);
        if (byte >= 0) return std::string(1, static_cast<char>(byte));
      }
      return "";
    case TokenType::kUndefined:
    case TokenType::kUnknown:
    case TokenType::kControl:
    case TokenType::kUnused:
      return "";  // rendered as nothing
  }
  return "";
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const gguf::GgufFile& file) {
  constexpr char kModelKey[] = "tokenizer.ggml.model";
  constexpr char kPreKey[] = "tokenizer.ggml.pre";
  absl::StatusOr<std::string> model = file.GetString(kModelKey);
  if (!model.ok()) return internal::KeyError(file, kModelKey, model.status().message());

  std::unique_ptr<Tokenizer> t(new Tokenizer());
  internal::VocabDefaults defaults;
  std::unique_ptr<internal::PreTokenizer> pre;
  if (*model == "llama") {
    t->vocab_type_ = VocabType::kSpm;
    t->pre_tokenizer_ = "default";
    defaults = {/*bos=*/1, /*eos=*/2, /*unk=*/0, /*add_bos=*/true, /*add_space_prefix=*/true};
  } else if (*model == "gpt2") {
    t->vocab_type_ = VocabType::kBpe;
    std::string pre_name;
    if (file.Find(kPreKey) != nullptr) {
      absl::StatusOr<std::string> p = file.GetString(kPreKey);
      if (!p.ok()) return internal::KeyError(file, kPreKey, p.status().message());
      pre_name = *p;
    }
    absl::StatusOr<std::unique_ptr<internal::PreTokenizer>> p =
        internal::PreTokenizer::Create(pre_name);
    if (absl::IsNotFound(p.status())) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": tokenizer.ggml.pre is '", pre_name,
                       "', a pre-tokenizer Tandem does not support; supported: ",
                       internal::PreTokenizer::SupportedNames()));
    }
    if (!p.ok()) return p.status();
    pre = std::move(*p);
    t->pre_tokenizer_ = pre_name.empty() ? "default" : pre_name;
    defaults = {/*bos=*/11, /*eos=*/11, /*unk=*/-1, /*add_bos=*/pre->default_add_bos(),
                /*add_space_prefix=*/false};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": tokenizer.ggml.model is '", *model,
                     "'; supported: 'llama' (SentencePiece) and 'gpt2' (byte-level BPE)"));
  }

  absl::StatusOr<Vocab> vocab = internal::LoadVocab(file, defaults);
  if (!vocab.ok()) return vocab.status();
  t->vocab_ = std::make_unique<Vocab>(std::move(*vocab));
  const Vocab& v = *t->vocab_;

  if (t->vocab_type_ == VocabType::kSpm) {
    t->spm_ = std::make_unique<internal::SpmEncoder>(&v);
  } else {
    absl::StatusOr<std::unique_ptr<internal::BpeEncoder>> bpe =
        internal::BpeEncoder::Create(file, &v, std::move(pre));
    if (!bpe.ok()) return bpe.status();
    t->bpe_ = std::move(*bpe);
  }

  // llama.cpp's cache_special_tokens, sorted by text length, longest first.
  // llama.cpp's std::sort leaves equal lengths in an unspecified order; the
  // stable sort here keeps them by id.
  for (int32_t id = 0; id < v.size(); ++id) {
    const TokenType ty = v.types[id];
    if (ty == TokenType::kControl || ty == TokenType::kUserDefined || ty == TokenType::kUnknown) {
      t->special_tokens_.push_back(id);
    }
  }
  std::stable_sort(t->special_tokens_.begin(), t->special_tokens_.end(),
                   [&v](int32_t a, int32_t b) { return v.text[a].size() > v.text[b].size(); });

  t->bytes_.resize(v.text.size());
  for (int32_t id = 0; id < v.size(); ++id) t->bytes_[id] = RenderToken(v, t->vocab_type_, id);
  return t;
}

std::vector<Tokenizer::Fragment> Tokenizer::Partition(std::string_view text,
                                                      bool parse_special) const {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({-1, text});
  std::vector<Fragment> next;
  for (const int32_t id : special_tokens_) {
    const TokenType ty = vocab_->types[id];
    if (!parse_special && (ty == TokenType::kControl || ty == TokenType::kUnknown)) continue;
    const std::string_view token = vocab_->text[id];
    if (token.empty()) continue;  // cannot happen: empty texts are renamed at load
    next.clear();
    bool split = false;
    for (const Fragment& f : fragments) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t at; (at = rest.find(token)) != std::string_view::npos;) {
        if (at > 0) next.push_back({-1, rest.substr(0, at)});
        next.push_back({id, {}});
        rest.remove_prefix(at + token.size());
        split = true;
      }
      if (!rest.empty()) next.push_back({-1, rest});
    }
    if (split) fragments.swap(next);
  }
  return fragments;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  const Vocab& v = *vocab_;
  std::vector<int32_t> out;
  if (options.add_bos && v.bos >= 0) out.push_back(v.bos);
  const std::vector<Fragment> fragments = Partition(text, options.parse_special);
  switch (vocab_type_) {
    case VocabType::kSpm: {
      // A space goes before the first raw fragment and before each one that
      // follows a special token (llama.cpp's is_prev_special).
      bool prev_special = true;
      for (const Fragment& f : fragments) {
        if (f.id >= 0) {
          out.push_back(f.id);
          prev_special = true;
          continue;
        }
        std::string raw;
        if (v.add_space_prefix && prev_special) raw = " ";
        raw.append(f.text);
        spm_->Encode(EscapeSpaces(raw), &out);
        prev_special = false;
      }
      break;
    }
    case VocabType::kBpe:
      for (const Fragment& f : fragments) {
        if (f.id >= 0) {
          out.push_back(f.id);
        } else {
          bpe_->Encode(f.text, &out);
        }
      }
      break;
  }
  return out;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  return Encode(text, EncodeOptions{add_bos, /*parse_special=*/false});
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= bytes_.size()) return "";
  return bytes_[id];
}

int32_t Tokenizer::vocab_size() const { return vocab_->size(); }
int32_t Tokenizer::bos_id() const { return vocab_->bos; }
int32_t Tokenizer::eos_id() const { return vocab_->eos; }
bool Tokenizer::add_bos() const { return vocab_->add_bos; }
const std::vector<int32_t>& Tokenizer::eog_ids() const { return vocab_->eog_ids; }

bool Tokenizer::IsEog(int32_t id) const {
  return std::binary_search(vocab_->eog_ids.begin(), vocab_->eog_ids.end(), id);
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= vocab_->size()) return TokenType::kUndefined;
  return vocab_->types[id];
}

}  // namespace tandem::tokenizer
