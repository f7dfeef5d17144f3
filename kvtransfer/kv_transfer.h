// KV transfer between a prefill worker (sender) and a decode worker
// (receiver) over TCP, protocol v4 (DESIGN.md, KV transfer; README.md has
// the message table and the receiver's decisions).
//
// Owns: the wire protocol, sockets, per-transfer state and deadlines.
// Does not touch: KV memory directly (writes go through KvWriter), model
// execution, gRPC. Threads: KvReceiver runs two threads whatever the number
// of connections: an I/O thread that poll()s the listening socket and every
// connection (non-blocking; messages parsed as bytes arrive; writes into
// KvWriter; handshake and silence deadlines) and a completion thread that
// runs `done` callbacks. Public methods are thread-safe. A KvSender is
// driven by one thread.
//
// Wire format (all little-endian; wire.h has the type numbers and the
// exact field layout), every message = u32 type | u32 length | payload:
//   HELLO  {protocol_version u32 (= 4, first so that a receiver can refuse
//           another version unparsed), request_id str, attempt u32,
//           model_fingerprint str, n_layers u32, n_kv_heads u32,
//           head_dim u32, kv_dtype u32 (KvDtype), bit_exact_class str,
//           transport str, transport_setup str}
//   ACCEPT {}                 REJECT {status code u32, reason str}
//   FRAME  {request_id str, attempt u32, layer u32, token_start u32,
//           token_count u32, K bytes[token_count * RowBytes()], V (same)}
//   FINAL  {n_samples u32 (1..16), per sample in sample order
//           {token i32, logprob f32, finish_reason u32, n_top u32 (0..20),
//           n_top x {token_id i32, logprob f32}}, frames u64, kv_bytes u64}
//   FRAME_DESC {request_id str, attempt u32, layer u32, token_start u32,
//           token_count u32, comm_seq u64, locator str} (device transports:
//           the bytes move on the data path, data_plane.h)
//   ACK    {} (D -> P after a device transfer's FINAL and every frame landed)
//   KEEPALIVE {} (P -> D while an accepted transfer has nothing to send:
//           the request waits in P's queue or P computes; it keeps D's
//           silence bound, transfer_timeout_ms, for a peer that stopped)
//   (str = u32 length | bytes). D checks every frame before placing it:
//   layer < n_layers, token_start >= D_hit, end <= L, exact payload size.
// D may also send REJECT mid-transfer (cancel, bad frame, superseded
// attempt) just before it closes the connection; the sender reports it.
//
// Two things describe an end's KV, and only the first is enforced:
//   - the layout id (KvLayout::LayoutId): model fingerprint, shape and KV
//     dtype. Two ends exchange KV iff their layout ids are equal.
//   - the bit-exact class (a string such as "tandem-cpu/avx512/v2":
//     backend, ISA, build options). Carried in HELLO and reported to D's
//     caller (TransferResult::peer_bit_exact_class) but never refused: ends
//     with equal layout ids and different classes still transfer; their
//     results are then equivalent, not bit-identical.
#ifndef TANDEM_KVTRANSFER_KV_TRANSFER_H_
#define TANDEM_KVTRANSFER_KV_TRANSFER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "auth/cluster_auth.h"
#include "engine/kv/kv_dtype.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {

// The protocol version this build speaks; HELLO carries it first. Later
// features (attempt > 1, ...) come as a new version number or optional
// trailing data, never as a new meaning of an old one. (The one exception:
// FINAL's per-sample layout, for n > 1 and top-n logprobs, replaced the
// single-token v2 FINAL in place; README.md, Versioning.) v3 = transports:
// HELLO names the data path (transport.h), FRAME_DESC and ACK exist.
// v4 = KEEPALIVE: P opens the transfer when the Prefill call arrives and
// keeps the accepted connection alive while the request waits for its
// turn, so D's silence bound measures a stopped peer, not a busy one.
inline constexpr uint32_t kKvProtocolVersion = 4;

// Bounds of a FINAL: samples of one request (the proto's
// GenerationParams.n, 1..16) and top logprobs per sample (the proto's
// logprobs, 0..20, OpenAI's top_logprobs limit).
inline constexpr uint32_t kMaxFinalSamples = 16;
inline constexpr uint32_t kMaxFinalTopLogprobs = 20;

