// The prefill worker's KV sends (kvtransfer::KvSendQueue) as the engine
// core's KvExport: HELLO when the Prefill call arrives (EngineCore::Submit
// opens the export; the queue then keeps the accepted connection alive
// with KEEPALIVEs while the request waits for its turn), one FRAME per
// (layer, token range) as the forward writes it, FINAL with token 0
// (DESIGN.md, steps 4-6). Nothing here waits for the network: the queue's
// sender thread connects and writes, the core asks Ready() before each
// step and Result() after Finish.
//
// Transport (issue #16, kvtransfer/transport.h): at Open the export picks
// one from D's offer (KvTarget) with kvtransfer::ChooseTransport over this
// worker's KvSendOptions::planes. tcp: FRAMEs as above. nccl / cuda_ipc:
// the transport's KvDataSender moves the rows on the device
// (sends_device_rows(); SendDeviceRows -> KvDataSender::SendRows, whose
// descriptor is queued as a FRAME_DESC), the HELLO carries the sender's
// transport_setup, and the transfer ends once D's ACK arrived and the
// sender's Poll says the data path is done with this worker's blocks.
//
// Owns: one request's transfer in the shared queue.
// Does not touch: KV memory (the core reads the rows and hands them over;
// the queue copies them), scheduling, gRPC.
// Threads: Open runs on the submitting thread (the Prefill call's gRPC
// thread), every other method on the core's loop thread after Submit
// handed the request over; the queue runs `wake` on its sender thread.
#ifndef TANDEM_PREFILL_WORKER_KV_EXPORT_H_
#define TANDEM_PREFILL_WORKER_KV_EXPORT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <optional>
#include <string>
#include <vector>

#include "worker/kv_data_planes.h"
#include "engine/core/request.h"
#include "kvtransfer/data_plane.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/send_queue.h"
#include "kvtransfer/transport.h"

namespace tandem::prefill {

// What every export of this worker shares.
struct KvSendOptions {
  kvtransfer::KvLayout layout;  // this worker's KV layout (KvLayoutFor)
  std::string bit_exact_class;  // reported in HELLO
  // Silence bound of a transfer: connect, ACCEPT, and writes while bytes
  // are queued (kv.transfer_timeout_ms).
  int32_t transfer_timeout_ms = 5000;
  // Per decode worker (KV endpoint): bytes queued but not yet written
  // (kv.send_buffer_bytes). A request whose receiver is at it waits.
  uint64_t send_buffer_bytes = 268435456;
  // The cluster secret (cluster.secret_file): HELLOs are signed and a
  // decode worker that cannot prove the secret gets no KV (the transfer
  // fails UNAUTHENTICATED). nullptr or open: none. Outlives the queue.
  const auth::ClusterAuth* auth = nullptr;
  // Fault injection for tests (--fault-stall-after-frames): after this
  // many frames, send nothing more (no FINAL either), as if the link
  // stalled, holding the connection open until the request is cancelled
  // or the receiver gives up. < 0 = off.
  int32_t fault_stall_after_frames = -1;
  // Fault injection for tests (--fault-fail-reply): every Prefill call
  // whose transfer succeeded answers UNAVAILABLE, as if the worker died
  // after writing FINAL and before its reply.
  bool fault_fail_reply = false;
  // The sender every export queues into; StartKvSendQueue sets it.
  std::shared_ptr<kvtransfer::KvSendQueue> queue;
  // This worker's transports and device data paths (BuildKvDataPlanes),
  // kept alive by every export that may use them. Null: tcp only.
  std::shared_ptr<const KvDataPlanes> planes;
  // kvtransfer::LocalHostId() of this worker (cuda_ipc only to a D with
  // the same one); StartKvSendQueue sets it when empty.
  std::string host_id;
  // K+V payload bytes every ended export queued, per transport (its
  // bytes_sent(), added at Close, when the engine adds it to
  // kv_bytes_sent_total); StartKvSendQueue creates it when null. The
  // worker's status reports it (WorkerStatus.kv_bytes_by_transport).
  std::shared_ptr<KvTransportBytes> bytes_by_transport;

