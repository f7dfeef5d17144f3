// KV transfer wire messages, protocol v4: encoding and bounds-checked
// decoding (kv_transfer.h has the protocol overview, README.md the table).
//
// Every message is   u32 type | u32 length | payload[length]   with all
// integers and floats little-endian (the host must be little-endian; a
// static_assert in wire.cc guards it). A `str` is u32 length | bytes.
//
//   type 1 HELLO   u32 protocol_version (= kKvProtocolVersion, 4),
//                  str request_id, u32 attempt, str model_fingerprint,
//                  u32 n_layers, u32 n_kv_heads, u32 head_dim,
//                  u32 kv_dtype (KvDtype = ggml_type number),
//                  str bit_exact_class,
//                  str transport ("tcp" | "nccl" | "cuda_ipc"; transport.h),
//                  str transport_setup (opaque, <= kMaxTransportSetupBytes)
//                  [u64 auth_ts_ms, str auth_nonce, str auth_sig]
//                  (the credential, only from a sender with the cluster
//                  secret; hello_auth.h; it signs every field before it)
//   type 2 ACCEPT  (empty) or str answer (a receiver with the cluster
//                  secret: its HMAC over the HELLO's nonce)
//   type 3 REJECT  u32 absl::StatusCode, str reason
//   type 4 FRAME   str request_id, u32 attempt, u32 layer, u32 token_start,
//                  u32 token_count, K bytes[token_count * RowBytes],
//                  V bytes[token_count * RowBytes]
//                  (RowBytes = n_kv_heads * head_dim * dtype bytes)
//   type 5 FINAL   u32 n_samples (1..kMaxFinalSamples = 16), then per
//                  sample in sample order:
//                    i32 token, f32 logprob,
//                    u32 finish_reason (tandem.v1.FinishReason value),
//                    u32 n_top (0..kMaxFinalTopLogprobs = 20),
//                    n_top x (i32 token_id, f32 logprob)
//                  then u64 frames, u64 kv_bytes (a device transfer:
//                  FRAME_DESC messages, and their KvLayout::FrameBytes)
//   type 6 FRAME_DESC  str request_id, u32 attempt, u32 layer,
//                  u32 token_start, u32 token_count, u64 comm_seq,
//                  str locator (<= kMaxLocatorBytes): a frame whose K/V
//                  bytes move on a device data path (data_plane.h)
//   type 7 ACK     (empty): D -> P, a device transfer's FINAL checked out
//                  and every frame is in D's blocks
//   type 8 KEEPALIVE (empty): P -> D, v4, while an accepted transfer has
//                  nothing else to send (KvSendQueue); D reads it as
//                  progress and nothing else
//
// HELLO's version comes first so that a receiver refuses a version it does
// not speak without reading further. (A v1 HELLO had no version: its first
// u32 is the request_id length, refused here as "version <length>".)
//
// Decoders never read past the payload they are given and fail with
// DATA_LOSS naming the message and field on truncated or trailing bytes.
//
// Owns: byte layout only. Does not touch: sockets, transfer state.
// Threads: pure functions, thread-safe.
#ifndef TANDEM_KVTRANSFER_WIRE_H_
#define TANDEM_KVTRANSFER_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvtransfer/data_plane.h"
#include "kvtransfer/kv_transfer.h"

