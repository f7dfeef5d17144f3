#include "engine/kv/block_pool.h"

#include <cassert>
#include <cstdlib>

namespace tandem::kv {

BlockPool::BlockPool(int32_t num_blocks)
    : num_blocks_(num_blocks), in_use_(static_cast<size_t>(num_blocks), false) {
  assert(num_blocks >= 0);
  for (int32_t b = 0; b < num_blocks; ++b) free_.push_back(b);
}

std::optional<std::vector<int32_t>> BlockPool::Allocate(int32_t n) {
  if (n < 0 || n > num_free()) return std::nullopt;
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = free_.front();
    free_.pop_front();
    in_use_[static_cast<size_t>(b)] = true;
    out.push_back(b);
  }
  return out;
}

void BlockPool::Free(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    // Freeing a free or foreign block is a caller bug (double free), never
    // a consequence of outside input: stop here rather than corrupt the list.
    if (b < 0 || b >= num_blocks_ || !in_use_[static_cast<size_t>(b)]) std::abort();
    in_use_[static_cast<size_t>(b)] = false;
    free_.push_back(b);
  }
}

}  // namespace tandem::kv
