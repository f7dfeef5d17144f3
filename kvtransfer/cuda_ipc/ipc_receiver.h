// D's side of the cuda_ipc data path (KvDataReceiver). At a transfer's
// HELLO, D maps the prefill process's K and V pools and layer events from
// the transport_setup (ipc_codec.h), once per P instance (cached; closed
// when that instance has been idle for idle_close_ms, or at once when one
// of its copies missed its deadline). Per frame descriptor, on that P
// instance's copy stream: wait P's layer event (the descriptor left P after
// P enqueued the layer's event record, so the wait sees that record or a
// later one), DeviceKvAccess::CopyFromPeer from P's blocks named by the
// locator into the target's blocks, record a D event. A poller thread
// completes `done` when that event has completed, or DEADLINE_EXCEEDED when
// it has not within transfer_timeout_ms (a dead P never fires its events:
// the stream stays stuck behind the wait, so every copy queued on it times
// out and that instance's handles are closed; one stream per P instance
// keeps other prefill workers' copies moving).
//
// Known limit: a copy that timed out is abandoned on the device, not
// cancelled. If its P was alive after all and fires the event later, the
// copy still runs (into blocks D may have freed, from a mapping D closed);
// the deadline (transfer_timeout_ms, 5 s by default, for a copy that takes
// microseconds once P's layer is written) is what makes that unlikely.
//
// Owns: the peer cache (mappings, streams), D's copy events, the poller
// thread. Does not touch: the KV connection, D's block allocation.
// Threads: the KV receiver's threads call the public methods; `done` and
// `quiesced` run on the poller thread (`quiesced` may also run inline in
// CloseTransfer), never with the lock held. One absl::Mutex guards the state.
#ifndef TANDEM_KVTRANSFER_CUDA_IPC_IPC_RECEIVER_H_
#define TANDEM_KVTRANSFER_CUDA_IPC_IPC_RECEIVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/cuda_ipc/ipc_api.h"
#include "kvtransfer/cuda_ipc/ipc_codec.h"
#include "kvtransfer/data_plane.h"

namespace tandem::kvtransfer::cuda_ipc {

class CudaIpcReceiver final : public KvDataReceiver {
 public:
  struct Options {
    std::shared_ptr<IpcApi> api;                // required
    int transfer_timeout_ms = 5000;             // per copy, from Receive
    int idle_close_ms = 60000;                  // close an unused P instance's handles after this
    std::function<void(std::string_view)> log;  // may be empty
  };
  explicit CudaIpcReceiver(Options options);
  // Copies still in flight end CANCELLED; every mapping is closed.
  ~CudaIpcReceiver() override;

  KvTransport transport() const override { return KvTransport::kCudaIpc; }
  // Errors: FAILED_PRECONDITION for a malformed setup (naming the field),
  // a setup from another host ("... host X, this decode worker is on host
  // Y"), a null target.kv, a pool shape unlike the target's (naming the
  // field), a key already open; INTERNAL when a handle cannot be opened.
  [[nodiscard]] absl::Status OpenTransfer(const TransferKey& key, std::string_view transport_setup,
                                          const DeviceKvTarget& target) override;
  // Never blocks and never runs `done` inline. `done` gets OK once the rows
  // are in the target's blocks; DATA_LOSS for a malformed locator or one
  // that does not match the frame (naming it); DEADLINE_EXCEEDED when the
  // copy did not complete within transfer_timeout_ms; FAILED_PRECONDITION
  // for a key not open or closing; UNAVAILABLE when the P instance already
  // timed out; the error of CopyFromPeer or of a CUDA call.
  void Receive(const TransferKey& key, const FrameDescriptor& frame,
               std::function<void(absl::Status)> done) override;
  // `quiesced` runs once no copy of `key` is in flight (inline when none is).
  void CloseTransfer(const TransferKey& key, std::function<void()> quiesced) override;
  // FrameBytes of every copy that completed OK.
  uint64_t bytes_total() const override { return bytes_total_.load(); }

 private:
  struct Peer;
  struct Transfer;
  struct Copy;
  using Callback = std::function<void()>;

  // The cached peer for `instance_id`, opened from `setup` if needed.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Peer>> PeerLocked(const IpcSetup& setup)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::StatusOr<void*> PeerEventLocked(Peer& peer, const std::string& handle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues the copy; an error means nothing is in flight for it.
  [[nodiscard]] absl::StatusOr<void*> EnqueueCopyLocked(Transfer& transfer,
                                                        const FrameDescriptor& frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a copy: counters, the transfer's quiesced, the dead peer's close.
  void FinishCopyLocked(Copy& copy, absl::Status status, std::vector<Callback>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `done(status)` for the poller thread (never inline).
  void FailLocked(std::function<void(absl::Status)> done, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClosePeerLocked(Peer& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PollerLoop();
  // Writes and clears `lines` (never with mu_ held).
  void Log(std::vector<std::string>& lines);

  // Const after construction.
  const Options options_;
  std::atomic<uint64_t> bytes_total_{0};

  absl::Mutex mu_;
  absl::CondVar cv_;  // wakes the poller: a new copy, a callback, stop_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  // Peers no longer in peers_ (timed out) whose handles wait for their
  // copies to end.
  std::vector<std::shared_ptr<Peer>> dead_peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TransferKey, std::unique_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Copy>> copies_ ABSL_GUARDED_BY(mu_);
  std::vector<Callback> ready_ ABSL_GUARDED_BY(mu_);  // to run on the poller thread
  std::vector<void*> free_events_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> pending_log_ ABSL_GUARDED_BY(mu_);
  std::thread poller_;
};

}  // namespace tandem::kvtransfer::cuda_ipc

#endif  // TANDEM_KVTRANSFER_CUDA_IPC_IPC_RECEIVER_H_
