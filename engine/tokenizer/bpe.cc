// Byte-level BPE: the algorithm of llama.cpp's llm_tokenizer_bpe_session
// (src/llama-vocab.cpp at c392e50), reimplemented; see bpe.h.
#include "engine/tokenizer/bpe.h"

#include <algorithm>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "engine/tokenizer/pair_merge.h"
#include "engine/tokenizer/unicode.h"

namespace tandem::tokenizer::internal {
namespace {

constexpr char kMergesKey[] = "tokenizer.ggml.merges";

}  // namespace

absl::StatusOr<std::unique_ptr<BpeEncoder>> BpeEncoder::Create(
    const gguf::GgufFile& file, const Vocab* vocab, std::unique_ptr<PreTokenizer> pre_tokenizer) {
  const gguf::MetadataValue* value = file.Find(kMergesKey);
  if (value == nullptr) {
    return KeyError(file, kMergesKey, "is missing (byte-level BPE needs its merges)");
  }
  const auto* merges = std::get_if<std::vector<std::string>>(value);
  if (merges == nullptr) return KeyError(file, kMergesKey, "is not a string array");

  std::unique_ptr<BpeEncoder> e(new BpeEncoder());
  e->vocab_ = vocab;
  e->pre_tokenizer_ = std::move(pre_tokenizer);
  e->ranks_.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string& m = (*merges)[i];
    // The key is the merge string itself when llama.cpp's split (first
    // space at index >= 1) finds a space: Rank() rebuilds it as
    // left + ' ' + right, and byte-encoded symbols never contain a space.
    if (m.find(' ', 1) == std::string::npos) continue;
    e->ranks_.emplace(m, static_cast<int32_t>(i));  // first occurrence wins
  }
  return e;
}

int32_t BpeEncoder::Rank(std::string_view left, std::string_view right, std::string* key) const {
  key->assign(left);
  key->push_back(' ');
  key->append(right);
  auto it = ranks_.find(absl::string_view(*key));
  return it == ranks_.end() ? -1 : it->second;
}

void BpeEncoder::Encode(std::string_view text, std::vector<int32_t>* out) const {
  std::string word;
  for (std::string_view piece : pre_tokenizer_->Split(text)) {
    word.clear();
    AppendByteEncoded(piece, &word);
    EncodeWord(word, out);
  }
}

void BpeEncoder::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (pre_tokenizer_->ignore_merges()) {
    if (const int32_t id = vocab_->Find(word); id >= 0) {
      out->push_back(id);
      return;
    }
  }

  std::string key;
  const auto pair_key = [&](std::string_view left,
                            std::string_view right) -> std::optional<double> {
    const int32_t rank = Rank(left, right, &key);
    if (rank < 0) return std::nullopt;
    return rank;
  };
  MergeAdjacentPairs(word, pair_key, [&](std::string_view text) {
    if (const int32_t id = vocab_->Find(text); id >= 0) {
      out->push_back(id);
      return;
    }
    for (size_t j = 0; j < text.size(); ++j) {
      if (const int32_t id = vocab_->Find(text.substr(j, 1)); id >= 0) out->push_back(id);
    }
  });
}

}  // namespace tandem::tokenizer::internal
