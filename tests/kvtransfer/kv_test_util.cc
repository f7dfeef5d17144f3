#include "tests/kvtransfer/kv_test_util.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer::testing {
namespace {

std::vector<char> RandomBytes(size_t n, std::mt19937* rng) {
  std::vector<char> out(n);
  for (size_t i = 0; i < n; i += 4) {
    const uint32_t bits = (*rng)();
    std::memcpy(out.data() + i, &bits, std::min<size_t>(4, n - i));
  }
  return out;
}

// A random finite float: random bits, with an all-ones exponent (inf,
// NaN) turned into 0xfe.
float RandomFiniteFloat(std::mt19937* rng) {
  uint32_t bits = (*rng)();
  if ((bits & 0x7f800000u) == 0x7f800000u) bits &= ~0x00800000u;
  return std::bit_cast<float>(bits);
}

// "" when a and b have the same bits, else "<field>: got bits 0x.., want 0x..".
std::string FloatDiff(const std::string& field, float got, float want) {
  const uint32_t g = std::bit_cast<uint32_t>(got);
  const uint32_t w = std::bit_cast<uint32_t>(want);
  if (g == w) return "";
  return absl::StrCat(field, ": got bits 0x", absl::Hex(g), " (", got,
                      "), want 0x", absl::Hex(w), " (", want, ")");
}

template <typename T>
std::string IntDiff(const std::string& field, T got, T want) {
  if (got == want) return "";
  return absl::StrCat(field, ": got ", got, ", want ", want);
}

size_t RowOffset(uint32_t layer, uint32_t token, uint32_t prompt_len,
                 uint64_t row_bytes) {
  return (size_t{layer} * prompt_len + token) * row_bytes;
}

}  // namespace

std::vector<FinalSample> OneSample(int32_t token, float logprob,
                                   uint32_t finish_reason) {
  FinalSample s;
  s.token = token;
  s.logprob = logprob;
  s.finish_reason = finish_reason;
  return {s};
}

std::vector<FinalSample> RandomSamples(const std::vector<uint32_t>& n_tops,
                                       uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<FinalSample> out(n_tops.size());
  for (size_t i = 0; i < n_tops.size(); ++i) {
    FinalSample& s = out[i];
    s.token = static_cast<int32_t>(rng());
    s.logprob = RandomFiniteFloat(&rng);
    s.finish_reason = rng();
    s.top_logprobs.resize(n_tops[i]);
    for (FinalTopLogprob& top : s.top_logprobs) {
      top.token_id = static_cast<int32_t>(rng());
      top.logprob = RandomFiniteFloat(&rng);
    }
  }
  return out;
}

