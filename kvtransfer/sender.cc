// KvSender (kv_transfer.h): HELLO (protocol v2) -> ACCEPT, then FRAME* and
// FINAL, each write under its own deadline. Before every write it peeks for
// a REJECT that the receiver sends when it ends the transfer early (cancel,
// bad frame, newer attempt), so the caller learns the receiver's reason.
#include <sys/uio.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtransfer/hello_auth.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/tcp.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer {

// Threads: one caller at a time (a transfer is driven by one thread).
class KvSender::Impl {
 public:
  std::string endpoint;
  std::string request_id;
  uint32_t attempt = 0;
  KvLayout layout;
  int timeout_ms = 0;
  tcp::ScopedFd fd;
  uint64_t bytes_sent = 0;
  uint64_t frames_sent = 0;
  absl::Status broken;  // first error; every later call returns it

  // The receiver's REJECT if one is waiting to be read; else `fallback`.
  [[nodiscard]] absl::Status PeerVerdict(absl::Status fallback) {
    if (!tcp::Readable(fd.get())) return fallback;
    uint32_t type = 0;
    std::string payload;
    absl::Status s = tcp::ReadMessage(fd.get(), tcp::DeadlineIn(std::min(timeout_ms, 200)),
                                      wire::kMaxControlPayload, &type, &payload);
    if (!s.ok() || type != static_cast<uint32_t>(wire::MessageType::kReject)) {
      return fallback;
    }
    absl::StatusOr<wire::Reject> rejected = wire::DecodeReject(payload);
    if (!rejected.ok()) return rejected.status();
    return Rejected(*rejected);
  }

  [[nodiscard]] absl::Status Rejected(const wire::Reject& r) const {
    return absl::Status(r.code, absl::StrCat("KV receiver ", endpoint, " rejected request ",
                                             request_id, " attempt ", attempt, ": ", r.reason));
  }

  // Writes one message (iov[0..n)) unless the transfer already failed.
  [[nodiscard]] absl::Status Send(struct iovec* iov, int n) {
    if (!broken.ok()) return broken;
    if (tcp::Readable(fd.get())) {
      // The receiver never speaks mid-transfer unless it is ending it.
      broken = PeerVerdict(absl::UnavailableError(absl::StrCat(
          "KV receiver ", endpoint, " closed the connection for request ", request_id)));
      return broken;
    }
    absl::Status s = tcp::SendAll(fd.get(), iov, n, tcp::DeadlineIn(timeout_ms),
                                  /*idle_ms=*/timeout_ms);
    if (!s.ok()) {
      broken =
          PeerVerdict(absl::Status(s.code(), absl::StrCat("KV transfer of request ", request_id,
                                                          " to ", endpoint, ": ", s.message())));
    }
    return broken;
  }
};

