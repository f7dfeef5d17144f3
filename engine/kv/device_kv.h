// Device-side access to a KV cache whose bytes live in GPU memory (issue
// #16): what the NCCL and CUDA IPC data paths need from the KV storage
// without reading rows back to the host. CudaKvStorage implements it; a
// KvStorage that is not on a device (the CPU backend's) does not, and
// `dynamic_cast<kv::DeviceKvAccess*>(&storage)` is null there.
//
// Streams and events are cudaStream_t / cudaEvent_t passed as void* so this
// header needs no CUDA; a host-memory stand-in (tests) implements the same
// interface with null streams and synchronous copies.
//
// Frame layout (the same as a TCP FRAME's payload, kv_transfer.h): a frame
// of `count` tokens of one layer is K rows then V rows, [2][count][kv_dim]
// elements of the storage's dtype, 2 * count * row_bytes() bytes.
//
// Owns: nothing (the storage owns the pools). Threads: the methods enqueue
// work on the stream they are given and may be called from any one thread
// at a time per stream; they never synchronize the device.
#ifndef TANDEM_ENGINE_KV_DEVICE_KV_H_
#define TANDEM_ENGINE_KV_DEVICE_KV_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "engine/kv/kv_dtype.h"

namespace tandem::kv {

// Where a storage's pools are, for a peer that maps them (CUDA IPC). The
// pool layout is cuda_kernels.h's PagedKv: element (layer, block, slot, j)
// at ((layer * layer_blocks + block) * block_size + slot) * kv_dim + j.
struct DevicePoolInfo {
  void* k = nullptr;        // K pool base (device pointer of the owner)
  void* v = nullptr;        // V pool base
  uint64_t pool_bytes = 0;  // bytes of each pool
  int32_t n_layers = 0;
  int32_t layer_blocks = 0;  // blocks per layer (the layer stride)
  int32_t block_size = 0;
  int32_t kv_dim = 0;
  KvDtype dtype = KvDtype::kBF16;
};

class DeviceKvAccess {
 public:
  virtual ~DeviceKvAccess() = default;

  // The CUDA device ordinal of the pools.
  virtual int device_ordinal() const = 0;
  virtual DevicePoolInfo pool_info() const = 0;

  // Enqueues on `stream`, after the current record of `layer`'s event (the
  // last Forward's write of that layer), one kernel that gathers K then V of
  // tokens [token_start, token_start + count) of the sequence with
  // `block_table` into `dst` (device memory, 2 * count * row bytes).
  // Errors: INVALID_ARGUMENT for a range the table does not cover or a
  // block outside the pool; INTERNAL for a CUDA error (naming the call).
  [[nodiscard]] virtual absl::Status GatherRows(std::span<const int32_t> block_table, int32_t layer,
                                                int32_t token_start, int32_t count, void* dst,
                                                void* stream) = 0;
  // The reverse on `stream`: scatters `src` (same layout) into the blocks.
  // Same errors.
  [[nodiscard]] virtual absl::Status ScatterRows(std::span<const int32_t> block_table,
                                                 int32_t layer, int32_t token_start, int32_t count,
                                                 const void* src, void* stream) = 0;
  // Enqueues on `stream` one kernel that copies tokens [token_start,
  // token_start + count) of `layer` from a peer's pools (`peer`, mapped into
  // this process: its k/v are this process's pointers, e.g. from
  // cudaIpcOpenMemHandle) addressed by `peer_table`, into this storage's
  // blocks addressed by `block_table` (token addressing on both sides, so
  // the block sizes may differ; the shapes and dtype must match:
  // INVALID_ARGUMENT naming the field otherwise).
  [[nodiscard]] virtual absl::Status CopyFromPeer(const DevicePoolInfo& peer,
                                                  std::span<const int32_t> peer_table,
                                                  std::span<const int32_t> block_table,
                                                  int32_t layer, int32_t token_start, int32_t count,
                                                  void* stream) = 0;
  // The event recorded after `layer`'s K/V writes of the last Forward
  // (cudaEvent_t, created with cudaEventInterprocess | cudaEventDisableTiming
  // so it can be exported with cudaIpcGetEventHandle); null before the
  // first Forward or for a layer out of range.
  virtual void* layer_event(int32_t layer) const = 0;
};

}  // namespace tandem::kv

#endif  // TANDEM_ENGINE_KV_DEVICE_KV_H_
