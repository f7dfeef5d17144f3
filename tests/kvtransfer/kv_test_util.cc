#include "tests/kvtransfer/kv_test_util.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer::testing {
namespace {

std::vector<float> RandomBits(size_t n, std::mt19937* rng) {
  std::vector<float> out(n);
  for (float& f : out) {
    uint32_t bits = (*rng)();
    std::memcpy(&f, &bits, sizeof(f));
  }
  return out;
}

size_t RowIndex(uint32_t layer, uint32_t token, uint32_t prompt_len,
                uint32_t kv_dim) {
  return (size_t{layer} * prompt_len + token) * kv_dim;
}

}  // namespace

KvLayout TestLayout(uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim) {
  KvLayout l;
  l.model_fingerprint = "test-model-fp";
  l.n_layers = n_layers;
  l.n_kv_heads = n_kv_heads;
  l.head_dim = head_dim;
  l.dtype = "f32";
  l.rope_freq_base = 10000.0f;
  l.rope_dim = head_dim;
  l.rope_type = "norm";
  l.numerics_id = "test-build/x86_64/f32";
  return l;
}

RefKv::RefKv(const KvLayout& layout, uint32_t prompt_len, uint32_t seed)
    : kv_dim_(layout.kv_dim()), prompt_len_(prompt_len) {
  std::mt19937 rng(seed);
  const size_t n = size_t{layout.n_layers} * prompt_len * kv_dim_;
  k_ = RandomBits(n, &rng);
  v_ = RandomBits(n, &rng);
}

const float* RefKv::K(uint32_t layer, uint32_t token) const {
  return k_.data() + RowIndex(layer, token, prompt_len_, kv_dim_);
}

const float* RefKv::V(uint32_t layer, uint32_t token) const {
  return v_.data() + RowIndex(layer, token, prompt_len_, kv_dim_);
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
    : kv_dim_(layout.kv_dim()),
      prompt_len_(prompt_len),
      k_(size_t{layout.n_layers} * prompt_len * kv_dim_, 0.0f),
      v_(k_.size(), 0.0f) {}

void VectorKvWriter::WriteRows(uint32_t layer, uint32_t token_start,
                               uint32_t token_count, const float* k,
                               const float* v) {
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
  const size_t at = RowIndex(layer, token_start, prompt_len_, kv_dim_);
  const size_t n = size_t{token_count} * kv_dim_;
  std::memcpy(k_.data() + at, k, n * sizeof(float));
  std::memcpy(v_.data() + at, v, n * sizeof(float));
  absl::MutexLock l(&mu_);
  ++finished_;
}

const float* VectorKvWriter::K(uint32_t layer, uint32_t token) const {
  return k_.data() + RowIndex(layer, token, prompt_len_, kv_dim_);
}

const float* VectorKvWriter::V(uint32_t layer, uint32_t token) const {
  return v_.data() + RowIndex(layer, token, prompt_len_, kv_dim_);
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

void BlockPoolWriter::WriteRows(uint32_t layer, uint32_t token_start,
                                uint32_t token_count, const float* k,
                                const float* v) {
  kv::WriteKvRows(*pool_, table_, static_cast<int32_t>(layer),
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
  absl::Status s = Send(wire::EncodeHello({request_id, attempt, layout}));
  if (!s.ok()) return s;
  return ReadVerdict();
}

}  // namespace tandem::kvtransfer::testing