absl::StatusOr<std::unique_ptr<KvSender>> KvSender::Connect(
    const std::string& endpoint, const std::string& request_id, uint32_t attempt,
    const KvLayout& layout, const std::string& bit_exact_class, int timeout_ms,
    const auth::ClusterAuth* auth) {
  if (timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvSender timeout_ms must be > 0, got ", timeout_ms));
  }
  // Frame sizes come from the dtype: an unknown one would size them 0.
  if (!IsKnownKvDtype(static_cast<uint32_t>(layout.dtype))) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvSender: KV layout dtype ", static_cast<uint32_t>(layout.dtype),
                     " is not a known KvDtype (f32 = 0, f16 = 1, bf16 = 30)"));
  }
  wire::Hello hello_fields{kKvProtocolVersion, request_id, attempt, layout,
                           bit_exact_class,    {},         "tcp",   ""};
  SignHello(auth, &hello_fields);
  const std::string hello = wire::EncodeHello(hello_fields);
  if (hello.size() - wire::kHeaderBytes > wire::kMaxControlPayload) {
    return absl::InvalidArgumentError(absl::StrCat("KvSender: HELLO for request ", request_id,
                                                   " would be ", hello.size() - wire::kHeaderBytes,
                                                   " bytes, over the ", wire::kMaxControlPayload,
                                                   "-byte limit (request id, fingerprint or "
                                                   "bit-exact class too long)"));
  }
  auto impl = std::make_unique<Impl>();
  impl->endpoint = endpoint;
  impl->request_id = request_id;
  impl->attempt = attempt;
  impl->layout = layout;
  impl->timeout_ms = timeout_ms;

  const tcp::Deadline deadline = tcp::DeadlineIn(timeout_ms);
  absl::StatusOr<tcp::ScopedFd> fd = tcp::Connect(endpoint, deadline);
  if (!fd.ok()) return fd.status();
  impl->fd = std::move(*fd);
  auto fail = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("KV handshake with ", endpoint, " for request ",
                                               request_id, ": ", s.message()));
  };
  absl::Status s = tcp::SendAll(impl->fd.get(), hello, deadline);
  if (!s.ok()) return fail(s);
  uint32_t type = 0;
  std::string payload;
  s = tcp::ReadMessage(impl->fd.get(), deadline, wire::kMaxControlPayload, &type, &payload);
  if (!s.ok()) return fail(s);
  switch (static_cast<wire::MessageType>(type)) {
    case wire::MessageType::kAccept: {
      std::string answer;
      s = wire::DecodeAccept(payload, &answer);
      if (!s.ok()) return fail(s);
      s = CheckAcceptAnswer(auth, hello_fields, answer);
      if (!s.ok()) return fail(s);
      return std::unique_ptr<KvSender>(new KvSender(std::move(impl)));
    }
    case wire::MessageType::kReject: {
      absl::StatusOr<wire::Reject> rejected = wire::DecodeReject(payload);
      if (!rejected.ok()) return fail(rejected.status());
      return impl->Rejected(*rejected);
    }
    case wire::MessageType::kHello:
    case wire::MessageType::kFrame:
    case wire::MessageType::kFinal:
    default:
      return fail(absl::DataLossError(
          absl::StrCat("expected ACCEPT or REJECT, got ", wire::MessageTypeName(type))));
  }
}

KvSender::KvSender(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvSender::~KvSender() = default;

absl::Status KvSender::SendFrame(uint32_t layer, uint32_t token_start, uint32_t token_count,
                                 const void* k, const void* v) {
  Impl& s = *impl_;
  if (layer >= s.layout.n_layers || token_count == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvSender::SendFrame: layer ", layer, " (n_layers ", s.layout.n_layers,
                     "), token_count ", token_count, " (must be > 0)"));
  }
  // token_count rows of K, then of V, in the layout's dtype.
  const uint64_t kv_bytes = s.layout.FrameBytes(token_count);
  absl::StatusOr<std::string> prefix =
      wire::EncodeFramePrefix({s.request_id, s.attempt, layer, token_start, token_count}, kv_bytes);
  if (!prefix.ok()) return prefix.status();
  struct iovec iov[3] = {
      {prefix->data(), prefix->size()},
      {const_cast<void*>(k), kv_bytes / 2},
      {const_cast<void*>(v), kv_bytes / 2},
  };
  absl::Status st = s.Send(iov, 3);
  if (st.ok()) {
    s.bytes_sent += kv_bytes;
    ++s.frames_sent;
  }
  return st;
}

absl::Status KvSender::SendFinal(const std::vector<FinalSample>& samples) {
  Impl& s = *impl_;
  if (samples.empty() || samples.size() > kMaxFinalSamples) {
    return absl::InvalidArgumentError(absl::StrCat("KvSender::SendFinal: samples: must hold 1 to ",
                                                   kMaxFinalSamples, " samples, got ",
                                                   samples.size()));
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    if (samples[i].top_logprobs.size() > kMaxFinalTopLogprobs) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvSender::SendFinal: samples[", i, "].top_logprobs: at most ",
                       kMaxFinalTopLogprobs, " entries, got ", samples[i].top_logprobs.size()));
    }
  }
  TransferResult final_msg;
  final_msg.samples = samples;
  final_msg.frames = s.frames_sent;
  final_msg.kv_bytes = s.bytes_sent;
  std::string msg = wire::EncodeFinal(final_msg);
  struct iovec iov = {msg.data(), msg.size()};
  return s.Send(&iov, 1);
}

uint64_t KvSender::bytes_sent() const { return impl_->bytes_sent; }
uint64_t KvSender::frames_sent() const { return impl_->frames_sent; }

}  // namespace tandem::kvtransfer
