// KV cache memory in host RAM, F32 (the CPU backend's KvStorage; vLLM's
// PagedAttention layout, Kwon et al. 2023).
//
// Owns: the K/V floats of num_blocks blocks, allocated zeroed up front.
// Does not touch: which blocks are free (BlockPool), block tables.
// Threads: not thread-safe; see kv_storage.h.
//
// Memory layout, per block b and layer l (floats):
//   K(b, l): [block_size][n_kv_heads * head_dim]   then
//   V(b, l): [block_size][n_kv_heads * head_dim]
#ifndef TANDEM_ENGINE_KV_CPU_KV_STORAGE_H_
#define TANDEM_ENGINE_KV_CPU_KV_STORAGE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/kv/kv_storage.h"

namespace tandem::kv {

class CpuKvStorage final : public KvStorage {
 public:
  // num_blocks blocks of `shape`, every element 0.0f.
  CpuKvStorage(const KvShape& shape, int32_t num_blocks);

  // The element type of every CpuKvStorage.
  static constexpr KvDtype kDtype = KvDtype::kF32;

  const KvShape& shape() const override { return shape_; }
  KvDtype dtype() const override { return kDtype; }
  int32_t num_blocks() const override { return num_blocks_; }
  void ReadTokens(std::span<const int32_t> block_table, int32_t layer, int32_t token_start,
                  int32_t count, char* k_out, char* v_out) const override;
  void WriteTokens(std::span<const int32_t> block_table, int32_t layer, int32_t token_start,
                   int32_t count, const char* k, const char* v) override;

  // Block b's K or V rows for `layer`: [block_size][kv_dim] floats.
  float* K(int32_t block, int32_t layer);
  float* V(int32_t block, int32_t layer);
  const float* K(int32_t block, int32_t layer) const;
  const float* V(int32_t block, int32_t layer) const;

 private:
  KvShape shape_;
  int32_t num_blocks_;
  std::vector<float> storage_;
};

// KvStorage::ReadTokens / WriteTokens with [count][kv_dim] float buffers,
// for an F32 storage (a caller bug otherwise: aborts).
void ReadKvRows(const KvStorage& storage, std::span<const int32_t> block_table,
                int32_t layer, int32_t token_start, int32_t count, float* k_out,
                float* v_out);
void WriteKvRows(KvStorage& storage, std::span<const int32_t> block_table, int32_t layer,
                 int32_t token_start, int32_t count, const float* k, const float* v);

}  // namespace tandem::kv

#endif  // TANDEM_ENGINE_KV_CPU_KV_STORAGE_H_
