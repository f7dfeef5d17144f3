#include "engine/kv/cpu_kv_storage.h"

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

// Calls fn(dst_or_src_row_in_block, row_in_buffer) for each token of the
// range: the one loop behind ReadTokens and WriteTokens.
template <typename Storage, typename Fn>
void ForEachToken(Storage& s, std::span<const int32_t> block_table, int32_t layer,
                  int32_t token_start, int32_t count, Fn fn) {
  const int32_t bs = s.shape().block_size;
  const size_t dim = static_cast<size_t>(s.shape().kv_dim());
  for (int32_t t = token_start; t < token_start + count; ++t) {
    const size_t idx = static_cast<size_t>(t / bs);
    assert(idx < block_table.size());
    const size_t slot = static_cast<size_t>(t % bs) * dim;
    const size_t row = static_cast<size_t>(t - token_start) * dim;
    fn(s.K(block_table[idx], layer) + slot, s.V(block_table[idx], layer) + slot, row, dim);
  }
}

void RequireF32(const KvStorage& storage) {
  if (storage.dtype() != KvDtype::kF32) std::abort();  // caller bug
}

}  // namespace

CpuKvStorage::CpuKvStorage(const KvShape& shape, int32_t num_blocks)
    : shape_(shape),
      num_blocks_(num_blocks),
      storage_(static_cast<size_t>(num_blocks) * static_cast<size_t>(shape.n_layers) * 2 *
                   SlabFloats(shape),
               0.0f) {
  assert(num_blocks >= 0 && shape.block_size > 0);
}

float* CpuKvStorage::K(int32_t block, int32_t layer) {
  assert(block >= 0 && block < num_blocks_ && layer >= 0 && layer < shape_.n_layers);
  return storage_.data() + KOffset(shape_, block, layer);
}

float* CpuKvStorage::V(int32_t block, int32_t layer) {
  return K(block, layer) + SlabFloats(shape_);
}

const float* CpuKvStorage::K(int32_t block, int32_t layer) const {
  assert(block >= 0 && block < num_blocks_ && layer >= 0 && layer < shape_.n_layers);
  return storage_.data() + KOffset(shape_, block, layer);
}

const float* CpuKvStorage::V(int32_t block, int32_t layer) const {
  return K(block, layer) + SlabFloats(shape_);
}

void CpuKvStorage::ReadTokens(std::span<const int32_t> block_table, int32_t layer,
                              int32_t token_start, int32_t count, char* k_out,
                              char* v_out) const {
  ForEachToken(*this, block_table, layer, token_start, count,
               [&](const float* k, const float* v, size_t row, size_t dim) {
                 std::memcpy(k_out + row * sizeof(float), k, dim * sizeof(float));
                 std::memcpy(v_out + row * sizeof(float), v, dim * sizeof(float));
               });
}

void CpuKvStorage::WriteTokens(std::span<const int32_t> block_table, int32_t layer,
                               int32_t token_start, int32_t count, const char* k_in,
                               const char* v_in) {
  ForEachToken(*this, block_table, layer, token_start, count,
               [&](float* k, float* v, size_t row, size_t dim) {
                 std::memcpy(k, k_in + row * sizeof(float), dim * sizeof(float));
                 std::memcpy(v, v_in + row * sizeof(float), dim * sizeof(float));
               });
}

void ReadKvRows(const KvStorage& storage, std::span<const int32_t> block_table,
                int32_t layer, int32_t token_start, int32_t count, float* k_out,
                float* v_out) {
  RequireF32(storage);
  storage.ReadTokens(block_table, layer, token_start, count, reinterpret_cast<char*>(k_out),
                     reinterpret_cast<char*>(v_out));
}

void WriteKvRows(KvStorage& storage, std::span<const int32_t> block_table, int32_t layer,
                 int32_t token_start, int32_t count, const float* k, const float* v) {
  RequireF32(storage);
  storage.WriteTokens(block_table, layer, token_start, count,
                      reinterpret_cast<const char*>(k), reinterpret_cast<const char*>(v));
}

}  // namespace tandem::kv
