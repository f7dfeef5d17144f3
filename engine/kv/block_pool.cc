#include "engine/kv/block_pool.h"

#include <cassert>
#include <cstdlib>
#include <cstring>

namespace tandem::kv {
namespace {

// Floats in one (block, layer) K or V slab: [block_size][kv_dim].
size_t SlabFloats(const KvShape& shape) {
  return static_cast<size_t>(shape.block_size) * static_cast<size_t>(shape.kv_dim());
}

// Offset of K(block, layer); V follows it directly (see the header's layout).
size_t KOffset(const KvShape& shape, int32_t block, int32_t layer) {
  const size_t slab = SlabFloats(shape);
  return (static_cast<size_t>(block) * static_cast<size_t>(shape.n_layers) +
          static_cast<size_t>(layer)) * 2 * slab;
}

}  // namespace

BlockPool::BlockPool(const KvShape& shape, int32_t num_blocks)
    : shape_(shape),
      num_blocks_(num_blocks),
      storage_(static_cast<size_t>(num_blocks) * static_cast<size_t>(shape.n_layers) * 2 *
                   SlabFloats(shape),
               0.0f),
      in_use_(static_cast<size_t>(num_blocks), false) {
  assert(num_blocks >= 0 && shape.block_size > 0);
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

float* BlockPool::K(int32_t block, int32_t layer) {
  assert(block >= 0 && block < num_blocks_ && layer >= 0 && layer < shape_.n_layers);
  return storage_.data() + KOffset(shape_, block, layer);
}

float* BlockPool::V(int32_t block, int32_t layer) {
  return K(block, layer) + SlabFloats(shape_);
}

const float* BlockPool::K(int32_t block, int32_t layer) const {
  assert(block >= 0 && block < num_blocks_ && layer >= 0 && layer < shape_.n_layers);
  return storage_.data() + KOffset(shape_, block, layer);
}

const float* BlockPool::V(int32_t block, int32_t layer) const {
  return K(block, layer) + SlabFloats(shape_);
}

int32_t BlocksForTokens(int32_t n_tokens, int32_t block_size) {
  return (n_tokens + block_size - 1) / block_size;
}

void ReadKvRows(const BlockPool& pool, const std::vector<int32_t>& block_table,
                int32_t layer, int32_t token_start, int32_t count, float* k_out,
                float* v_out) {
  const int32_t bs = pool.shape().block_size;
  const size_t dim = static_cast<size_t>(pool.shape().kv_dim());
  for (int32_t t = token_start; t < token_start + count; ++t) {
    const size_t idx = static_cast<size_t>(t / bs);
    assert(idx < block_table.size());
    const size_t slot = static_cast<size_t>(t % bs) * dim;
    const size_t row = static_cast<size_t>(t - token_start) * dim;
    std::memcpy(k_out + row, pool.K(block_table[idx], layer) + slot, dim * sizeof(float));
    std::memcpy(v_out + row, pool.V(block_table[idx], layer) + slot, dim * sizeof(float));
  }
}

void WriteKvRows(BlockPool& pool, const std::vector<int32_t>& block_table,
                 int32_t layer, int32_t token_start, int32_t count,
                 const float* k, const float* v) {
  const int32_t bs = pool.shape().block_size;
  const size_t dim = static_cast<size_t>(pool.shape().kv_dim());
  for (int32_t t = token_start; t < token_start + count; ++t) {
    const size_t idx = static_cast<size_t>(t / bs);
    assert(idx < block_table.size());
    const size_t slot = static_cast<size_t>(t % bs) * dim;
    const size_t row = static_cast<size_t>(t - token_start) * dim;
    std::memcpy(pool.K(block_table[idx], layer) + slot, k + row, dim * sizeof(float));
    std::memcpy(pool.V(block_table[idx], layer) + slot, v + row, dim * sizeof(float));
  }
}

}  // namespace tandem::kv
