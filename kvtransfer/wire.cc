#include "kvtransfer/wire.h"

#include <bit>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::wire {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the KV wire format is little-endian; add byte swapping");
static_assert(sizeof(float) == 4);

// Appends little-endian fields to a string.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void U32(uint32_t v) { Raw(&v, 4); }
  void I32(int32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void F32(float v) { Raw(&v, 4); }
  void Str(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_->append(s.data(), s.size());
  }
  void Raw(const void* p, size_t n) { out_->append(static_cast<const char*>(p), n); }

 private:
  std::string* out_;
};

// Reads little-endian fields from a payload; every read is bounds-checked
// and the first failure names the message and field.
class Reader {
 public:
  Reader(absl::string_view data, const char* message) : data_(data), message_(message) {}

  bool U32(absl::string_view field, uint32_t* v) { return Fixed(field, v, 4); }
  bool I32(absl::string_view field, int32_t* v) { return Fixed(field, v, 4); }
  bool U64(absl::string_view field, uint64_t* v) { return Fixed(field, v, 8); }
  bool F32(absl::string_view field, float* v) { return Fixed(field, v, 4); }
  // A u32 count in [lo, hi]; fails naming the field and value otherwise.
  bool Count(absl::string_view field, uint32_t lo, uint32_t hi, uint32_t* v) {
    if (!U32(field, v)) return false;
    if (*v >= lo && *v <= hi) return true;
    return Fail(field, absl::StrCat(*v, " outside [", lo, ", ", hi, "]"));
  }
  bool Str(absl::string_view field, std::string* s,
           uint32_t max = std::numeric_limits<uint32_t>::max()) {
    uint32_t n = 0;
    if (!U32(field, &n)) return false;
    if (n > max) {
      return Fail(field, absl::StrCat("string length ", n, " exceeds the limit of ", max));
    }
    if (n > data_.size() - pos_) {
      return Fail(field, absl::StrCat("string length ", n, " exceeds the ", data_.size() - pos_,
                                      " bytes left"));
    }
    s->assign(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  // The bytes not read yet.
  absl::string_view Rest() const { return data_.substr(pos_); }
  // Fails unless every byte was read.
  bool End() {
    if (pos_ == data_.size()) return true;
    return Fail("end", absl::StrCat(data_.size() - pos_, " trailing bytes"));
  }
  const absl::Status& status() const { return status_; }

 private:
  bool Fixed(absl::string_view field, void* v, size_t n) {
    if (n > data_.size() - pos_) {
      return Fail(field, absl::StrCat("needs ", n, " bytes, ", data_.size() - pos_, " left"));
    }
    std::memcpy(v, data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Fail(absl::string_view field, const std::string& why) {
    if (status_.ok()) {
      status_ = absl::DataLossError(
          absl::StrCat("malformed KV ", message_, " message: field '", field, "' ", why));
    }
    return false;
  }

  absl::string_view data_;
  const char* message_;
  size_t pos_ = 0;
  absl::Status status_;
};

// Builds prefix + payload: `fill` appends the payload fields.
template <typename Fill>
std::string Message(MessageType type, Fill fill) {
  std::string out(kHeaderBytes, '\0');
  Writer w(&out);
  fill(w);
  PutHeader(type, static_cast<uint32_t>(out.size() - kHeaderBytes), out.data());
  return out;
}

}  // namespace

std::string MessageTypeName(uint32_t type) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::kHello:
      return "HELLO";
    case MessageType::kAccept:
      return "ACCEPT";
    case MessageType::kReject:
      return "REJECT";
    case MessageType::kFrame:
      return "FRAME";
    case MessageType::kFinal:
      return "FINAL";
    case MessageType::kFrameDesc:
      return "FRAME_DESC";
    case MessageType::kAck:
      return "ACK";
    case MessageType::kKeepalive:
      return "KEEPALIVE";
  }
  return absl::StrCat("type ", type);
}

void PutHeader(MessageType type, uint32_t payload_bytes, char* out) {
  uint32_t t = static_cast<uint32_t>(type);
  std::memcpy(out, &t, 4);
  std::memcpy(out + 4, &payload_bytes, 4);
}

void GetHeader(const char* in, uint32_t* type, uint32_t* payload_bytes) {
  std::memcpy(type, in, 4);
  std::memcpy(payload_bytes, in + 4, 4);
}

namespace {
// HELLO's fields before the credential.
void WriteHelloFields(const Hello& hello, Writer& w) {
  const KvLayout& l = hello.layout;
  w.U32(hello.protocol_version);
  w.Str(hello.request_id);
  w.U32(hello.attempt);
  w.Str(l.model_fingerprint);
  w.U32(l.n_layers);
  w.U32(l.n_kv_heads);
  w.U32(l.head_dim);
  w.U32(static_cast<uint32_t>(l.dtype));
  w.Str(hello.bit_exact_class);
  w.Str(hello.transport);
  w.Str(hello.transport_setup);
}
}  // namespace

std::string EncodeHello(const Hello& hello) {
  return Message(MessageType::kHello, [&](Writer& w) {
    WriteHelloFields(hello, w);
    if (hello.auth.has_value()) {
      w.U64(hello.auth->ts_ms);
      w.Str(hello.auth->nonce);
      w.Str(hello.auth->sig);
    }
  });
}

std::string HelloSignedBytes(const Hello& hello) {
  std::string out;
  Writer w(&out);
  WriteHelloFields(hello, w);
  return out;
}

std::string EncodeAccept(absl::string_view answer) {
  return Message(MessageType::kAccept, [&](Writer& w) {
    if (!answer.empty()) w.Str(answer);
  });
}

std::string EncodeReject(const absl::Status& status) {
  return Message(MessageType::kReject, [&](Writer& w) {
    w.U32(static_cast<uint32_t>(status.code()));
    // Keep REJECT a control-sized message whatever the reason's length.
    w.Str(absl::string_view(status.message()).substr(0, 4096));
  });
}

std::string EncodeFrameDesc(const FrameDescriptor& f) {
  return Message(MessageType::kFrameDesc, [&](Writer& w) {
    w.Str(f.request_id);
    w.U32(f.attempt);
    w.U32(f.layer);
    w.U32(f.token_start);
    w.U32(f.token_count);
    w.U64(f.comm_seq);
    w.Str(f.locator);
  });
}

std::string EncodeAck() {
  return Message(MessageType::kAck, [](Writer&) {});
}

std::string EncodeKeepalive() {
  return Message(MessageType::kKeepalive, [](Writer&) {});
}

std::string EncodeFinal(const TransferResult& r) {
  return Message(MessageType::kFinal, [&](Writer& w) {
    w.U32(static_cast<uint32_t>(r.samples.size()));
    for (const FinalSample& s : r.samples) {
      w.I32(s.token);
      w.F32(s.logprob);
      w.U32(s.finish_reason);
      w.U32(static_cast<uint32_t>(s.top_logprobs.size()));
      for (const FinalTopLogprob& top : s.top_logprobs) {
        w.I32(top.token_id);
        w.F32(top.logprob);
      }
    }
    w.U64(r.frames);
    w.U64(r.kv_bytes);
  });
}

absl::StatusOr<std::string> EncodeFramePrefix(const FrameHeader& h, uint64_t kv_bytes) {
  const uint64_t payload = FrameFieldsBytes(h.request_id.size()) + kv_bytes;
  if (payload > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV frame payload of ", payload, " bytes exceeds the u32 length field"));
  }
  std::string out(kHeaderBytes, '\0');
  PutHeader(MessageType::kFrame, static_cast<uint32_t>(payload), out.data());
  Writer w(&out);
  w.Str(h.request_id);
  w.U32(h.attempt);
  w.U32(h.layer);
  w.U32(h.token_start);
  w.U32(h.token_count);
  return out;
}

absl::StatusOr<std::string> EncodeFrame(const FrameHeader& header, const void* k, const void* v,
                                        size_t bytes_each) {
  absl::StatusOr<std::string> out = EncodeFramePrefix(header, 2 * uint64_t{bytes_each});
  if (!out.ok()) return out;
  out->append(static_cast<const char*>(k), bytes_each);
  out->append(static_cast<const char*>(v), bytes_each);
  return out;
}

namespace {
bool ReadHelloAuth(Reader& r, Hello* h) {
  HelloAuth a;
  if (!(r.U64("auth_ts_ms", &a.ts_ms) && r.Str("auth_nonce", &a.nonce) &&
        r.Str("auth_sig", &a.sig))) {
    return false;
  }
  h->auth = std::move(a);
  return true;
}
}  // namespace

absl::StatusOr<Hello> DecodeHello(absl::string_view payload, Hello* fields) {
  Reader r(payload, "HELLO");
  Hello local;
  Hello& h = fields != nullptr ? *fields : local;
  h = Hello{};
  // The version decides how the rest is laid out: check it before anything
  // else, and read nothing more from a version this build does not speak.
  if (!r.U32("protocol_version", &h.protocol_version)) return r.status();
  if (h.protocol_version != kKvProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat("KV protocol version ", h.protocol_version,
                                                      " is not supported (this worker speaks ",
                                                      kKvProtocolVersion, ")"));
  }
  KvLayout& l = h.layout;
  uint32_t dtype = 0;
  const bool read = r.Str("request_id", &h.request_id) && r.U32("attempt", &h.attempt) &&
                    r.Str("model_fingerprint", &l.model_fingerprint) &&
                    r.U32("n_layers", &l.n_layers) && r.U32("n_kv_heads", &l.n_kv_heads) &&
                    r.U32("head_dim", &l.head_dim) && r.U32("kv_dtype", &dtype) &&
                    r.Str("bit_exact_class", &h.bit_exact_class) &&
                    r.Str("transport", &h.transport) &&
                    r.Str("transport_setup", &h.transport_setup, kMaxTransportSetupBytes) &&
                    (r.Rest().empty() || ReadHelloAuth(r, &h)) && r.End();
  // KvDtype has a fixed u32 underlying type, so any value is representable;
  // callers that get `fields` back see the raw number.
  l.dtype = static_cast<KvDtype>(dtype);
  if (!read) return r.status();
  if (!IsKnownKvDtype(dtype)) {
    return absl::FailedPreconditionError(absl::StrCat("unknown KV dtype ", dtype));
  }
  return h;
}

