// SPM tokenizer: the algorithm of llama.cpp's llm_tokenizer_spm_session
// (src/llama-vocab.cpp), reimplemented; see tokenizer.h.
#include "engine/tokenizer/tokenizer.h"

#include <cstdio>
#include <limits>
#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::tokenizer {
namespace {

constexpr char kSpaceEscape[] = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK
constexpr size_t kSpaceEscapeLen = 3;

// Length of the UTF-8 sequence starting with `lead`, by its high nibble (as
// llama.cpp's unicode_len_utf8: continuation and invalid bytes count as 1).
size_t Utf8Len(uint8_t lead) {
  static constexpr size_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

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
    if (c >= '0' && c <= '9') digit = c - '0';
    else if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    else return -1;
    value = value * 16 + digit;
  }
  return value;
}

absl::Status KeyError(const gguf::GgufFile& file, std::string_view key,
                      const absl::Status& status) {
  return absl::InvalidArgumentError(absl::StrCat(
      file.path(), ": tokenizer key '", absl::string_view(key.data(), key.size()),
      "': ", status.message()));
}

// Reads an optional token id: `fallback` when absent, INVALID_ARGUMENT when
// it is not an integer or not a valid id. `none_ok`: UINT32_MAX means "none"
// and yields -1.
absl::StatusOr<int32_t> OptionalId(const gguf::GgufFile& file, std::string_view key,
                                   int32_t fallback, size_t n_vocab, bool none_ok) {
  absl::StatusOr<uint64_t> v = file.GetUint(key);
  if (absl::IsNotFound(v.status())) return fallback;
  if (!v.ok()) return KeyError(file, key, v.status());
  if (none_ok && *v == std::numeric_limits<uint32_t>::max()) return -1;
  if (*v >= n_vocab) {
    return KeyError(file, key,
                    absl::InvalidArgumentError(absl::StrCat(
                        "token id ", *v, " is out of range for a vocabulary of ", n_vocab)));
  }
  return static_cast<int32_t>(*v);
}

absl::StatusOr<bool> OptionalBool(const gguf::GgufFile& file, std::string_view key,
                                  bool fallback) {
  absl::StatusOr<bool> v = file.GetBool(key);
  if (absl::IsNotFound(v.status())) return fallback;
  if (!v.ok()) return KeyError(file, key, v.status());
  return *v;
}

// Optional per-token array of `n` elements of T; empty when absent.
template <typename T>
absl::StatusOr<const std::vector<T>*> OptionalArray(const gguf::GgufFile& file,
                                                    std::string_view key, size_t n) {
  const gguf::MetadataValue* v = file.Find(key);
  if (v == nullptr) return nullptr;
  const auto* arr = std::get_if<std::vector<T>>(v);
  if (arr == nullptr) {
    return KeyError(file, key, absl::InvalidArgumentError("has the wrong array type"));
  }
  if (arr->size() != n) {
    return KeyError(file, key, absl::InvalidArgumentError(absl::StrCat(
                                   "has ", arr->size(), " entries but there are ", n,
                                   " tokens")));
  }
  return arr;
}

// One symbol of the SPM merge: a byte range of the text, linked to its
// live neighbours. n == 0 marks a symbol merged into its left neighbour.
struct Symbol {
  size_t start;
  size_t n;
  int prev;
  int next;
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;  // bytes of the merged text, to detect stale entries
};

