// KV transfer between a prefill worker (sender) and a decode worker
// (receiver) over TCP (DESIGN.md, KV transfer).
//
// Owns: the wire protocol, sockets, per-transfer state and deadlines.
// Does not touch: KV memory directly (writes go through KvWriter), model
// execution, gRPC. Threads: KvReceiver runs one acceptor thread plus one
// thread per connection; public methods are thread-safe.
//
// Wire format (all little-endian; wire.h has the type numbers and the
// exact field layout), every message = u32 type | u32 length | payload:
//   HELLO  {request_id str, attempt u32, KvLayout}
//   ACCEPT {}                 REJECT {status code u32, reason str}
//   FRAME  {request_id str, attempt u32, layer u32, token_start u32,
//           token_count u32, K f32[token_count][kv_dim], V (same)}
//   FINAL  {token0 i32, logprob f32, finish_reason u32, frames u64,
//           kv_bytes u64}
//   (str = u32 length | bytes). D checks every frame before placing it:
//   layer < n_layers, token_start >= D_hit, end <= L, exact payload size.
// D may also send REJECT mid-transfer (cancel, bad frame, superseded
// attempt) just before it closes the connection; the sender reports it.
#ifndef TANDEM_KVTRANSFER_KV_TRANSFER_H_
#define TANDEM_KVTRANSFER_KV_TRANSFER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kvtransfer {

// What both ends must agree on before any KV byte moves. A mismatch in any
// field -> REJECT with FAILED_PRECONDITION naming the field and both values.
struct KvLayout {
  std::string model_fingerprint;
  uint32_t n_layers = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  std::string dtype = "f32";
  float rope_freq_base = 10000.0f;
  uint32_t rope_dim = 0;
  std::string rope_type = "norm";
  std::string numerics_id;  // build + ISA + KV dtype
  uint32_t kv_dim() const { return n_kv_heads * head_dim; }
  // Bytes of one frame's payload: 2 (K, V) * token_count * kv_dim * 4.
  uint64_t FrameBytes(uint32_t token_count) const;
};
// OK, or FAILED_PRECONDITION naming the first differing field.
absl::Status CheckCompatible(const KvLayout& local, const KvLayout& remote);

// Destination of received K/V rows (D implements it over its block table).
class KvWriter {
 public:
  virtual ~KvWriter() = default;
  // k, v: [token_count][kv_dim] floats for tokens [token_start, +count).
  virtual void WriteRows(uint32_t layer, uint32_t token_start,
                         uint32_t token_count, const float* k,
                         const float* v) = 0;
};

// The FINAL message's content.
struct TransferResult {
  int32_t first_token = -1;
  float first_logprob = 0.0f;
  uint32_t finish_reason = 0;  // tandem.v1.FinishReason value
  uint64_t frames = 0;
  uint64_t kv_bytes = 0;
};

// Decode-worker side. Listens on a TCP port; each expected transfer is
// registered with Expect() before D tells the router NeedRemotePrefill.
class KvReceiver {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;                       // 0 = ephemeral
    int handshake_timeout_ms = 5000;    // Expect() -> HELLO
    int transfer_timeout_ms = 5000;     // max silence between messages
  };
  // Binds and starts the acceptor. Errors: UNAVAILABLE if the bind fails,
  // INVALID_ARGUMENT for a layout with zero layers/heads/head_dim or a dtype
  // other than "f32", or non-positive timeouts.
  static absl::StatusOr<std::unique_ptr<KvReceiver>> Start(const Options& options,
                                                           const KvLayout& layout);
  // Stops all threads; pending transfers end with CANCELLED and their `done`
  // has run when the destructor returns. Must not be called from `done`.
  ~KvReceiver();
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  int port() const;

  // Called exactly once per Expect(), from a receiver thread: OK with the
  // FINAL content once every layer covers [hit_tokens, prompt_len) and the
  // totals match; otherwise DEADLINE_EXCEEDED / UNAVAILABLE / DATA_LOSS /
  // CANCELLED. When it runs, nothing writes into `writer` any more, so the
  // caller may free the blocks (state QUIESCED -> FREED).
  using DoneCallback = std::function<void(absl::Status, const TransferResult&)>;

  // Registers transfer (request_id, attempt). `writer` must stay valid
  // until `done` has run. Errors: ALREADY_EXISTS for a live key.
  absl::Status Expect(const std::string& request_id, uint32_t attempt,
                      uint32_t hit_tokens, uint32_t prompt_len, KvWriter* writer,
                      DoneCallback done);
  // Aborts the transfer (if still live); `done` runs with CANCELLED once
  // nothing writes into the writer. No-op for unknown ids.
  void Cancel(const std::string& request_id);

  // Expect()ed transfers whose `done` has not been queued yet.
  uint32_t transfers_in_flight() const;
  // K+V payload bytes of every frame accepted so far (monotonic; bytes of a
  // superseded attempt stay counted).
  uint64_t kv_bytes_received_total() const;

 private:
  class Impl;
  explicit KvReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Prefill-worker side: one connection per transfer.
class KvSender {
 public:
  // Connects, sends HELLO and waits for ACCEPT within timeout_ms. Errors:
  // UNAVAILABLE (connect), FAILED_PRECONDITION / ABORTED (REJECT, with the
  // peer's reason), DEADLINE_EXCEEDED.
  static absl::StatusOr<std::unique_ptr<KvSender>> Connect(
      const std::string& endpoint, const std::string& request_id,
      uint32_t attempt, const KvLayout& layout, int timeout_ms);
  ~KvSender();  // closes the connection
  KvSender(const KvSender&) = delete;
  KvSender& operator=(const KvSender&) = delete;

  // k, v: [token_count][kv_dim] floats. Each call has its own deadline of
  // timeout_ms. Errors: UNAVAILABLE / DEADLINE_EXCEEDED, INVALID_ARGUMENT
  // for layer >= n_layers or token_count == 0, or the code of a REJECT the
  // receiver sent mid-transfer (CANCELLED, DATA_LOSS, ABORTED, ...). After
  // an error every later call returns the same error.
  absl::Status SendFrame(uint32_t layer, uint32_t token_start,
                         uint32_t token_count, const float* k, const float* v);
  // Sends FINAL with the frame and byte totals of the SendFrame calls so far.
  // OK means it was handed to the kernel; D's verdict reaches D's caller.
  absl::Status SendFinal(int32_t first_token, float first_logprob,
                         uint32_t finish_reason);
  uint64_t bytes_sent() const;  // payload (K+V) bytes so far
  uint64_t frames_sent() const;

 private:
  class Impl;
  explicit KvSender(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_KV_TRANSFER_H_