// Element type of the K/V rows on the wire: the engine's kv::KvDtype
// (engine/kv/kv_dtype.h, header only), whose values are ggml's
// `enum ggml_type` numbers (GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1,
// GGML_TYPE_BF16 = 30), so a GGUF/ggml tensor type maps over unchanged.
// HELLO carries the number as a u32; a value outside the enum is refused.
using kv::IsKnownKvDtype;
using kv::KvDtype;
using kv::KvDtypeBytes;
using kv::KvDtypeName;

// What both ends must agree on before any KV byte moves. A mismatch in any
// field -> REJECT with FAILED_PRECONDITION naming the field and both values.
// (The RoPE parameters are pinned by the model fingerprint; numerics are
// described by the bit-exact class, which is not part of the layout.)
struct KvLayout {
  std::string model_fingerprint;
  uint32_t n_layers = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  KvDtype dtype = KvDtype::kF32;

  // Elements in one token's K (or V) row of one layer: n_kv_heads * head_dim.
  uint32_t kv_dim() const { return n_kv_heads * head_dim; }
  // Bytes of one token's K (or V) row of one layer: kv_dim * dtype bytes.
  uint64_t RowBytes() const;
  // Bytes of one frame's K+V payload: 2 (K, V) * token_count * RowBytes().
  uint64_t FrameBytes(uint32_t token_count) const;
  // A stable, printable name of everything in the layout:
  // "kv<version>/<model_fingerprint>/L<n_layers>.H<n_kv_heads>.D<head_dim>/
  // <dtype name>", e.g. "kv4/3f0a.../L5.H4.D8/f32". Two ends can exchange
  // KV iff their layout ids are equal (CheckCompatible is OK exactly then).
  // The fingerprint may contain '/': the fields after it never do, so the
  // id still determines the layout.
  std::string LayoutId() const;
};
// OK, or FAILED_PRECONDITION naming the first differing field (in wire
// order) and both values, e.g. "KV layout mismatch in field 'dtype': local
// f32, remote f16" (strings are quoted, dtypes printed by name).
[[nodiscard]] absl::Status CheckCompatible(const KvLayout& local, const KvLayout& remote);

struct DeviceKvTarget;  // data_plane.h
class KvDataReceiver;   // data_plane.h

// Destination of received K/V rows (D implements it over its block table).
class KvWriter {
 public:
  virtual ~KvWriter() = default;
  // Non-null when the rows may go straight into device memory (a CUDA D):
  // a device data path (nccl, cuda_ipc; data_plane.h) writes there instead
  // of calling WriteRows. Valid as long as the writer. Default: none (only
  // tcp can feed this writer).
  virtual const DeviceKvTarget* device_target() const { return nullptr; }
  // k, v: token_count * layout.RowBytes() bytes each, rows of
  // [token_count][kv_dim] elements of the layout's dtype (raw bytes as P
  // sent them) for tokens [token_start, token_start + token_count) of
  // `layer`. Both buffers are aligned to alignof(std::max_align_t).
  virtual void WriteRows(uint32_t layer, uint32_t token_start, uint32_t token_count, const char* k,
                         const char* v) = 0;
};

// One of the most likely alternatives to a sample's token 0.
struct FinalTopLogprob {
  int32_t token_id;
  float logprob;  // natural log, of the raw (unprocessed) logits
};

// Token 0 of one sample (one of a request's n completions), as P sampled it.
struct FinalSample {
  int32_t token = -1;
  float logprob = 0.0f;        // natural log, of the raw logits
  uint32_t finish_reason = 0;  // tandem.v1.FinishReason value
  // The top-n alternatives, most likely first (0..kMaxFinalTopLogprobs;
  // empty when the request asked for no logprobs).
  std::vector<FinalTopLogprob> top_logprobs;
};

// The FINAL message's content, plus what D learnt from the HELLO.
struct TransferResult {
  // Token 0 of every sample, in sample order: 1..kMaxFinalSamples entries
  // in a decoded FINAL (kvtransfer checks only the counts; values such as
  // finish_reason are the caller's to check).
  std::vector<FinalSample> samples;
  uint64_t frames = 0;    // FRAME messages
  uint64_t kv_bytes = 0;  // K+V payload bytes of those frames
  // Not on the wire in FINAL: the bit-exact class from the HELLO of the
  // accepted attempt (empty if none was accepted). Differs from D's own
  // class -> the KV is equivalent, not bit-identical, to a local prefill.
  std::string peer_bit_exact_class;
  // Not on the wire: seconds from the first FRAME to the FINAL on the
  // receiver's clock (0 without frames). The sender streams each layer as
  // it is computed, so this spans the sender's prefill plus the tail.
  double stream_seconds = 0;
};