// Highest score first; equal scores: leftmost first.
struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const gguf::GgufFile& file) {
  absl::StatusOr<std::string> model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return KeyError(file, "tokenizer.ggml.model", model.status());
  if (*model != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": tokenizer.ggml.model is '", *model,
        "'; only 'llama' (SentencePiece) is supported"));
  }
  const gguf::MetadataValue* tokens_value = file.Find("tokenizer.ggml.tokens");
  const auto* tokens = tokens_value == nullptr
                           ? nullptr
                           : std::get_if<std::vector<std::string>>(tokens_value);
  if (tokens == nullptr || tokens->empty() ||
      tokens->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": tokenizer.ggml.tokens is missing, empty or not a string array"));
  }
  const size_t n = tokens->size();

  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->pieces_ = *tokens;

  // Scores and types are optional in llama.cpp (defaults 0 and NORMAL).
  absl::StatusOr<const std::vector<float>*> scores =
      OptionalArray<float>(file, "tokenizer.ggml.scores", n);
  if (!scores.ok()) return scores.status();
  t->scores_ = *scores != nullptr ? **scores : std::vector<float>(n, 0.0f);
  absl::StatusOr<const std::vector<int32_t>*> types =
      OptionalArray<int32_t>(file, "tokenizer.ggml.token_type", n);
  if (!types.ok()) return types.status();
  t->types_.assign(n, TokenType::kNormal);
  if (*types != nullptr) {
    for (size_t i = 0; i < n; ++i) {
      const int32_t ty = (**types)[i];
      if (ty < 0 || ty > static_cast<int32_t>(TokenType::kByte)) {
        return absl::InvalidArgumentError(absl::StrCat(
            file.path(), ": tokenizer.ggml.token_type[", i, "] = ", ty, " is not a token type"));
      }
      t->types_[i] = static_cast<TokenType>(ty);
    }
  }

  // SPM defaults from llama.cpp: BOS 1, EOS 2, UNK 0.
  absl::StatusOr<int32_t> bos = OptionalId(file, "tokenizer.ggml.bos_token_id", 1, n, false);
  if (!bos.ok()) return bos.status();
  absl::StatusOr<int32_t> eos = OptionalId(file, "tokenizer.ggml.eos_token_id", 2, n, false);
  if (!eos.ok()) return eos.status();
  absl::StatusOr<int32_t> unk = OptionalId(file, "tokenizer.ggml.unknown_token_id", 0, n, true);
  if (!unk.ok()) return unk.status();
  t->bos_id_ = *bos;
  t->eos_id_ = *eos;
  t->unk_id_ = *unk;
  absl::StatusOr<bool> add_bos = OptionalBool(file, "tokenizer.ggml.add_bos_token", true);
  if (!add_bos.ok()) return add_bos.status();
  absl::StatusOr<bool> add_space =
      OptionalBool(file, "tokenizer.ggml.add_space_prefix", true);
  if (!add_space.ok()) return add_space.status();
  t->add_bos_ = *add_bos;
  t->add_space_prefix_ = *add_space;

  // As llama.cpp's token_to_id map: a duplicated piece resolves to its last id.
  t->piece_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) t->piece_to_id_[t->pieces_[i]] = static_cast<int32_t>(i);

  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    int32_t id = t->Lookup(hex);
    if (id < 0) id = t->Lookup(std::string(1, static_cast<char>(b)));
    t->byte_tokens_[b] = id >= 0 ? id : t->unk_id_;
  }

  t->bytes_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& piece = t->pieces_[i];
    switch (t->types_[i]) {
      case TokenType::kUndefined:
      case TokenType::kNormal:
        t->bytes_[i] = UnescapeSpaces(piece);
        break;
      case TokenType::kUserDefined:
        t->bytes_[i] = piece;
        break;
      case TokenType::kByte: {
        const int byte = ParseByteToken(piece);
        if (byte >= 0) t->bytes_[i] = std::string(1, static_cast<char>(byte));
        break;
      }
      case TokenType::kUnknown:
      case TokenType::kControl:
      case TokenType::kUnused:
        break;  // rendered as nothing
    }
  }
  return t;
}

int32_t Tokenizer::Lookup(const std::string& piece) const {
  auto it = piece_to_id_.find(piece);
  return it == piece_to_id_.end() ? -1 : it->second;
}