namespace tandem::kvtransfer::wire {

enum class MessageType : uint32_t {
  kHello = 1,
  kAccept = 2,
  kReject = 3,
  kFrame = 4,
  kFinal = 5,
  kFrameDesc = 6,
  kAck = 7,
  kKeepalive = 8,
};
// "HELLO", "FRAME", ... or "type N" for numbers outside the enum.
std::string MessageTypeName(uint32_t type);

// Size of the u32 type | u32 length prefix.
inline constexpr size_t kHeaderBytes = 8;
// Largest payload accepted for any message other than FRAME (HELLO and
// REJECT are a few hundred bytes, FINAL at most kMaxFinalPayload); bigger
// lengths are DATA_LOSS.
inline constexpr uint32_t kMaxControlPayload = 64 * 1024;
// Largest FINAL payload: n_samples, kMaxFinalSamples x (token, logprob,
// finish_reason, n_top, kMaxFinalTopLogprobs x 8 bytes), frames, kv_bytes
// = 4 + 16 x (16 + 160) + 16 = 2,836 bytes.
inline constexpr uint32_t kMaxFinalPayload =
    4 + kMaxFinalSamples * (4 * 4 + kMaxFinalTopLogprobs * 8) + 2 * 8;
static_assert(kMaxFinalPayload <= kMaxControlPayload, "a FINAL must fit a control message");
// HELLO's transport_setup and FRAME_DESC's locator: largest accepted
// (data_plane.h); longer ones are DATA_LOSS when decoded.
inline constexpr uint32_t kMaxTransportSetupBytes = 16 * 1024;
inline constexpr uint32_t kMaxLocatorBytes = 64 * 1024;
// Largest FRAME_DESC payload for a request id of `request_id_size` bytes:
// str request_id, 4 x u32, u64 comm_seq, str locator of kMaxLocatorBytes.
inline size_t MaxFrameDescBytes(size_t request_id_size) {
  return 4 + request_id_size + 4 * 4 + 8 + 4 + kMaxLocatorBytes;
}
// FRAME payload bytes before K: str request_id + 4 x u32.
inline size_t FrameFieldsBytes(size_t request_id_size) { return 4 + request_id_size + 4 * 4; }

// HELLO's optional credential (auth/cluster_auth.h): the HMAC of
// "kv/HELLO" over the HELLO's other fields (HelloSignedBytes).
struct HelloAuth {
  uint64_t ts_ms = 0;
  std::string nonce;
  std::string sig;
};

struct Hello {
  uint32_t protocol_version = kKvProtocolVersion;
  std::string request_id;
  uint32_t attempt = 0;
  KvLayout layout;
  std::string bit_exact_class;    // not enforced; see kv_transfer.h
  std::optional<HelloAuth> auth;  // absent in an open cluster
  // v3 (on the wire before the credential, which signs them; declared last
  // so that positional initialisers of the fields above still work).
  std::string transport = "tcp";  // KvTransportName; checked by the receiver
  std::string transport_setup;    // KvDataSender::OpenTransfer's, opaque
};

// FRAME fields without the K/V rows.
struct FrameHeader {
  std::string request_id;
  uint32_t attempt = 0;
  uint32_t layer = 0;
  uint32_t token_start = 0;
  uint32_t token_count = 0;
};

// A decoded REJECT. (Not StatusOr<Status>: an error Status converts into
// such a StatusOr as a value, which hides decode failures.)
struct Reject {
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string reason;
  [[nodiscard]] absl::Status ToStatus() const { return absl::Status(code, reason); }
};

// A decoded FRAME: header plus the K and V bytes that follow it, split in
// two equal halves (views into the payload; no size check against the
// layout here, the receiver does that).
struct FrameView {
  FrameHeader header;
  absl::string_view kv;  // K bytes then V bytes
};

// Writes the 8-byte prefix of a message of `type` with `payload_bytes` into
// out[0..8).
void PutHeader(MessageType type, uint32_t payload_bytes, char* out);
// Parses an 8-byte prefix.
void GetHeader(const char* in, uint32_t* type, uint32_t* payload_bytes);

// Whole messages, prefix included.
// HELLO: every field as given, protocol_version and layout.dtype included
// (no check: tests build HELLOs of other versions and dtypes with it).
std::string EncodeHello(const Hello& hello);
// HELLO's payload without the credential: what its HMAC covers.
std::string HelloSignedBytes(const Hello& hello);
// ACCEPT: empty payload for an empty `answer`, else str answer.
std::string EncodeAccept(absl::string_view answer = "");
// `status` must not be OK; its code and message travel.
std::string EncodeReject(const absl::Status& status);
// FRAME_DESC: every field as given (no check: the send queue checks).
std::string EncodeFrameDesc(const FrameDescriptor& frame);
// ACK: empty payload.
std::string EncodeAck();
// KEEPALIVE: empty payload.
std::string EncodeKeepalive();
// FINAL: result.samples, frames and kv_bytes as given (peer_bit_exact_class
// is not on the wire). No check of the counts against kMaxFinalSamples /
// kMaxFinalTopLogprobs: tests build out-of-range FINALs with it;
// KvSender::SendFinal checks them before encoding.
std::string EncodeFinal(const TransferResult& result);
// Prefix plus FRAME fields up to (not including) K; the caller sends
// kv_bytes of K then V right after. Fails with INVALID_ARGUMENT when the
// payload would not fit the u32 length.
[[nodiscard]] absl::StatusOr<std::string> EncodeFramePrefix(const FrameHeader& header,
                                                            uint64_t kv_bytes);
// Whole FRAME with `bytes_each` bytes of K and of V (no check against
// token_count or a layout: tests use it to build malformed frames too).
[[nodiscard]] absl::StatusOr<std::string> EncodeFrame(const FrameHeader& header, const void* k,
                                                      const void* v, size_t bytes_each);

// Payload decoders (prefix already stripped). Errors: DATA_LOSS naming the
// message and field, unless said otherwise.
//
// HELLO: reads protocol_version first. Errors:
//   - FAILED_PRECONDITION "KV protocol version N is not supported (this
//     worker speaks 4)" for N != kKvProtocolVersion; nothing after the
//     version is read, so the rest may be anything.
//   - DATA_LOSS for truncated or trailing bytes (checked before the dtype).
//   - FAILED_PRECONDITION "unknown KV dtype N" for a kv_dtype outside
//     KvDtype.
// `fields` (optional) receives every field read, also on failure: after an
// unknown dtype it is the whole HELLO (layout.dtype holding the raw value),
// so the receiver can tell which transfer the refused HELLO was for; after
// a version error only protocol_version is set. transport and
// transport_setup follow bit_exact_class (a transport_setup over
// kMaxTransportSetupBytes is DATA_LOSS; the transport name is not checked
// here). Bytes after them are the credential (u64 ts, str nonce, str sig,
// then the end); anything else there is DATA_LOSS.
[[nodiscard]] absl::StatusOr<Hello> DecodeHello(absl::string_view payload, Hello* fields = nullptr);
// code is never OK: 0 and codes outside 1..16 become UNKNOWN.
[[nodiscard]] absl::StatusOr<Reject> DecodeReject(absl::string_view payload);
[[nodiscard]] absl::StatusOr<FrameView> DecodeFrame(absl::string_view payload);
// FINAL: also DATA_LOSS naming the field and value for n_samples outside
// [1, kMaxFinalSamples] or a sample's n_top outside
// [0, kMaxFinalTopLogprobs], e.g. "malformed KV FINAL message: field
// 'n_samples' 17 outside [1, 16]" or "... field 'samples[2].n_top' 21
// outside [0, 20]" (checked before anything is allocated for them).
// Per-sample fields are named "samples[i].token", ..., and
// "samples[i].top_logprobs[j].token_id". finish_reason values are not
// checked. peer_bit_exact_class stays empty.
[[nodiscard]] absl::StatusOr<TransferResult> DecodeFinal(absl::string_view payload);
// FRAME_DESC: DATA_LOSS naming the field for truncated or trailing bytes
// or a locator over kMaxLocatorBytes.
[[nodiscard]] absl::StatusOr<FrameDescriptor> DecodeFrameDesc(absl::string_view payload);
// ACK: DATA_LOSS unless the payload is empty.
[[nodiscard]] absl::Status DecodeAck(absl::string_view payload);
// KEEPALIVE: DATA_LOSS unless the payload is empty.
[[nodiscard]] absl::Status DecodeKeepalive(absl::string_view payload);
// ACCEPT: empty (answer "") or one str (the answer); DATA_LOSS otherwise.
// `answer` may be nullptr.
[[nodiscard]] absl::Status DecodeAccept(absl::string_view payload, std::string* answer = nullptr);

}  // namespace tandem::kvtransfer::wire

#endif  // TANDEM_KVTRANSFER_WIRE_H_