absl::StatusOr<Reject> DecodeReject(absl::string_view payload) {
  Reader r(payload, "REJECT");
  uint32_t code = 0;
  Reject out;
  if (!(r.U32("code", &code) && r.Str("reason", &out.reason) && r.End())) {
    return r.status();
  }
  // absl::StatusCode values 1..16 are the gRPC codes; anything else
  // (including OK, which a REJECT must not carry) becomes UNKNOWN.
  out.code =
      (code >= 1 && code <= 16) ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
  return out;
}

absl::StatusOr<FrameView> DecodeFrame(absl::string_view payload) {
  Reader r(payload, "FRAME");
  FrameView f;
  FrameHeader& h = f.header;
  if (!(r.Str("request_id", &h.request_id) && r.U32("attempt", &h.attempt) &&
        r.U32("layer", &h.layer) && r.U32("token_start", &h.token_start) &&
        r.U32("token_count", &h.token_count))) {
    return r.status();
  }
  f.kv = r.Rest();
  return f;
}

absl::StatusOr<FrameDescriptor> DecodeFrameDesc(absl::string_view payload) {
  Reader r(payload, "FRAME_DESC");
  FrameDescriptor f;
  if (r.Str("request_id", &f.request_id) && r.U32("attempt", &f.attempt) &&
      r.U32("layer", &f.layer) && r.U32("token_start", &f.token_start) &&
      r.U32("token_count", &f.token_count) && r.U64("comm_seq", &f.comm_seq) &&
      r.Str("locator", &f.locator, kMaxLocatorBytes) && r.End()) {
    return f;
  }
  return r.status();
}

