// SPM merge: the algorithm of llama.cpp's llm_tokenizer_spm_session
// (src/llama-vocab.cpp), reimplemented; see spm.h.
#include "engine/tokenizer/spm.h"

#include <algorithm>
#include <cstdio>
#include <queue>
#include <string>

#include "engine/tokenizer/unicode.h"

namespace tandem::tokenizer::internal {
namespace {

// One symbol of the merge: a byte range of the text, linked to its live
// neighbours. n == 0 marks a symbol merged into its left neighbour.
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

SpmEncoder::SpmEncoder(const Vocab* vocab) : vocab_(vocab) {
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    int32_t id = vocab_->Find(hex);
    if (id < 0) id = vocab_->Find(std::string(1, static_cast<char>(b)));
    byte_tokens_[b] = id >= 0 ? id : vocab_->unk;
  }
}

void SpmEncoder::Encode(std::string_view text, std::vector<int32_t>* out) const {
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
    const int32_t id = vocab_->Find(text.substr(symbols[left].start, size));
    if (id < 0) return;
    queue.push({left, right, vocab_->scores[id], size});
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
    const std::string_view piece = text.substr(s.start, s.n);
    const int32_t id = vocab_->Find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (char c : piece) {
      const int32_t byte_id = byte_tokens_[static_cast<uint8_t>(c)];
      if (byte_id >= 0) out->push_back(byte_id);  // no byte token and no UNK: dropped
    }
  }
}

}  // namespace tandem::tokenizer::internal
