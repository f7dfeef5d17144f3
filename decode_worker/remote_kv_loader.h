// The decode worker's KV receiver (kvtransfer::KvReceiver) as the engine
// core's RemoteKvLoader: a remote prefill's K/V arrives over TCP straight
// into the blocks the scheduler reserved (DESIGN.md, steps 3-6).
//
// Transports (issue #16, kvtransfer/transport.h): each load offers this
// worker's transports (its KvDataPlanes), host id and a per-process
// instance id in the core::KvTarget (-> NeedRemotePrefill.kv_target,
// forwarded by the router -> P's choice); the receiver takes a device transport's
// rows through the KvWriter's device_target() (the storage's
// kv::DeviceKvAccess and the load's block table) when the storage is on a
// GPU.
//
// Owns: the KV receiver (listening socket, transfers, their threads).
// Does not touch: which blocks a request holds (the core passes its block
// table), scheduling, gRPC.
// Threads: StartLoad/CancelLoad on the core's loop thread; the receiver's
// I/O thread writes rows into the reserved blocks (nothing else touches
// them until `done`) and its completion thread runs `done`.
#ifndef TANDEM_DECODE_WORKER_REMOTE_KV_LOADER_H_
#define TANDEM_DECODE_WORKER_REMOTE_KV_LOADER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cluster_config.h"
#include "worker/kv_data_planes.h"
#include "engine/core/request.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/transport.h"

namespace tandem::decode {

// Which prefill workers' bit-exact classes differ from this worker's: the
// class is reported at the KV HELLO but never enforced (only the KV layout
// id is), so a pair of different classes (e.g. engine.q8_matmul exact on
// the prefill worker, int8 here) serves, and a request prefilled there may
// differ in its last bits from one prefilled here. Thread-safe.
class PeerClassNotes {
 public:
  explicit PeerClassNotes(std::string local_class) : local_(std::move(local_class)) {}
  // The line to log the first time `peer_class` (a HELLO's
  // bit_exact_class) differs from the local class; nullopt when it is the
  // same, empty (an older peer) or already noted.
  std::optional<std::string> Note(const std::string& peer_class);

 private:
  const std::string local_;
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> noted_ ABSL_GUARDED_BY(mu_);
};

class ReceiverKvLoader final : public core::RemoteKvLoader {
 public:
  // Binds the KV receiver. `layout` is what every prefill worker's HELLO
  // must match. `planes` (null: tcp only) sets options.transports and
  // options.data_receivers and is kept alive until the receiver has
  // stopped. Errors: UNAVAILABLE when the port cannot be bound,
  // INVALID_ARGUMENT for a bad layout or timeouts.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ReceiverKvLoader>> Start(
      const kvtransfer::KvReceiver::Options& options, const kvtransfer::KvLayout& layout,
      std::shared_ptr<const KvDataPlanes> planes = nullptr);
  // The receiver's options from decode_workers[i].kv_listen and kv.*; its
  // log lines (refused connections, failed transfers) go to rpc::Log.
  static kvtransfer::KvReceiver::Options OptionsFromConfig(const HostPort& kv_listen,
                                                           const KvConfig& kv);

  // host:port prefill workers connect to: the one set_endpoint gave, else
  // the listen host and the bound port.
  std::string endpoint() const;
  // The port the KV receiver bound.
  int port() const;
  // The advertised KV endpoint (AdvertisedAddress of kv_listen); call once,
  // before the loader is handed to the engine core.
  void set_endpoint(std::string endpoint) { endpoint_ = std::move(endpoint); }
  // This worker's bit-exact class: each transfer from a prefill worker of
  // another class is logged once per class (PeerClassNotes). Call once,
  // before the loader is handed to the engine core; unset, nothing is
  // logged.
  void set_bit_exact_class(std::string local_class) {
    class_notes_ = std::make_shared<PeerClassNotes>(std::move(local_class));
  }
  const kvtransfer::KvLayout& layout() const { return layout_; }
  // What every load offers: the receiver's transports ({tcp} without
  // planes), kvtransfer::LocalHostId() and a NewInstanceId() drawn at Start.
  const kvtransfer::TransportOffer& offer() const { return offer_; }
  // K+V payload bytes received on `transport` (monotonic;
  // KvReceiver::kv_bytes_received: tcp FRAMEs, nccl / cuda_ipc the
  // FrameBytes of each FRAME_DESC its data receiver completed).
  uint64_t bytes_received_total(kvtransfer::KvTransport transport) const;
  // Completed transfers and their first-frame .. FINAL seconds, summed
  // (KvReceiver::transfers_completed_total / transfer_seconds_total).
  uint64_t transfers_completed_total() const;
  double transfer_seconds_total() const;

  // core::RemoteKvLoader. A load is transfer (request_id, attempt); its
  // target carries request_id and offer() (SetTransportOffer: transport
  // names, host id, instance id). Every
  // FINAL sample's finish reason must be a tandem.v1.FinishReason a prefill
  // worker can send (NONE, LENGTH, STOP, CONTEXT), else DATA_LOSS. The
  // result carries every sample (token, logprob, top logprobs, finish
  // reason) in order; the core checks their count against the request's n.
  [[nodiscard]] absl::StatusOr<core::KvTarget> StartLoad(
      const std::string& request_id, uint32_t attempt, int32_t hit_tokens, int32_t prompt_tokens,
      kv::KvStorage* storage, std::vector<int32_t> block_table, Done done) override;
  void CancelLoad(const std::string& request_id) override;
  uint32_t loads_in_flight() const override;
  uint64_t bytes_received_total() const override;

 private:
  ReceiverKvLoader(std::shared_ptr<const KvDataPlanes> planes,
                   std::unique_ptr<kvtransfer::KvReceiver> receiver, std::string host,
                   kvtransfer::KvLayout layout, kvtransfer::TransportOffer offer);

  // Declared before receiver_: the data receivers outlive the receiver.
  const std::shared_ptr<const KvDataPlanes> planes_;
  const std::unique_ptr<kvtransfer::KvReceiver> receiver_;
  const std::string host_;
  std::string endpoint_;  // set_endpoint's, empty until then
  const kvtransfer::KvLayout layout_;
  const kvtransfer::TransportOffer offer_;
  // Shared with the receiver's completion callbacks.
  std::shared_ptr<PeerClassNotes> class_notes_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_REMOTE_KV_LOADER_H_