namespace {
// An empty message (ACK, KEEPALIVE): DATA_LOSS naming it for any byte.
[[nodiscard]] absl::Status DecodeEmpty(absl::string_view payload, const char* name) {
  Reader r(payload, name);
  if (!r.End()) return r.status();
  return absl::OkStatus();
}
}  // namespace

absl::Status DecodeAck(absl::string_view payload) { return DecodeEmpty(payload, "ACK"); }

absl::Status DecodeKeepalive(absl::string_view payload) {
  return DecodeEmpty(payload, "KEEPALIVE");
}

absl::StatusOr<TransferResult> DecodeFinal(absl::string_view payload) {
  Reader r(payload, "FINAL");
  TransferResult t;
  uint32_t n_samples = 0;
  if (!r.Count("n_samples", 1, kMaxFinalSamples, &n_samples)) return r.status();
  t.samples.resize(n_samples);
  for (uint32_t i = 0; i < n_samples; ++i) {
    FinalSample& s = t.samples[i];
    const std::string field = absl::StrCat("samples[", i, "].");
    uint32_t n_top = 0;
    if (!(r.I32(absl::StrCat(field, "token"), &s.token) &&
          r.F32(absl::StrCat(field, "logprob"), &s.logprob) &&
          r.U32(absl::StrCat(field, "finish_reason"), &s.finish_reason) &&
          r.Count(absl::StrCat(field, "n_top"), 0, kMaxFinalTopLogprobs, &n_top))) {
      return r.status();
    }
    s.top_logprobs.resize(n_top);
    for (uint32_t j = 0; j < n_top; ++j) {
      const std::string top = absl::StrCat(field, "top_logprobs[", j, "].");
      if (!(r.I32(absl::StrCat(top, "token_id"), &s.top_logprobs[j].token_id) &&
            r.F32(absl::StrCat(top, "logprob"), &s.top_logprobs[j].logprob))) {
        return r.status();
      }
    }
  }
  if (r.U64("frames", &t.frames) && r.U64("kv_bytes", &t.kv_bytes) && r.End()) {
    return t;
  }
  return r.status();
}

absl::Status DecodeAccept(absl::string_view payload, std::string* answer) {
  Reader r(payload, "ACCEPT");
  std::string local;
  std::string& a = answer != nullptr ? *answer : local;
  a.clear();
  if (!r.Rest().empty() && !r.Str("answer", &a)) return r.status();
  if (!r.End()) return r.status();
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer::wire