int32_t Tokenizer::ByteToken(uint8_t byte) const { return byte_tokens_[byte]; }

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> out;
  if (add_bos) out.push_back(bos_id_);
  // As sentencepiece: encoding "" yields no pieces, not a lone space.
  if (text.empty()) return out;
  std::string prefixed;
  if (add_space_prefix_) prefixed = " ";
  prefixed.append(text.data(), text.size());
  EncodeFragment(EscapeSpaces(prefixed), &out);
  return out;
}

void Tokenizer::EncodeFragment(std::string_view text, std::vector<int32_t>* out) const {
  // Split into UTF-8 characters (a truncated last sequence is clipped).
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t offs = 0; offs < text.size();) {
    const size_t len =
        std::min(Utf8Len(static_cast<uint8_t>(text[offs])), text.size() - offs);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({offs, len, index - 1, offs + len == text.size() ? -1 : index + 1});
    offs += len;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t size = symbols[left].n + symbols[right].n;
    const int32_t id = Lookup(std::string(text.substr(symbols[left].start, size)));
    if (id < 0) return;
    queue.push({left, right, scores_[id], size});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);

  // Merge the best-scoring adjacent pair until no pair is in the vocab.
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;  // stale
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    try_add(left.prev, b.left);
    try_add(b.left, left.next);
  }

  // Every merged symbol is a vocab piece by construction; a lone character
  // that is not falls back to its bytes.
  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const std::string piece(text.substr(s.start, s.n));
    const int32_t id = Lookup(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (char c : piece) out->push_back(ByteToken(static_cast<uint8_t>(c)));
  }
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= bytes_.size()) return "";
  return bytes_[id];
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
int32_t Tokenizer::bos_id() const { return bos_id_; }
int32_t Tokenizer::eos_id() const { return eos_id_; }
bool Tokenizer::add_bos() const { return add_bos_; }

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

std::string SanitizeUtf8(absl::string_view bytes) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(bytes.size());
  const size_t n = bytes.size();
  auto at = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  auto cont = [&](size_t i, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return i < n && at(i) >= lo && at(i) <= hi;
  };
  for (size_t i = 0; i < n;) {
    const uint8_t c = at(i);
    size_t len = 0;  // 0 = ill-formed at i
    if (c < 0x80) {
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = cont(i + 1) ? 2 : 0;
    } else if (c >= 0xE0 && c <= 0xEF) {
      const uint8_t lo = c == 0xE0 ? 0xA0 : 0x80;
      const uint8_t hi = c == 0xED ? 0x9F : 0xBF;  // no surrogates
      len = cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
    } else if (c >= 0xF0 && c <= 0xF4) {
      const uint8_t lo = c == 0xF0 ? 0x90 : 0x80;
      const uint8_t hi = c == 0xF4 ? 0x8F : 0xBF;  // <= U+10FFFF
      len = cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
    }
    if (len == 0) {
      out += kReplacement;
      ++i;
    } else {
      out.append(bytes.data() + i, len);
      i += len;
    }
  }
  return out;
}

std::string IncrementalDecoder::Push(int32_t token_id) {
  pending_ += tokenizer_->TokenBytes(token_id);
  // Find the last lead byte within the final 4 bytes; hold it back if its
  // sequence is not complete yet. Stray continuation bytes are released.
  size_t keep = 0;
  const size_t size = pending_.size();
  for (size_t back = 1; back <= 4 && back <= size; ++back) {
    const uint8_t c = static_cast<uint8_t>(pending_[size - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    if (c >= 0xC0 && Utf8Len(c) > back) keep = back;
    break;
  }
  std::string ready = SanitizeUtf8(absl::string_view(pending_).substr(0, size - keep));
  pending_.erase(0, size - keep);
  return ready;
}

std::string IncrementalDecoder::Flush() {
  std::string rest = SanitizeUtf8(pending_);
  pending_.clear();
  return rest;
}

}  // namespace tandem::tokenizer
