// The KV cache in device memory (kv::KvStorage over a cuda::PagedKv: one K
// pool and one V pool, layout in cuda_kernels.h), in engine.kv_cache_dtype.
// ReadTokens / WriteTokens copy between the pools and host memory (the KV
// transfer's host buffers) on the storage's own copy stream, waiting for
// it before they return; they never synchronize the device. ReadTokens of
// a layer first waits for that layer's event of the last Forward
// (SetLayerEvent), so a prefill worker's per-layer hook reads exactly what
// the layer wrote while later layers still compute.
//
// It is also a kv::DeviceKvAccess (device_kv.h, issue #16): GatherRows /
// ScatterRows / CopyFromPeer enqueue one kv_transfer.cu kernel each (per
// kKvSpanBlocks blocks of the range: a longer range is a few launches in
// order) on the caller's stream, with the block tables passed as kernel
// arguments (cuda_kernels.h, KvBlockSpan): no staging, no wait on the
// host. Each of those calls cudaSetDevice(device_ordinal()) on the
// calling thread first.
//
// Owns: the pools, the copy stream. Does not touch: which blocks are
// free (KvCacheManager). Threads: as kv::KvStorage (engine loop; a KV
// receiver may write blocks nothing else touches meanwhile: each call
// uses its own pinned staging and the copy stream, under a mutex). The
// DeviceKvAccess methods take no lock but the layer events' (never held
// across a copy) and may run on any thread.
#ifndef TANDEM_ENGINE_BACKEND_CUDA_CUDA_KV_STORAGE_H_
#define TANDEM_ENGINE_BACKEND_CUDA_CUDA_KV_STORAGE_H_

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/device_buffer.h"
#include "engine/kv/device_kv.h"
#include "engine/kv/kv_storage.h"

namespace tandem::backend::cuda {

class CudaKvStorage final : public kv::KvStorage, public kv::DeviceKvAccess {
 public:
  // Allocates num_blocks blocks of `shape` in `dtype` (zeroed), plus one
  // scratch block the CUDA graphs' padding rows write to (block index
  // num_blocks, never handed out), a non-blocking copy stream and a pinned
  // staging buffer (4 MiB for K and as much for V, or one token's row if
  // larger; a longer range is copied in chunks of what fits). Errors:
  // INVALID_ARGUMENT for a shape with a non-positive field or num_blocks <
  // 1, RESOURCE_EXHAUSTED (naming the bytes) / INTERNAL from CUDA.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CudaKvStorage>> Create(
      const kv::KvShape& shape, kv::KvDtype dtype, int32_t num_blocks);
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

  // kv::DeviceKvAccess (device_kv.h). Ranges are checked on the host
  // against the tables first (kv_copy_runs.h: INVALID_ARGUMENT with its
  // message, nothing enqueued); a CUDA error is INTERNAL naming the call.
  // GatherRows makes `stream` wait for `layer`'s event (SetLayerEvent)
  // first. pool_info's layer_blocks counts the scratch block.
  int device_ordinal() const override;
  kv::DevicePoolInfo pool_info() const override;
  [[nodiscard]] absl::Status GatherRows(std::span<const int32_t> block_table, int32_t layer,
                                        int32_t token_start, int32_t count, void* dst,
                                        void* stream) override;
  [[nodiscard]] absl::Status ScatterRows(std::span<const int32_t> block_table, int32_t layer,
                                         int32_t token_start, int32_t count, const void* src,
                                         void* stream) override;
  [[nodiscard]] absl::Status CopyFromPeer(const kv::DevicePoolInfo& peer,
                                          std::span<const int32_t> peer_table,
                                          std::span<const int32_t> block_table, int32_t layer,
                                          int32_t token_start, int32_t count,
                                          void* stream) override;
  void* layer_event(int32_t layer) const override;

 private:
  struct Impl;
  // ReadTokens (to_device false: pools -> host_k/host_v) and WriteTokens
  // (true: host rows -> pools, host rows only read), through the staging
  // in chunks (kv_staging.h's CopyKvThroughStaging), on the copy stream.
  void CopyTokens(bool to_device, std::span<const int32_t> block_table, int32_t layer,
                  int32_t token_start, int32_t count, char* host_k, char* host_v) const;
  // GatherRows / ScatterRows: one side paged (this storage), one flat.
  [[nodiscard]] absl::Status MoveRows(bool gather, std::span<const int32_t> block_table,
                                      int32_t layer, int32_t token_start, int32_t count,
                                      void* frame, void* stream);
  cudaEvent_t LayerEventOrNull(int32_t layer) const;
  CudaKvStorage(const kv::KvShape& shape, std::unique_ptr<Impl> impl);
  kv::KvShape shape_;
  PagedKv paged_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_CUDA_KV_STORAGE_H_
