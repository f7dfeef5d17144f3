// P's side of the cuda_ipc data path (KvDataSender). P exports its K and V
// pools and its per-layer events once per process; D maps them and copies
// the rows itself (ipc_receiver.h), so P never enqueues device work for a
// transfer: SendRows only names P's blocks of the range in a locator
// (ipc_codec.h). P may free or reuse the blocks once Poll gives a value:
// after D's ACK (D's copies are done), or, after a failure, once
// transfer_timeout_ms has passed since the failure was first seen (D may
// still be copying until its own copy deadline of the same length).
//
// Owns: the export cache and per-transfer frame counts. Does not touch: the
// KV connection, D's memory. Threads: the engine loop thread calls every
// method; bytes_total() from any thread. One absl::Mutex guards the state.
#ifndef TANDEM_KVTRANSFER_CUDA_IPC_IPC_SENDER_H_
#define TANDEM_KVTRANSFER_CUDA_IPC_IPC_SENDER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/cuda_ipc/ipc_api.h"
#include "kvtransfer/data_plane.h"

namespace tandem::kvtransfer::cuda_ipc {

class CudaIpcSender final : public KvDataSender {
 public:
  struct Options {
    kv::DeviceKvAccess* kv = nullptr;  // this process's KV, the one exported
    std::shared_ptr<IpcApi> api;       // required
    int transfer_timeout_ms = 5000;    // after a failure, how long D may copy
    std::function<absl::Time()> now;   // clock; absl::Now when empty
  };
  explicit CudaIpcSender(Options options);

  KvTransport transport() const override { return KvTransport::kCudaIpc; }
  // transport_setup: this process's host id, pid and instance id, the pool
  // handles and shape, one event handle per layer (empty for a layer
  // without an event yet: its frames carry the handle). Errors:
  // INVALID_ARGUMENT for a peer on another host (peer.host_id non-empty and
  // not ours) or a key already open; INTERNAL from an export.
  [[nodiscard]] absl::StatusOr<std::string> OpenTransfer(const TransferKey& key,
                                                         const TransportPeer& peer) override;
  // Records nothing on the device: the descriptor's locator names P's
  // blocks of tokens [token_start, token_start + count) (their table
  // indices token_start / block_size .. (token_start + count - 1) /
  // block_size), comm_seq is the frame's index in the transfer. Errors:
  // FAILED_PRECONDITION for a key not open or a layer that has no event;
  // INVALID_ARGUMENT for `kv` other than the exported one, a layer outside
  // [0, n_layers), count < 1, token_start < 0, a range the table does not
  // cover, a block id outside [0, layer_blocks) (each naming the value).
  [[nodiscard]] absl::StatusOr<FrameDescriptor> SendRows(const TransferKey& key,
                                                         kv::DeviceKvAccess& kv,
                                                         std::span<const int32_t> block_table,
                                                         int32_t layer, int32_t token_start,
                                                         int32_t count) override;
  // OK once control is OK (D acknowledged: its copies are done). After a
  // failure: nullopt until transfer_timeout_ms since this Poll first saw
  // it, then `control` (at once when no frame was announced: D has nothing
  // to copy). An unknown key: `control`.
  std::optional<absl::Status> Poll(const TransferKey& key, const absl::Status& control) override;
  void CloseTransfer(const TransferKey& key) override;
  // FrameBytes (2 * count * kv_dim * dtype bytes) of every descriptor made.
  uint64_t bytes_total() const override { return bytes_total_.load(); }

 private:
  struct Transfer {
    uint64_t frames = 0;
    std::vector<void*> setup_events;  // per layer: the event whose handle the setup has
    std::optional<absl::Time> failure_seen;
  };
  struct ExportedEvent {
    void* event = nullptr;
    std::string handle;
  };

  [[nodiscard]] absl::Status ExportPoolsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The handle of `event` (layer `layer`'s current event), exported once.
  [[nodiscard]] absl::StatusOr<std::string> EventHandleLocked(int32_t layer, void* event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time Now() const { return options_.now ? options_.now() : absl::Now(); }

  // Const after construction.
  const Options options_;
  std::atomic<uint64_t> bytes_total_{0};

  absl::Mutex mu_;
  bool pools_exported_ ABSL_GUARDED_BY(mu_) = false;
  std::string k_handle_ ABSL_GUARDED_BY(mu_);
  std::string v_handle_ ABSL_GUARDED_BY(mu_);
  std::vector<ExportedEvent> events_ ABSL_GUARDED_BY(mu_);  // per layer
  absl::flat_hash_map<TransferKey, Transfer> transfers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kvtransfer::cuda_ipc

#endif  // TANDEM_KVTRANSFER_CUDA_IPC_IPC_SENDER_H_
