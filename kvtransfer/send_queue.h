// KvSendQueue: the prefill worker's KV sends without blocking the caller.
// One sender thread drives every transfer over non-blocking sockets in one
// poll() loop: connect, HELLO -> ACCEPT/REJECT, then the FRAMEs and the
// FINAL in the order they were queued. The caller (the engine loop) only
// queues: EnqueueFrame copies the K/V rows into the queue's buffers and
// returns at once.
//
// Budget: per destination endpoint ("host:port"), the bytes queued but not
// yet written (whole FRAME/FINAL messages, headers included; HELLO is not
// counted) are bounded by Options::send_buffer_bytes. A destination is
// "full" when they reach it: HasRoom says false and EnqueueFrame(kIfRoom)
// refuses a frame that would go past it ("not now", not an error), unless
// nothing is queued for it at all (so a frame bigger than the budget still
// goes, alone). A caller that was told "not now" gets `notify` once the
// destination's writes make progress.
//
// Keepalive (protocol v4): an accepted transfer with nothing queued and no
// FINAL yet (the request waits in P's scheduler, or P computes a step)
// sends a KEEPALIVE every KeepaliveIntervalMs(transfer_timeout_ms), so the
// receiver's silence bound trips for a stopped sender, never a busy one.
// A KEEPALIVE is queued like any message: one that cannot be written
// counts as bytes queued (the silence bound applies on this side too).
//
// Results: a tcp transfer ends OK once its FINAL was written to the
// kernel, a device transfer (OpenWithTransport) once D's ACK arrived after
// it; otherwise with the first error: the code and reason of a REJECT (at HELLO or mid-
// transfer), UNAVAILABLE (connect refused, peer closed/reset),
// DEADLINE_EXCEEDED (no progress for transfer_timeout_ms while connecting,
// waiting for ACCEPT or ACK, or with bytes queued), DATA_LOSS (an ACK on
// a tcp transfer or before the FINAL was written), CANCELLED (Close before the
// end, or the queue destroyed). Result() polls it; `notify` says when.
//
// Owns: the sockets and buffers of every open transfer, the sender thread.
// Does not touch: KV memory (rows are copied in), the engine, gRPC.
// Threads: every public method is thread-safe and never waits for the
// network. `notify` runs with the queue's lock held, on the sender thread
// (or in the destructor, for transfers still open; never from Close): it
// must not call the queue; keep it short (signal a condition).
#ifndef TANDEM_KVTRANSFER_SEND_QUEUE_H_
#define TANDEM_KVTRANSFER_SEND_QUEUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtransfer/data_plane.h"
#include "kvtransfer/kv_transfer.h"

namespace tandem::kvtransfer {

// Milliseconds between KEEPALIVEs of an idle accepted transfer: a quarter
// of transfer_timeout_ms (the receiver's silence bound, from the same
// cluster config: kv.transfer_timeout_ms), within [1, 1000].
int KeepaliveIntervalMs(int transfer_timeout_ms);

class KvSendQueue {
 public:
  struct Options {
    // Per destination endpoint: bytes queued but not yet written
    // (kv.send_buffer_bytes). > 0.
    uint64_t send_buffer_bytes = 268435456;
    // Milliseconds without progress (connect, ACCEPT, a written byte) while
    // the transfer has something to do before it fails with
    // DEADLINE_EXCEEDED (kv.transfer_timeout_ms). > 0.
    int transfer_timeout_ms = 5000;
    // The cluster secret (hello_auth.h): with one, every HELLO carries a
    // credential and a transfer whose ACCEPT does not prove the secret
    // fails with UNAUTHENTICATED before any KV is written. nullptr or
    // open: no credential. Must outlive the queue.
    const auth::ClusterAuth* auth = nullptr;
  };
  using TransferId = uint64_t;
  // Called (sender thread, lock held) when the transfer's result is known,
  // or when its destination made progress after the caller was told "not
  // now" (HasRoom false / EnqueueFrame refused).
  using Notify = std::function<void()>;
  // Where EnqueueFrame may put a frame.
  enum class Admit {
    kIfRoom,  // "not now" (false) when the destination's budget is full
    kAlways,  // queue it whatever the budget (the caller asked HasRoom
              // before a step and must not leave a step half sent)
  };

