// The seam between the KV connection (control: HELLO, descriptors, FINAL,
// ACK; kv_transfer.h, send_queue.h) and a device data path (issue #16):
// NCCL (kvtransfer/nccl/) or CUDA IPC (kvtransfer/cuda_ipc/). With `tcp`
// neither is used: the K/V bytes ride in FRAME messages.
//
// The flow of one device transfer (docs/architecture.md, "KV transfer
// between GPU workers"):
//   P: KvDataSender::OpenTransfer -> the HELLO's transport_setup
//      (NCCL: a new ncclUniqueId and generation when the P-D pair has no
//      communicator; IPC: P's pool and layer-event handles).
//   D: KvDataReceiver::OpenTransfer(transport_setup) at that HELLO; an
//      error is the REJECT.
//   P: per (layer, token range) as the forward writes it,
//      KvDataSender::SendRows -> a FrameDescriptor, queued on the KV
//      connection as a FRAME_DESC message (KvSendQueue::EnqueueDescriptor);
//      the bytes move on the data path without the caller waiting.
//   D: each checked FRAME_DESC -> KvDataReceiver::Receive; `done` once the
//      rows are in D's blocks.
//   P: FINAL; D, once every Receive is done and FINAL checks out, sends ACK
//      and runs the transfer's `done`. P's transfer succeeds on ACK; P
//      frees its blocks when KvDataSender::Poll says the data path is
//      finished with them.
//
// Owns: the interfaces only. Threads: as stated per method.
#ifndef TANDEM_KVTRANSFER_DATA_PLANE_H_
#define TANDEM_KVTRANSFER_DATA_PLANE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kv/device_kv.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {

// One transfer: (request id, attempt), as on the KV connection.
struct TransferKey {
  std::string request_id;
  uint32_t attempt = 0;
  bool operator==(const TransferKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const TransferKey& k) {
    return H::combine(std::move(h), k.request_id, k.attempt);
  }
};

// One frame whose bytes travel on the data path, announced on the KV
// connection (FRAME_DESC). The bytes are a TCP FRAME's payload: K rows then
// V rows of tokens [token_start, token_start + token_count) of `layer`,
// KvLayout::FrameBytes(token_count) bytes.
struct FrameDescriptor {
  std::string request_id;
  uint32_t attempt = 0;
  uint32_t layer = 0;
  uint32_t token_start = 0;
  uint32_t token_count = 0;
  // NCCL: the frame's position in its communicator's send order (0, 1, 2,
  // ... per communicator generation, across every transfer of the P-D
  // pair); D posts ncclRecv strictly in this order. cuda_ipc: the frame's
  // index in its transfer.
  uint64_t comm_seq = 0;
  // Transport data the receiver needs to find the bytes (cuda_ipc: P's
  // block ids covering the range, as u32 little-endian; nccl: empty). At
  // most 64 KiB.
  std::string locator;
};

// The peer a P-side transfer goes to (from D's offer, KvTarget).
struct TransportPeer {
  std::string kv_endpoint;  // D's KV receiver host:port
  std::string host_id;      // D's LocalHostId()
  std::string instance_id;  // D's process instance (cache key with the endpoint)
};

// P's side of a device data path: one per process and transport, shared by
// every transfer (the worker builds it after the backend).
class KvDataSender {
 public:
  virtual ~KvDataSender() = default;
  virtual KvTransport transport() const = 0;

  // Prepares transfer `key` to `peer`; returns the HELLO's transport_setup
  // (opaque to the KV connection, at most 16 KiB). Any thread: the
  // prefill worker opens a transfer on the Prefill call's gRPC thread
  // (EngineCore::Submit), so implementations take their own lock.
  // Errors: UNAVAILABLE (e.g. the communicator of the pair failed and a new
  // one cannot be made), INVALID_ARGUMENT.
  [[nodiscard]] virtual absl::StatusOr<std::string> OpenTransfer(const TransferKey& key,
                                                                 const TransportPeer& peer) = 0;
  // Ships K/V of tokens [token_start, token_start + count) of `layer` of
  // the sequence with `block_table` in `kv` once the layer's event has
  // fired; never waits for the device or the network (engine loop thread).
  // Returns the descriptor to announce. Errors: the transfer's failure
  // (communicator aborted, ...), INVALID_ARGUMENT for a bad range.
  [[nodiscard]] virtual absl::StatusOr<FrameDescriptor> SendRows(
      const TransferKey& key, kv::DeviceKvAccess& kv, std::span<const int32_t> block_table,
      int32_t layer, int32_t token_start, int32_t count) = 0;
  // After the KV connection's result for `key` is known (`control`: OK
  // after D's ACK, else the failure): nullopt while the data path still
  // reads P's blocks (NCCL: sends not complete; cuda_ipc after a failure:
  // until the transfer deadline, as D may still be copying); then OK or the
  // data path's own error (first error wins). Engine loop thread.
  virtual std::optional<absl::Status> Poll(const TransferKey& key, const absl::Status& control) = 0;
  // Forgets `key` (after Poll gave a value, or to cancel: frames already
  // announced still complete on the data path so the channel stays in
  // step). Engine loop thread.
  virtual void CloseTransfer(const TransferKey& key) = 0;
  // Payload bytes this path has moved (monotonic), for the per-transport
  // counters. Any thread.
  virtual uint64_t bytes_total() const = 0;
};

// Where D's rows go: D's device KV and the blocks reserved for the request.
struct DeviceKvTarget {
  kv::DeviceKvAccess* kv = nullptr;
  std::vector<int32_t> block_table;
};

// D's side of a device data path: one per process and transport, shared by
// every transfer. The KV receiver calls it; calls for one key come in
// order (OpenTransfer, Receive..., CloseTransfer).
class KvDataReceiver {
 public:
  virtual ~KvDataReceiver() = default;
  virtual KvTransport transport() const = 0;

  // At an accepted HELLO for `key` (receiver I/O thread). `target` stays
  // valid until CloseTransfer's `quiesced` has run. Errors become the
  // REJECT: FAILED_PRECONDITION (a setup this end cannot use: another host
  // for cuda_ipc, a malformed setup), UNAVAILABLE (no communicator).
  [[nodiscard]] virtual absl::Status OpenTransfer(const TransferKey& key,
                                                  std::string_view transport_setup,
                                                  const DeviceKvTarget& target) = 0;
  // A FRAME_DESC the receiver checked (layer, range, size) (receiver I/O
  // thread, in the connection's order). Must not block. `done` runs exactly
  // once, on any thread but never inline, when the rows are in the target's
  // blocks or with the error that kept them out (DEADLINE_EXCEEDED,
  // UNAVAILABLE after an abort, DATA_LOSS for a bad locator).
  virtual void Receive(const TransferKey& key, const FrameDescriptor& frame,
                       std::function<void(absl::Status)> done) = 0;
  // Ends `key` (success or not; receiver I/O or completion thread).
  // `quiesced` runs once, on any thread (may be inline), when nothing will
  // write into the target any more: NCCL still receives frames already
  // announced, into a discard buffer, so the channel stays in step.
  virtual void CloseTransfer(const TransferKey& key, std::function<void()> quiesced) = 0;
  // Payload bytes received (monotonic), for the per-transport counters.
  virtual uint64_t bytes_total() const = 0;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_DATA_PLANE_H_
