// The greedy adjacent-pair merge both tokenizers run (llama.cpp's
// llm_symbol / llm_bigram loop, src/llama-vocab.cpp, shared by its SPM and
// BPE sessions): split a text into UTF-8 characters, then repeatedly merge
// the adjacent pair with the best priority until no pair has one. SPM's
// priority is the merged piece's vocab score (higher first), BPE's the
// merge rank (lower first); ties go to the leftmost pair.
//
// Internal to engine/tokenizer. Threads: pure function.
#ifndef TANDEM_ENGINE_TOKENIZER_PAIR_MERGE_H_
#define TANDEM_ENGINE_TOKENIZER_PAIR_MERGE_H_

#include <algorithm>
#include <cstddef>
#include <optional>
#include <queue>
#include <string_view>
#include <vector>

#include "engine/tokenizer/unicode.h"

namespace tandem::tokenizer::internal {

// Merges the characters of `text` and calls emit(piece) for each final
// piece, left to right. pair_key(left, right) -> std::optional<double>:
// the priority of merging two adjacent pieces (views into `text`, `right`
// directly after `left`), smaller first; nullopt when they do not merge.
template <typename PairKey, typename Emit>
void MergeAdjacentPairs(std::string_view text, PairKey pair_key, Emit emit) {
  // A piece: a byte range of `text`, linked to its live neighbours; n == 0
  // marks one merged into its left neighbour.
  struct Symbol {
    size_t start;
    size_t n;
    int prev;
    int next;
  };
  struct Pair {
    double key;
    int left;
    int right;
    size_t size;  // bytes of the merged text, to detect stale entries
  };
  // std::priority_queue puts the greatest first: smallest key, then leftmost.
  struct After {
    bool operator()(const Pair& a, const Pair& b) const {
      return a.key > b.key || (a.key == b.key && a.left > b.left);
    }
  };
  if (text.empty()) return;
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t offs = 0; offs < text.size();) {
    const size_t len = std::min(Utf8Len(static_cast<uint8_t>(text[offs])), text.size() - offs);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({offs, len, index - 1, offs + len == text.size() ? -1 : index + 1});
    offs += len;
  }
  std::priority_queue<Pair, std::vector<Pair>, After> queue;
  const auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    const std::optional<double> key =
        pair_key(text.substr(l.start, l.n), text.substr(r.start, r.n));
    if (key.has_value()) queue.push({*key, left, right, l.n + r.n});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(p.left)];
    Symbol& right = symbols[static_cast<size_t>(p.right)];
    // Pieces only grow by absorbing their right neighbour, so a pair whose
    // sizes no longer add up (llama.cpp compares the texts) is stale.
    if (left.n == 0 || right.n == 0 || left.n + right.n != p.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = p.left;
    try_add(left.prev, p.left);
    try_add(p.left, left.next);
  }
  for (int i = 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& s = symbols[static_cast<size_t>(i)];
    emit(text.substr(s.start, s.n));
  }
}

}  // namespace tandem::tokenizer::internal

#endif  // TANDEM_ENGINE_TOKENIZER_PAIR_MERGE_H_