::testing::AssertionResult SameSamples(const std::vector<FinalSample>& got,
                                       const std::vector<FinalSample>& want) {
  std::string diff = IntDiff("samples.size()", got.size(), want.size());
  for (size_t i = 0; diff.empty() && i < want.size(); ++i) {
    const FinalSample& g = got[i];
    const FinalSample& w = want[i];
    const std::string f = absl::StrCat("samples[", i, "].");
    diff = IntDiff(f + "token", g.token, w.token);
    if (diff.empty()) diff = FloatDiff(f + "logprob", g.logprob, w.logprob);
    if (diff.empty()) {
      diff = IntDiff(f + "finish_reason", g.finish_reason, w.finish_reason);
    }
    if (diff.empty()) {
      diff = IntDiff(f + "top_logprobs.size()", g.top_logprobs.size(),
                     w.top_logprobs.size());
    }
    for (size_t j = 0; diff.empty() && j < w.top_logprobs.size(); ++j) {
      const std::string t = absl::StrCat(f, "top_logprobs[", j, "].");
      diff = IntDiff(t + "token_id", g.top_logprobs[j].token_id,
                     w.top_logprobs[j].token_id);
      if (diff.empty()) {
        diff = FloatDiff(t + "logprob", g.top_logprobs[j].logprob,
                         w.top_logprobs[j].logprob);
      }
    }
  }
  if (diff.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << diff;
}

KvLayout TestLayout(uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim,
                    KvDtype dtype) {
  KvLayout l;
  l.model_fingerprint = "test-model-fp";
  l.n_layers = n_layers;
  l.n_kv_heads = n_kv_heads;
  l.head_dim = head_dim;
  l.dtype = dtype;
  return l;
}

RefKv::RefKv(const KvLayout& layout, uint32_t prompt_len, uint32_t seed)
    : row_bytes_(layout.RowBytes()), prompt_len_(prompt_len) {
  std::mt19937 rng(seed);
  const size_t n = size_t{layout.n_layers} * prompt_len * row_bytes_;
  k_ = RandomBytes(n, &rng);
  v_ = RandomBytes(n, &rng);
}

const char* RefKv::K(uint32_t layer, uint32_t token) const {
  return k_.data() + RowOffset(layer, token, prompt_len_, row_bytes_);
}

const char* RefKv::V(uint32_t layer, uint32_t token) const {
  return v_.data() + RowOffset(layer, token, prompt_len_, row_bytes_);
}

absl::Status SendRange(KvSender& sender, const RefKv& ref, uint32_t n_layers,
                       uint32_t start, uint32_t end, uint32_t chunk) {
  for (uint32_t s = start; s < end; s += chunk) {
    const uint32_t count = std::min(chunk, end - s);
    for (uint32_t layer = 0; layer < n_layers; ++layer) {
      absl::Status st =
          sender.SendFrame(layer, s, count, ref.K(layer, s), ref.V(layer, s));
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

VectorKvWriter::VectorKvWriter(const KvLayout& layout, uint32_t prompt_len)
    : row_bytes_(layout.RowBytes()),
      prompt_len_(prompt_len),
      k_(size_t{layout.n_layers} * prompt_len * row_bytes_, 0),
      v_(k_.size(), 0) {}

void VectorKvWriter::WriteRows(uint32_t layer, uint32_t token_start,
                               uint32_t token_count, const char* k,
                               const char* v) {
  {
    absl::MutexLock l(&mu_);
    ++started_;
    if (gate_armed_) {
      blocked_ = true;
      mu_.Await(absl::Condition(
          +[](bool* armed) { return !*armed; }, &gate_armed_));
      blocked_ = false;
    }
  }
  const size_t at = RowOffset(layer, token_start, prompt_len_, row_bytes_);
  const size_t n = size_t{token_count} * row_bytes_;
  std::memcpy(k_.data() + at, k, n);
  std::memcpy(v_.data() + at, v, n);
  absl::MutexLock l(&mu_);
  ++finished_;
}

const char* VectorKvWriter::K(uint32_t layer, uint32_t token) const {
  return k_.data() + RowOffset(layer, token, prompt_len_, row_bytes_);
}

const char* VectorKvWriter::V(uint32_t layer, uint32_t token) const {
  return v_.data() + RowOffset(layer, token, prompt_len_, row_bytes_);
}

void VectorKvWriter::ArmGate() {
  absl::MutexLock l(&mu_);
  gate_armed_ = true;
}

bool VectorKvWriter::WaitBlocked(std::chrono::milliseconds timeout) {
  absl::MutexLock l(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&blocked_),
                              absl::FromChrono(timeout));
}

void VectorKvWriter::Release() {
  absl::MutexLock l(&mu_);
  gate_armed_ = false;
}

int VectorKvWriter::writes_started() const {
  absl::MutexLock l(&mu_);
  return started_;
}

int VectorKvWriter::writes_finished() const {
  absl::MutexLock l(&mu_);
  return finished_;
}

void StorageWriter::WriteRows(uint32_t layer, uint32_t token_start,
                              uint32_t token_count, const char* k,
                              const char* v) {
  pool_->WriteTokens(table_, static_cast<int32_t>(layer),
                     static_cast<int32_t>(token_start),
                     static_cast<int32_t>(token_count), k, v);
}

KvReceiver::DoneCallback DoneRecorder::Callback(std::function<void()> on_done) {
  return [this, on_done](absl::Status status, const TransferResult& result) {
    if (on_done) on_done();
    absl::MutexLock l(&mu_);
    ++calls_;
    status_ = status;
    result_ = result;
  };
}

bool DoneRecorder::Wait(std::chrono::milliseconds timeout) {
  absl::MutexLock l(&mu_);
  auto called = [](int* calls) { return *calls > 0; };
  return mu_.AwaitWithTimeout(absl::Condition(+called, &calls_),
                              absl::FromChrono(timeout));
}

int DoneRecorder::calls() const {
  absl::MutexLock l(&mu_);
  return calls_;
}

absl::Status DoneRecorder::status() const {
  absl::MutexLock l(&mu_);
  return status_;
}

TransferResult DoneRecorder::result() const {
  absl::MutexLock l(&mu_);
  return result_;
}

absl::StatusOr<RawPeer> RawPeer::Connect(int port) {
  absl::StatusOr<tcp::ScopedFd> fd = tcp::Connect(
      absl::StrCat("127.0.0.1:", port), tcp::DeadlineIn(3000));
  if (!fd.ok()) return fd.status();
  return RawPeer(std::move(*fd));
}

absl::Status RawPeer::Send(const std::string& bytes) {
  return tcp::SendAll(fd_.get(), bytes, tcp::DeadlineIn(3000));
}

absl::Status RawPeer::Read(uint32_t* type, std::string* payload,
                           std::chrono::milliseconds timeout) {
  return tcp::ReadMessage(fd_.get(), tcp::Clock::now() + timeout,
                          wire::kMaxControlPayload, type, payload);
}

absl::StatusOr<wire::Reject> RawPeer::ReadVerdict() {
  uint32_t type = 0;
  std::string payload;
  absl::Status s = Read(&type, &payload);
  if (!s.ok()) return s;
  if (type == static_cast<uint32_t>(wire::MessageType::kAccept)) {
    return wire::Reject{absl::StatusCode::kOk, ""};
  }
  if (type == static_cast<uint32_t>(wire::MessageType::kReject)) {
    return wire::DecodeReject(payload);
  }
  return absl::InternalError(
      absl::StrCat("unexpected reply ", wire::MessageTypeName(type)));
}

absl::StatusOr<wire::Reject> RawPeer::Hello(const std::string& request_id,
                                            uint32_t attempt,
                                            const KvLayout& layout) {
  wire::Hello hello;
  hello.request_id = request_id;
  hello.attempt = attempt;
  hello.layout = layout;
  hello.bit_exact_class = kTestBitExactClass;
  return Hello(hello);
}

absl::StatusOr<wire::Reject> RawPeer::Hello(const wire::Hello& hello) {
  absl::Status s = Send(wire::EncodeHello(hello));
  if (!s.ok()) return s;
  return ReadVerdict();
}

void ReceiverTest::Start(const KvLayout& layout, int handshake_ms, int transfer_ms,
                         std::function<void(std::string_view)> log) {
  layout_ = layout;
  KvReceiver::Options o;
  o.log = std::move(log);
  o.host = "127.0.0.1";
  o.port = 0;
  o.handshake_timeout_ms = handshake_ms;
  o.transfer_timeout_ms = transfer_ms;
  absl::StatusOr<std::unique_ptr<KvReceiver>> r = KvReceiver::Start(o, layout);
  ASSERT_TRUE(r.ok()) << r.status();
  receiver_ = std::move(*r);
  ASSERT_GT(receiver_->port(), 0);
}

std::string ReceiverTest::Endpoint() const {
  return absl::StrCat("127.0.0.1:", receiver_->port());
}

absl::StatusOr<std::unique_ptr<KvSender>> ReceiverTest::Connect(const std::string& id,
                                                                uint32_t attempt) {
  return KvSender::Connect(Endpoint(), id, attempt, layout_, kTestBitExactClass,
                           kSenderTimeoutMs);
}

}  // namespace tandem::kvtransfer::testing
