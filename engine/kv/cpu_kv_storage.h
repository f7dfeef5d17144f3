// KV cache memory in host RAM, in F32, F16 or BF16 (the CPU backend's
// KvStorage; vLLM's PagedAttention layout, Kwon et al. 2023).
//
// Owns: the K/V bytes of num_blocks blocks, allocated zeroed up front:
// BytesFor(shape, num_blocks, dtype) = num_blocks * n_layers * 2 *
// block_size * kv_dim * KvDtypeBytes(dtype), so a 16-bit cache takes half
// the memory of an F32 one and attention reads half the bytes per step.
// Does not touch: which blocks are free (BlockPool), block tables.
// Threads: not thread-safe; see kv_storage.h.
//
// Memory layout, per block b and layer l (elements of dtype()):
//   K(b, l): [block_size][n_kv_heads * head_dim]   then
//   V(b, l): [block_size][n_kv_heads * head_dim]
// An F16 element is IEEE binary16, a BF16 element the high half of a
// binary32, both little-endian uint16 (ggml's GGML_TYPE_F16 / _BF16).
#ifndef TANDEM_ENGINE_KV_CPU_KV_STORAGE_H_
#define TANDEM_ENGINE_KV_CPU_KV_STORAGE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/kv/kv_storage.h"

namespace tandem::kv {

class CpuKvStorage final : public KvStorage {
 public:
  // num_blocks blocks of `shape` in `dtype`, every element +0.
  CpuKvStorage(const KvShape& shape, int32_t num_blocks, KvDtype dtype = KvDtype::kF32);

  // Bytes a storage of num_blocks blocks of `shape` in `dtype` allocates.
  static size_t BytesFor(const KvShape& shape, int32_t num_blocks, KvDtype dtype);

  const KvShape& shape() const override { return shape_; }
  KvDtype dtype() const override { return dtype_; }
  int32_t num_blocks() const override { return num_blocks_; }
  // Raw bytes of dtype(): row_bytes() per token, no conversion.
  void ReadTokens(std::span<const int32_t> block_table, int32_t layer, int32_t token_start,
                  int32_t count, char* k_out, char* v_out) const override;
  void WriteTokens(std::span<const int32_t> block_table, int32_t layer, int32_t token_start,
                   int32_t count, const char* k, const char* v) override;

  // Block b's K or V rows for `layer`: [block_size][kv_dim] elements of
  // dtype(), row_bytes() apart.
  char* KData(int32_t block, int32_t layer);
  char* VData(int32_t block, int32_t layer);
  const char* KData(int32_t block, int32_t layer) const;
  const char* VData(int32_t block, int32_t layer) const;

  // KData / VData as floats, for an F32 storage only (a caller bug
  // otherwise: aborts).
  float* K(int32_t block, int32_t layer);
  float* V(int32_t block, int32_t layer);
  const float* K(int32_t block, int32_t layer) const;
  const float* V(int32_t block, int32_t layer) const;

 private:
  KvShape shape_;
  int32_t num_blocks_;
  KvDtype dtype_;
  std::vector<char> storage_;
};

// ReadTokens / WriteTokens with [count][kv_dim] float buffers, for a
// storage of any dtype: WriteKvRows rounds each float to the storage's
// dtype (kv_convert.h: ggml's rounding), ReadKvRows widens exactly. On an
// F32 storage both are plain copies. This is where the model's K/V enter
// the cache.
void ReadKvRows(const KvStorage& storage, std::span<const int32_t> block_table, int32_t layer,
                int32_t token_start, int32_t count, float* k_out, float* v_out);
void WriteKvRows(KvStorage& storage, std::span<const int32_t> block_table, int32_t layer,
                 int32_t token_start, int32_t count, const float* k, const float* v);

}  // namespace tandem::kv

#endif  // TANDEM_ENGINE_KV_CPU_KV_STORAGE_H_
