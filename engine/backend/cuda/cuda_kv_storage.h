// The KV cache in device memory (kv::KvStorage over a cuda::PagedKv: one K
// pool and one V pool, layout in cuda_kernels.h), in engine.kv_cache_dtype.
// ReadTokens / WriteTokens copy between the pools and host memory (the KV
// transfer's host buffers) on the storage's own copy stream, waiting for
// it before they return; they never synchronize the device. ReadTokens of
// a layer first waits for that layer's event of the last Forward
// (SetLayerEvent), so a prefill worker's per-layer hook reads exactly what
// the layer wrote while later layers still compute.
//
// Owns: the pools, the copy stream. Does not touch: which blocks are
// free (KvCacheManager). Threads: as kv::KvStorage (engine loop; a KV
// receiver may write blocks nothing else touches meanwhile: each call
// uses its own pinned staging and the copy stream, under a mutex).
#ifndef TANDEM_ENGINE_BACKEND_CUDA_CUDA_KV_STORAGE_H_
#define TANDEM_ENGINE_BACKEND_CUDA_CUDA_KV_STORAGE_H_

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/device_buffer.h"
#include "engine/kv/kv_storage.h"

namespace tandem::backend::cuda {

class CudaKvStorage final : public kv::KvStorage {
 public:
  // Allocates num_blocks blocks of `shape` in `dtype` (zeroed), plus one
  // scratch block the CUDA graphs' padding rows write to (block index
  // num_blocks, never handed out), a non-blocking copy stream and a pinned
  // staging buffer (4 MiB for K and as much for V, or one token's row if
  // larger; a longer range is copied in chunks of what fits). Errors:
  // INVALID_ARGUMENT for a shape with a non-positive field or num_blocks <
  // 1, RESOURCE_EXHAUSTED (naming the bytes) / INTERNAL from CUDA.
  static absl::StatusOr<std::unique_ptr<CudaKvStorage>> Create(const kv::KvShape& shape,
                                                               kv::KvDtype dtype,
                                                               int32_t num_blocks);
  ~CudaKvStorage() override;

  const kv::KvShape& shape() const override { return shape_; }
  kv::KvDtype dtype() const override { return paged_.dtype; }
  // The blocks the KvCacheManager may hand out (the scratch block not
  // counted).
  int32_t num_blocks() const override { return paged_.num_blocks - 1; }
  // A CUDA error here is fatal (the interface has no error path): the
  // message goes to stderr and the process aborts.
  void ReadTokens(std::span<const int32_t> block_table, int32_t layer, int32_t token_start,
                  int32_t count, char* k_out, char* v_out) const override;
  void WriteTokens(std::span<const int32_t> block_table, int32_t layer, int32_t token_start,
                   int32_t count, const char* k, const char* v) override;

  // The pools for the kernels. paged().num_blocks is the pools' blocks per
  // layer (their layer stride), the scratch block included: num_blocks() + 1.
  const PagedKv& paged() const { return paged_; }
  // The block index of the scratch block (== num_blocks()).
  int32_t scratch_block() const { return paged_.num_blocks - 1; }
  // Bytes of one block, all layers, K and V: 2 * n_layers * block_size *
  // kv_dim * element bytes.
  static uint64_t BlockBytes(const kv::KvShape& shape, kv::KvDtype dtype);
  // Set by the backend: ReadTokens of `layer` makes the copy stream wait
  // for `event` (cudaStreamWaitEvent: its latest record when ReadTokens
  // runs) before it copies; null: no wait. layer in [0, n_layers) (a caller
  // bug otherwise: aborts). Thread-safe (under the copy mutex).
  void SetLayerEvent(int32_t layer, cudaEvent_t event);

 private:
  struct Impl;
  // ReadTokens (to_device false: pools -> host_k/host_v) and WriteTokens
  // (true: host rows -> pools, host rows only read), through the staging
  // in chunks, on the copy stream.
  void CopyTokens(bool to_device, std::span<const int32_t> block_table, int32_t layer,
                  int32_t token_start, int32_t count, char* host_k, char* host_v) const;
  CudaKvStorage(const kv::KvShape& shape, std::unique_ptr<Impl> impl);
  kv::KvShape shape_;
  PagedKv paged_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_CUDA_KV_STORAGE_H_