  // Starts the sender thread. Errors: INVALID_ARGUMENT naming the option
  // (send_buffer_bytes == 0, transfer_timeout_ms <= 0); INTERNAL if the
  // wake-up pipe cannot be made.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvSendQueue>> Start(const Options& options);
  // Stops the thread and closes every connection; transfers still open end
  // CANCELLED (their notify runs). Ids stay valid for Result/Close.
  ~KvSendQueue();
  KvSendQueue(const KvSendQueue&) = delete;
  KvSendQueue& operator=(const KvSendQueue&) = delete;

  // Opens transfer (request_id, attempt) to `endpoint` ("host:port") with a
  // v3 HELLO (transport tcp) of `layout` and `bit_exact_class`; the sender thread connects
  // and handshakes. Frames queued before ACCEPT wait for it. Errors
  // (nothing opened): INVALID_ARGUMENT for a bad endpoint, a dtype outside
  // KvDtype, or a HELLO over wire::kMaxControlPayload bytes.
  [[nodiscard]] absl::StatusOr<TransferId> Open(const std::string& endpoint,
                                                const std::string& request_id, uint32_t attempt,
                                                const KvLayout& layout,
                                                const std::string& bit_exact_class, Notify notify);
  // The same for a device data path (data_plane.h): the HELLO names
  // `transport` and carries `transport_setup` (KvDataSender::OpenTransfer's,
  // at most 16 KiB: INVALID_ARGUMENT beyond); the transfer then takes
  // EnqueueDescriptor instead of EnqueueFrame, and its Result() is OK only
  // once D's ACK arrived after the FINAL (not when the FINAL was written).
  // transport tcp: exactly Open above.
  [[nodiscard]] absl::StatusOr<TransferId> OpenWithTransport(
      const std::string& endpoint, const std::string& request_id, uint32_t attempt,
      const KvLayout& layout, const std::string& bit_exact_class, KvTransport transport,
      const std::string& transport_setup, Notify notify);
  // Queues one FRAME_DESC (a frame whose bytes travel on the data path;
  // always admitted: it is small). Errors: INVALID_ARGUMENT for a tcp
  // transfer, a descriptor whose request id / attempt differ from the
  // transfer's, layer >= n_layers, token_count == 0, a locator over 64 KiB
  // or a descriptor after the FINAL; the transfer's error once it failed;
  // NOT_FOUND for an unknown id. FINAL's totals count descriptors as
  // frames and their FrameBytes as kv_bytes.
  [[nodiscard]] absl::Status EnqueueDescriptor(TransferId id, const FrameDescriptor& frame);
  // true: the transfer's destination is below its budget; false: it is
  // full (notify follows when it drains); an error: the transfer already
  // failed (its result), or NOT_FOUND for an unknown id.
  [[nodiscard]] absl::StatusOr<bool> HasRoom(TransferId id);
  // Queues one FRAME: k, v are token_count * layout.RowBytes() bytes each
  // (copied). true: queued; false: not now (kIfRoom and the budget is
  // full; nothing queued). Errors: INVALID_ARGUMENT for layer >= n_layers,
  // token_count == 0 or a frame after the FINAL; the transfer's error once
  // it failed; NOT_FOUND for an unknown id.
  [[nodiscard]] absl::StatusOr<bool> EnqueueFrame(TransferId id, uint32_t layer,
                                                  uint32_t token_start, uint32_t token_count,
                                                  const void* k, const void* v,
                                                  Admit admit = Admit::kIfRoom);
  // Queues the FINAL (always admitted: it is small) with token 0 of every
  // sample and the totals of the frames queued. Errors: INVALID_ARGUMENT
  // (nothing queued) for 0 or more than kMaxFinalSamples samples, a sample
  // with more than kMaxFinalTopLogprobs top logprobs, or a second FINAL;
  // otherwise as EnqueueFrame.
  [[nodiscard]] absl::Status EnqueueFinal(TransferId id, const std::vector<FinalSample>& samples);
  // nullopt while the transfer runs; then OK (tcp: FINAL written; device:
  // D's ACK) or its error.
  // NOT_FOUND for an unknown id.
  std::optional<absl::Status> Result(TransferId id);
  // Forgets the transfer: one still running is cancelled (connection
  // closed, its queued bytes dropped; its notify does not run). No-op for
  // unknown ids.
  void Close(TransferId id);

  // Bytes queued but not written for `endpoint` (0 if none).
  uint64_t queued_bytes(const std::string& endpoint);

 private:
  class Impl;
  explicit KvSendQueue(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_SEND_QUEUE_H_