  // planes->transports, or {tcp} without planes.
  std::vector<kvtransfer::KvTransport> transports() const;
};

// Starts options->queue from transfer_timeout_ms, send_buffer_bytes and
// auth; fills host_id and bytes_by_transport when unset.
// Errors: as kvtransfer::KvSendQueue::Start (INVALID_ARGUMENT naming the
// option).
[[nodiscard]] absl::Status StartKvSendQueue(KvSendOptions* options);

class SenderKvExport final : public core::KvExport {
 public:
  // Sends tokens [hit_tokens, L) of request `request_id` to `endpoint`
  // (the decode worker's KV receiver) as transfer attempt `attempt`, through
  // options.queue (required), on a transport of `offer` (D's, from the
  // KvTarget; an empty offer is tcp only).
  SenderKvExport(const KvSendOptions& options, std::string endpoint, std::string request_id,
                 uint32_t attempt, int32_t hit_tokens, kvtransfer::TransportOffer offer = {});
  ~SenderKvExport() override;

  int32_t first_token_to_send() const override { return hit_tokens_; }
  // Picks the transport (ChooseTransport) and opens the transfer. Errors:
  // FAILED_PRECONDITION "KV transport for <endpoint>: no common KV
  // transport: this prefill worker supports nccl, the decode worker offers
  // tcp" (ChooseTransport's, naming both lists); the data path's
  // OpenTransfer error; INVALID_ARGUMENT for a bad endpoint; each but the
  // first with "KV handshake with <endpoint>: " first. Handshake failures
  // (UNAVAILABLE, a REJECT's code, DEADLINE_EXCEEDED) come later, from
  // Ready/SendLayer/Result.
  [[nodiscard]] absl::Status Open(std::shared_ptr<const core::CancelFlag> cancelled,
                                  Wake wake) override;
  [[nodiscard]] absl::StatusOr<bool> Ready() override;
  // tcp only (a device transport gets SendDeviceRows): FAILED_PRECONDITION
  // otherwise.
  [[nodiscard]] absl::Status SendLayer(int32_t layer, int32_t token_start, int32_t count,
                                       const char* k, const char* v) override;
  // True once Open chose nccl or cuda_ipc.
  bool sends_device_rows() const override { return data_ != nullptr; }
  // KvDataSender::SendRows, then its descriptor queued (EnqueueDescriptor).
  [[nodiscard]] absl::Status SendDeviceRows(kv::DeviceKvAccess& kv,
                                            std::span<const int32_t> block_table, int32_t layer,
                                            int32_t token_start, int32_t count) override;
  [[nodiscard]] absl::Status Finish(const std::vector<core::SampleStart>& samples) override;
  // tcp: the queue's result. A device transport: nullopt until the queue's
  // result (OK only after D's ACK) is known and KvDataSender::Poll says
  // the data path no longer reads this worker's blocks; then the data
  // path's error if it had one, else the queue's result. Stable once given.
  std::optional<absl::Status> Result() override;
  void Close() override;
  uint64_t bytes_sent() const override { return bytes_sent_; }

  // The transport Open chose (tcp before Open).
  kvtransfer::KvTransport transport() const { return transport_; }

 private:
  // Whether the injected stall has begun.
  bool Stalled() const;
  // Counts one frame of `count` tokens, queued on the chosen transport.
  void CountFrame(int32_t count);

  const KvSendOptions options_;
  const std::string endpoint_;
  const std::string request_id_;
  const uint32_t attempt_;
  const int32_t hit_tokens_;
  const kvtransfer::TransportOffer offer_;
  kvtransfer::KvTransport transport_ = kvtransfer::KvTransport::kTcp;
  // The chosen device data path (nccl, cuda_ipc); null for tcp.
  kvtransfer::KvDataSender* data_ = nullptr;
  std::optional<kvtransfer::KvSendQueue::TransferId> id_;
  std::optional<absl::Status> result_;  // a device transfer's, once known
  int64_t frames_ = 0;
  uint64_t bytes_sent_ = 0;
  bool counted_ = false;  // bytes_sent_ added to bytes_by_transport (Close)
};

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_KV_EXPORT_H_