// Decode-worker side. Listens on a TCP port; each expected transfer is
// registered with Expect() before D tells the router NeedRemotePrefill.
class KvReceiver {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;                     // 0 = ephemeral
    int handshake_timeout_ms = 5000;  // Expect() -> HELLO
    // Max silence between messages of an accepted transfer (the sender
    // sends KEEPALIVE while it has nothing else: see KvSendQueue).
    int transfer_timeout_ms = 5000;
    // One line per refused connection (no HELLO accepted, or one taken
    // over by a newer attempt) and per failed transfer, e.g. "KV receiver:
    // transfer for request r1 attempt 2 failed: DEADLINE_EXCEEDED: ...".
    // Called on the receiver's I/O or completion thread (possibly both at
    // once), never with the receiver's lock held; must be thread-safe and
    // must not call back into the receiver. Empty: no lines.
    std::function<void(std::string_view)> log;
    // The cluster secret (hello_auth.h): with one, a HELLO without a valid
    // credential (missing, clock skew, bad signature, replayed) is REJECT
    // UNAUTHENTICATED and touches no transfer, and ACCEPT carries the
    // answer that proves the secret to P. nullptr or open: HELLOs as in an
    // open cluster. Must outlive the receiver.
    const auth::ClusterAuth* auth = nullptr;
    // The transports this receiver offers, most preferred first
    // (transport.h, SupportedTransports); a HELLO naming another is REJECT
    // FAILED_PRECONDITION naming both. Empty: {tcp}.
    std::vector<KvTransport> transports;
    // The device data paths for the non-tcp entries of `transports` (one
    // per transport, matched by KvDataReceiver::transport(); not owned,
    // must outlive the receiver). Start fails with INVALID_ARGUMENT when a
    // non-tcp transport has none.
    std::vector<KvDataReceiver*> data_receivers;
  };
  // Binds and starts the I/O and completion threads. Any known KvDtype is
  // fine (D only moves bytes). Errors: UNAVAILABLE if the bind (or the
  // wake eventfd) fails, INVALID_ARGUMENT for a layout with zero
  // layers/heads/head_dim or a dtype outside KvDtype, or non-positive
  // timeouts.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvReceiver>> Start(const Options& options,
                                                                         const KvLayout& layout);
  // Stops all threads; pending transfers end with CANCELLED and their `done`
  // has run when the destructor returns (a device transfer's after its
  // KvDataReceiver::CloseTransfer ran `quiesced`; the destructor waits for
  // that and for every outstanding Receive `done`). Must not be called
  // from `done`.
  ~KvReceiver();
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  int port() const;

  // Called exactly once per Expect(), on the receiver's completion thread
  // (one thread for all transfers, never the I/O thread): OK with the
  // FINAL content once every layer covers [hit_tokens, prompt_len) and the
  // totals match; otherwise FAILED_PRECONDITION (HELLO with another layout
  // or an unknown dtype) / DEADLINE_EXCEEDED / UNAVAILABLE / DATA_LOSS /
  // CANCELLED. When it runs, nothing writes into `writer` any more, so the
  // caller may free the blocks (state QUIESCED -> FREED).
  using DoneCallback = std::function<void(absl::Status, const TransferResult&)>;

  // Registers transfer (request_id, attempt). `writer` must stay valid
  // until `done` has run. Errors: ALREADY_EXISTS for a live key.
  [[nodiscard]] absl::Status Expect(const std::string& request_id, uint32_t attempt,
                                    uint32_t hit_tokens, uint32_t prompt_len, KvWriter* writer,
                                    DoneCallback done);
  // Aborts the transfer (if still live); `done` runs with CANCELLED once
  // nothing writes into the writer. No-op for unknown ids.
  void Cancel(const std::string& request_id);
  // Aborts transfer (request_id, attempt) only if that attempt is the live
  // one (registered by Expect or taken over by a newer HELLO, not yet
  // ended): `done` runs with CANCELLED "KV transfer for request <id>
  // attempt <n> cancelled: <reason>" once nothing writes into the writer,
  // and a connected sender gets REJECT with that status. Errors: NOT_FOUND
  // when no live transfer has that key (unknown id, another attempt, or
  // already ended).
  [[nodiscard]] absl::Status CancelAttempt(const std::string& request_id, uint32_t attempt,
                                           std::string reason);

  // Expect()ed transfers whose `done` has not been queued yet.
  uint32_t transfers_in_flight() const;
  // K+V payload bytes of every frame accepted so far, all transports
  // summed (monotonic; bytes of a superseded attempt stay counted).
  uint64_t kv_bytes_received_total() const;
  // The same for one transport (monotonic): tcp, the FRAME payload bytes
  // accepted; nccl / cuda_ipc, KvLayout::FrameBytes(token_count) of every
  // FRAME_DESC whose KvDataReceiver::Receive reported OK.
  uint64_t kv_bytes_received(KvTransport transport) const;
  // Successful transfers (`done` queued with OK), and the sum of their
  // times in seconds from the first FRAME/FRAME_DESC to the FINAL (a
  // transfer with no frame adds 0), both monotonic, for the
  // kv_transfer_seconds metric (mean = seconds / completed).
  double transfer_seconds_total() const;
  uint64_t transfers_completed_total() const;

 private:
  class Impl;
  explicit KvReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Prefill-worker side: one connection per transfer.
