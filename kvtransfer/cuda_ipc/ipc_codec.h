// Byte layouts of the cuda_ipc data path's two blobs, both little-endian
// (`str` = u32 length | bytes):
//
// transport_setup (HELLO, P -> D; at most kMaxSetupBytes = 16 KiB):
//   u32 version (= 1), str host_id, u64 pid, str instance_id,
//   u32 device_ordinal, str k_handle, str v_handle, u64 pool_bytes,
//   u32 n_layers, u32 layer_blocks, u32 block_size, u32 kv_dim,
//   u32 dtype (KvDtype), u32 n_events (= n_layers),
//   n_events x str event_handle (empty: the layer had no event when the
//   transfer opened; its frames carry the handle in their locator)
//
// locator (FRAME_DESC, one frame; at most kMaxLocatorBytes = 64 KiB):
//   u32 version (= 1), u32 first_block (index in P's block table of the
//   block holding token_start: token_start / P's block_size),
//   str event_handle (empty: the setup's handle for the frame's layer),
//   u32 n_blocks, n_blocks x u32 block id (P's blocks of table indices
//   first_block .. first_block + n_blocks - 1)
//
// Decoders never read past the input and name the field that is wrong.
// Threads: pure functions.
#ifndef TANDEM_KVTRANSFER_CUDA_IPC_IPC_CODEC_H_
#define TANDEM_KVTRANSFER_CUDA_IPC_IPC_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/device_kv.h"

namespace tandem::kvtransfer::cuda_ipc {

inline constexpr uint32_t kCodecVersion = 1;
inline constexpr size_t kMaxSetupBytes = 16 * 1024;
inline constexpr size_t kMaxLocatorBytes = 64 * 1024;

// What P's OpenTransfer tells D.
struct IpcSetup {
  std::string host_id;
  int64_t pid = 0;
  std::string instance_id;
  int32_t device_ordinal = 0;
  std::string k_handle;
  std::string v_handle;
  // The pool shape (DevicePoolInfo without the pointers, which mean nothing
  // in another process).
  uint64_t pool_bytes = 0;
  int32_t n_layers = 0;
  int32_t layer_blocks = 0;
  int32_t block_size = 0;
  int32_t kv_dim = 0;
  kv::KvDtype dtype = kv::KvDtype::kBF16;
  std::vector<std::string> event_handles;  // one per layer, may be empty
};

// Encodes `setup`. When the result would pass kMaxSetupBytes, the event
// handles are left out (all empty) and `*events_dropped` (if given) is set.
std::string EncodeSetup(const IpcSetup& setup, bool* events_dropped = nullptr);
// Errors: FAILED_PRECONDITION "malformed cuda_ipc transport_setup: ..."
// naming the field (truncated, trailing bytes, version, unknown dtype,
// n_events != n_layers, a negative or zero shape).
[[nodiscard]] absl::StatusOr<IpcSetup> DecodeSetup(std::string_view bytes);

// Where one frame's rows are on P.
struct IpcLocator {
  uint32_t first_block = 0;
  std::string event_handle;
  std::vector<int32_t> blocks;
};

std::string EncodeLocator(const IpcLocator& locator);
// Errors: DATA_LOSS "malformed cuda_ipc locator: ..." naming the field.
[[nodiscard]] absl::StatusOr<IpcLocator> DecodeLocator(std::string_view bytes);

}  // namespace tandem::kvtransfer::cuda_ipc

#endif  // TANDEM_KVTRANSFER_CUDA_IPC_IPC_CODEC_H_
