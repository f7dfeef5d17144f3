// Byte-level BPE: the algorithm of llama.cpp's llm_tokenizer_bpe_session
// (src/llama-vocab.cpp at c392e50), reimplemented; see bpe.h.
#include "engine/tokenizer/bpe.h"

#include <algorithm>
#include <queue>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "engine/tokenizer/unicode.h"

namespace tandem::tokenizer::internal {
namespace {

constexpr char kMergesKey[] = "tokenizer.ggml.merges";

// One symbol of a piece: a byte range of the encoded piece, linked to its
// live neighbours. n == 0 marks a symbol merged into its left neighbour.
struct Symbol {
  size_t start;
  size_t n;
  int prev;
  int next;
};

struct Bigram {
  int32_t rank;
  int left;
  int right;
  size_t size;  // bytes of the merged text, to detect stale entries
};

// std::priority_queue puts the greatest first: lowest rank, then leftmost.
struct BigramAfter {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

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

int32_t BpeEncoder::Rank(std::string_view left, std::string_view right,
                         std::string* key) const {
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

  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t offs = 0; offs < word.size();) {
    const size_t len = std::min(Utf8Len(static_cast<uint8_t>(word[offs])), word.size() - offs);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({offs, len, index - 1, offs + len == word.size() ? -1 : index + 1});
    offs += len;
  }

  std::string key;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramAfter> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    const int32_t rank =
        Rank(word.substr(l.start, l.n), word.substr(r.start, r.n), &key);
    if (rank < 0) return;
    queue.push({rank, left, right, l.n + r.n});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    // Symbols only grow by absorbing their right neighbour, so a pair whose
    // sizes no longer add up (llama.cpp compares the texts) is stale.
    if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    try_add(left.prev, b.left);
    try_add(b.left, left.next);
  }

  for (int i = 0; i != -1; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const std::string_view text = word.substr(s.start, s.n);
    if (const int32_t id = vocab_->Find(text); id >= 0) {
      out->push_back(id);
      continue;
    }
    for (size_t j = 0; j < text.size(); ++j) {
      if (const int32_t id = vocab_->Find(text.substr(j, 1)); id >= 0) out->push_back(id);
    }
  }
}

}  // namespace tandem::tokenizer::internal