class KvSender {
 public:
  // Connects to endpoint ("host:port"), sends a v4 HELLO (transport tcp) with `layout` and
  // `bit_exact_class` (this end's backend/ISA/build, see the top of this
  // file) and waits for ACCEPT within timeout_ms (milliseconds, > 0).
  // Errors: INVALID_ARGUMENT (bad endpoint, timeout_ms <= 0, a dtype
  // outside KvDtype, or a HELLO over wire::kMaxControlPayload bytes),
  // UNAVAILABLE (connect), the code of a REJECT with the peer's reason
  // (FAILED_PRECONDITION for a layout mismatch or a version/dtype D does not
  // speak, NOT_FOUND, ABORTED; UNAUTHENTICATED for a credential D refused),
  // DEADLINE_EXCEEDED. `auth` (hello_auth.h; nullptr or open: none): signs
  // the HELLO and requires D's ACCEPT to prove the secret (UNAUTHENTICATED
  // otherwise, connection closed, nothing sent).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvSender>> Connect(
      const std::string& endpoint, const std::string& request_id, uint32_t attempt,
      const KvLayout& layout, const std::string& bit_exact_class, int timeout_ms,
      const auth::ClusterAuth* auth = nullptr);
  ~KvSender();  // closes the connection
  KvSender(const KvSender&) = delete;
  KvSender& operator=(const KvSender&) = delete;

  // k, v: token_count * layout.RowBytes() bytes each ([token_count][kv_dim]
  // elements of the layout's dtype; no alignment needed), sent as they are.
  // Each call has its own deadline of timeout_ms. Errors: UNAVAILABLE / DEADLINE_EXCEEDED, INVALID_ARGUMENT
  // for layer >= n_layers or token_count == 0, or the code of a REJECT the
  // receiver sent mid-transfer (CANCELLED, DATA_LOSS, ABORTED, ...). After
  // an error every later call returns the same error.
  [[nodiscard]] absl::Status SendFrame(uint32_t layer, uint32_t token_start, uint32_t token_count,
                                       const void* k, const void* v);
  // Sends FINAL with token 0 of every sample (in sample order) and the
  // frame and byte totals of the SendFrame calls so far. OK means it was
  // handed to the kernel; D's verdict reaches D's caller. Errors:
  // INVALID_ARGUMENT, with nothing sent and the transfer still usable, when
  // `samples` is empty or holds more than kMaxFinalSamples, or a sample has
  // more than kMaxFinalTopLogprobs top logprobs; otherwise as SendFrame.
  [[nodiscard]] absl::Status SendFinal(const std::vector<FinalSample>& samples);
  uint64_t bytes_sent() const;  // payload (K+V) bytes so far
  uint64_t frames_sent() const;

 private:
  class Impl;
  explicit KvSender(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_KV_TRANSFER_H_
