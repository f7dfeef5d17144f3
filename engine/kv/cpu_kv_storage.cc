#include "engine/kv/cpu_kv_storage.h"

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "engine/kv/kv_convert.h"

namespace tandem::kv {
namespace {

// Bytes in one (block, layer) K or V slab: [block_size][kv_dim] elements.
size_t SlabBytes(const KvShape& shape, KvDtype dtype) {
  return static_cast<size_t>(shape.block_size) * static_cast<size_t>(shape.kv_dim()) *
         KvDtypeBytes(dtype);
}

// Calls fn(k_row_in_block, v_row_in_block, byte_offset_in_buffer, row_bytes)
// for each token of the range: the one loop behind ReadTokens and
// WriteTokens.
template <typename Storage, typename Fn>
void ForEachToken(Storage& s, std::span<const int32_t> block_table, int32_t layer,
                  int32_t token_start, int32_t count, Fn fn) {
  const int32_t bs = s.shape().block_size;
  const size_t row_bytes = s.row_bytes();
  for (int32_t t = token_start; t < token_start + count; ++t) {
    const size_t idx = static_cast<size_t>(t / bs);
    assert(idx < block_table.size());
    const size_t slot = static_cast<size_t>(t % bs) * row_bytes;
    const size_t row = static_cast<size_t>(t - token_start) * row_bytes;
    fn(s.KData(block_table[idx], layer) + slot, s.VData(block_table[idx], layer) + slot, row,
       row_bytes);
  }
}

// Scratch of at least n bytes, kept per thread (the model writes K/V of
// every layer of every step through it).
char* Scratch(size_t n) {
  thread_local std::vector<char> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

}  // namespace

CpuKvStorage::CpuKvStorage(const KvShape& shape, int32_t num_blocks, KvDtype dtype)
    : shape_(shape),
      num_blocks_(num_blocks),
      dtype_(dtype),
      storage_(BytesFor(shape, num_blocks, dtype), 0) {
  assert(num_blocks >= 0 && shape.block_size > 0 && KvDtypeBytes(dtype) != 0);
}

size_t CpuKvStorage::BytesFor(const KvShape& shape, int32_t num_blocks, KvDtype dtype) {
  return static_cast<size_t>(num_blocks) * static_cast<size_t>(shape.n_layers) * 2 *
         SlabBytes(shape, dtype);
}

char* CpuKvStorage::KData(int32_t block, int32_t layer) {
  return const_cast<char*>(std::as_const(*this).KData(block, layer));
}

char* CpuKvStorage::VData(int32_t block, int32_t layer) {
  return KData(block, layer) + SlabBytes(shape_, dtype_);
}

const char* CpuKvStorage::KData(int32_t block, int32_t layer) const {
  assert(block >= 0 && block < num_blocks_ && layer >= 0 && layer < shape_.n_layers);
  const size_t slab = SlabBytes(shape_, dtype_);
  return storage_.data() + (static_cast<size_t>(block) * static_cast<size_t>(shape_.n_layers) +
                            static_cast<size_t>(layer)) *
                               2 * slab;
}

const char* CpuKvStorage::VData(int32_t block, int32_t layer) const {
  return KData(block, layer) + SlabBytes(shape_, dtype_);
}

float* CpuKvStorage::K(int32_t block, int32_t layer) {
  if (dtype_ != KvDtype::kF32) std::abort();  // caller bug
  return reinterpret_cast<float*>(KData(block, layer));
}

float* CpuKvStorage::V(int32_t block, int32_t layer) {
  if (dtype_ != KvDtype::kF32) std::abort();
  return reinterpret_cast<float*>(VData(block, layer));
}

const float* CpuKvStorage::K(int32_t block, int32_t layer) const {
  if (dtype_ != KvDtype::kF32) std::abort();
  return reinterpret_cast<const float*>(KData(block, layer));
}

const float* CpuKvStorage::V(int32_t block, int32_t layer) const {
  if (dtype_ != KvDtype::kF32) std::abort();
  return reinterpret_cast<const float*>(VData(block, layer));
}

void CpuKvStorage::ReadTokens(std::span<const int32_t> block_table, int32_t layer,
                              int32_t token_start, int32_t count, char* k_out, char* v_out) const {
  ForEachToken(*this, block_table, layer, token_start, count,
               [&](const char* k, const char* v, size_t row, size_t bytes) {
                 std::memcpy(k_out + row, k, bytes);
                 std::memcpy(v_out + row, v, bytes);
               });
}

void CpuKvStorage::WriteTokens(std::span<const int32_t> block_table, int32_t layer,
                               int32_t token_start, int32_t count, const char* k_in,
                               const char* v_in) {
  ForEachToken(*this, block_table, layer, token_start, count,
               [&](char* k, char* v, size_t row, size_t bytes) {
                 std::memcpy(k, k_in + row, bytes);
                 std::memcpy(v, v_in + row, bytes);
               });
}

void ReadKvRows(const KvStorage& storage, std::span<const int32_t> block_table, int32_t layer,
                int32_t token_start, int32_t count, float* k_out, float* v_out) {
  const KvDtype dtype = storage.dtype();
  if (dtype == KvDtype::kF32) {
    storage.ReadTokens(block_table, layer, token_start, count, reinterpret_cast<char*>(k_out),
                       reinterpret_cast<char*>(v_out));
    return;
  }
  const size_t n = static_cast<size_t>(count) * static_cast<size_t>(storage.shape().kv_dim());
  const size_t bytes = static_cast<size_t>(count) * storage.row_bytes();
  char* k = Scratch(2 * bytes);
  storage.ReadTokens(block_table, layer, token_start, count, k, k + bytes);
  KvToFloats(dtype, k, n, k_out);
  KvToFloats(dtype, k + bytes, n, v_out);
}

void WriteKvRows(KvStorage& storage, std::span<const int32_t> block_table, int32_t layer,
                 int32_t token_start, int32_t count, const float* k, const float* v) {
  const KvDtype dtype = storage.dtype();
  if (dtype == KvDtype::kF32) {
    storage.WriteTokens(block_table, layer, token_start, count, reinterpret_cast<const char*>(k),
                        reinterpret_cast<const char*>(v));
    return;
  }
  const size_t n = static_cast<size_t>(count) * static_cast<size_t>(storage.shape().kv_dim());
  const size_t bytes = static_cast<size_t>(count) * storage.row_bytes();
  char* rows = Scratch(2 * bytes);
  FloatsToKv(dtype, k, n, rows);
  FloatsToKv(dtype, v, n, rows + bytes);
  storage.WriteTokens(block_table, layer, token_start, count, rows, rows + bytes);
}

}  // namespace tandem::kv
