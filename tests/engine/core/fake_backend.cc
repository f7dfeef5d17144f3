#include "tests/engine/core/fake_backend.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/sampling/sampling_view.h"

namespace tandem::core::testing {
namespace {

constexpr int32_t kKvHeads = 1;
constexpr int32_t kHeadDim = 2;  // a row is {token id, position}

uint64_t Fnv(std::span<const int32_t> tokens, uint64_t salt) {
  uint64_t h = 1469598103934665603ull ^ salt;
  for (int32_t t : tokens) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  return h;
}

}  // namespace

int32_t FakeNextToken(std::span<const int32_t> tokens) {
  return static_cast<int32_t>(Fnv(tokens, 0) % (kFakeVocab - 2)) + 2;
}

std::vector<int32_t> FakeGenerate(const std::vector<int32_t>& prompt, int32_t n) {
  std::vector<int32_t> tokens = prompt, out;
  for (int32_t i = 0; i < n; ++i) {
    tokens.push_back(FakeNextToken(tokens));
    out.push_back(tokens.back());
  }
  return out;
}

std::vector<int32_t> FakePrompt(int32_t n, int32_t seed) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back((seed * 11 + i * 7) % (kFakeVocab - 2) + 2);
  return p;
}

void EventLog::Add(std::string event) {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(event));
}

std::vector<std::string> EventLog::events() const {
  absl::MutexLock lock(&mu_);
  return events_;
}

FakeBackend::FakeBackend(int32_t block_size, int32_t num_blocks, int32_t context_length,
                         bool device_kv) {
  const kv::KvShape shape{kFakeLayers, kKvHeads, kHeadDim, block_size};
  if (device_kv) {
    storage_ = std::make_unique<HostDeviceKvStorage>(shape, num_blocks);
  } else {
    storage_ = std::make_unique<kv::CpuKvStorage>(shape, num_blocks);
  }
  config_.architecture = "fake";
  config_.context_length = context_length;
  config_.n_layers = kFakeLayers;
  config_.n_head = kKvHeads;
  config_.n_head_kv = kKvHeads;
  config_.head_dim = kHeadDim;
  config_.n_embd = kHeadDim;
  config_.vocab_size = kFakeVocab;
}

void FakeBackend::KvRow(int32_t token, int32_t pos, float* row) {
  row[0] = static_cast<float>(token);
  row[1] = static_cast<float>(pos);
}

void WriteFakeKv(kv::KvStorage& storage, const std::vector<int32_t>& table,
                 std::span<const int32_t> tokens, int32_t start, int32_t end) {
  for (int32_t layer = 0; layer < storage.shape().n_layers; ++layer) {
    for (int32_t t = start; t < end; ++t) {
      float row[kHeadDim];
      FakeBackend::KvRow(tokens[static_cast<size_t>(t)], t, row);
      kv::WriteKvRows(storage, table, layer, t, 1, row, row);
    }
  }
}

void FakeBackend::PauseNextForward() {
  absl::MutexLock lock(&gate_mu_);
  pause_next_ = true;
}

bool FakeBackend::WaitPaused(absl::Duration timeout) {
  absl::MutexLock lock(&gate_mu_);
  return gate_mu_.AwaitWithTimeout(absl::Condition(&paused_), timeout);
}

void FakeBackend::Resume() {
  absl::MutexLock lock(&gate_mu_);
  paused_ = false;
}

absl::Status FakeBackend::Forward(std::span<const backend::ForwardEntry> batch,
                                  const backend::LayerHook* hook,
                                  std::vector<sampling::SamplingView>* views) {
  {
    absl::MutexLock lock(&gate_mu_);
    if (pause_next_) {
      pause_next_ = false;
      paused_ = true;
      auto resumed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate_mu_) { return !paused_; };
      gate_mu_.Await(absl::Condition(&resumed));
    }
  }
  ++forward_calls_;
  for (int32_t layer = 0; layer < kFakeLayers; ++layer) {
    for (size_t e = 0; e < batch.size(); ++e) {
      const backend::ForwardEntry& entry = batch[e];
      const int32_t n = static_cast<int32_t>(entry.tokens.size());
      for (int32_t i = 0; i < n; ++i) {
        float row[kHeadDim];
        KvRow(entry.tokens[static_cast<size_t>(i)], entry.start_pos + i, row);
        kv::WriteKvRows(*storage_, *entry.block_table, layer, entry.start_pos + i, 1, row, row);
      }
      if (log_ != nullptr) log_->Add(absl::StrCat("compute L", layer, " E", e));
      if (hook != nullptr && *hook) (*hook)(e, layer, entry.start_pos, n);
    }
  }
  size_t num_views = 0;
  for (const backend::ForwardEntry& entry : batch) num_views += entry.sampling != nullptr;
  views->resize(num_views);
  size_t v = 0;
  for (const backend::ForwardEntry& entry : batch) {
    if (entry.sampling == nullptr) continue;
    // The sequence as the cache holds it (last layer), checked position by
    // position.
    const int32_t len = entry.start_pos + static_cast<int32_t>(entry.tokens.size());
    std::vector<int32_t> seq;
    bool corrupt = false;
    for (int32_t t = 0; t < len; ++t) {
      float k[kHeadDim], vrow[kHeadDim];
      kv::ReadKvRows(*storage_, *entry.block_table, kFakeLayers - 1, t, 1, k, vrow);
      corrupt |= k[1] != static_cast<float>(t) || std::memcmp(k, vrow, sizeof(k)) != 0;
      seq.push_back(static_cast<int32_t>(k[0]));
    }
    const int32_t next = corrupt ? kFakeCorruptKvToken : FakeNextToken(seq);
    std::vector<float> logits(kFakeVocab);
    for (int32_t i = 0; i < kFakeVocab; ++i) {
      logits[static_cast<size_t>(i)] =
          i == next ? 8.0f : static_cast<float>(Fnv(seq, static_cast<uint64_t>(i) + 1) % 100) / 50.0f;
    }
    sampling::BuildSamplingView(logits, *entry.sampling, entry.history, &(*views)[v++]);
  }
  return absl::OkStatus();
}

FakeLoader::FakeLoader(Options options) : options_(std::move(options)) {}

FakeLoader::~FakeLoader() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

absl::StatusOr<KvTarget> FakeLoader::StartLoad(const std::string& request_id, uint32_t attempt,
                                               int32_t hit_tokens, int32_t prompt_tokens,
                                               kv::KvStorage* storage,
                                               std::vector<int32_t> block_table, Done done) {
  if (!options_.start_error.ok()) return options_.start_error;
  {
    absl::MutexLock lock(&mu_);
    ++starts_;
    Load& l = loads_[request_id];
    l = Load{};
    l.request_id = request_id;
    l.attempt = attempt;
    l.hit_tokens = hit_tokens;
    l.prompt_tokens = prompt_tokens;
    l.storage = storage;
    l.block_table = std::move(block_table);
    l.done = std::move(done);
  }
  auto it = options_.complete_with.find(request_id);
  if (it != options_.complete_with.end()) {
    Complete(request_id, it->second, FakeNextToken(it->second));
  }
  KvTarget target;
  target.endpoint = "fake-receiver:1";
  target.request_id = request_id;
  target.hit_tokens = static_cast<uint32_t>(hit_tokens);
  target.attempt = attempt;
  return target;
}

FakeLoader::Done FakeLoader::TakeDone(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  Load& l = loads_.at(request_id);
  if (l.done_called) return nullptr;
  l.done_called = true;
  return std::move(l.done);
}

void FakeLoader::CancelLoad(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = loads_.find(request_id);
  if (it == loads_.end()) return;
  it->second.cancel_requested = true;
  if (options_.quiesce_on_cancel) {
    threads_.emplace_back([this, request_id] {
      absl::SleepFor(absl::Milliseconds(20));  // the transfer winds down
      if (Done done = TakeDone(request_id)) done(absl::CancelledError("load cancelled"), {});
    });
  }
}

uint32_t FakeLoader::loads_in_flight() const {
  absl::MutexLock lock(&mu_);
  uint32_t n = 0;
  for (const auto& [id, l] : loads_) n += l.done_called ? 0 : 1;
  return n;
}

bool FakeLoader::WaitStarted(const std::string& request_id, absl::Duration timeout,
                             uint32_t attempt) {
  absl::MutexLock lock(&mu_);
  auto started = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = loads_.find(request_id);
    return it != loads_.end() && it->second.attempt >= attempt;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&started), timeout);
}

void FakeLoader::Complete(const std::string& request_id, const std::vector<int32_t>& prompt,
                          int32_t first_token, FinishReason reason) {
  SampleStart start;
  start.token.token_id = first_token;
  start.finish_reason = reason;
  CompleteSamples(request_id, prompt, {start});
}

void FakeLoader::CompleteSamples(const std::string& request_id,
                                 const std::vector<int32_t>& prompt,
                                 std::vector<SampleStart> samples) {
  const Load l = load(request_id);
  WriteFakeKv(*l.storage, l.block_table, prompt, l.hit_tokens, l.prompt_tokens);
  RemotePrefillResult result;
  result.samples = std::move(samples);
  result.peer_bit_exact_class = "fake/v1";
  if (Done done = TakeDone(request_id)) done(absl::OkStatus(), result);
}

void FakeLoader::Fail(const std::string& request_id, const absl::Status& status) {
  if (Done done = TakeDone(request_id)) done(status, {});
}

FakeLoader::Load FakeLoader::load(const std::string& request_id) const {
  absl::MutexLock lock(&mu_);
  Load copy = loads_.at(request_id);
  copy.done = nullptr;
  return copy;
}

int FakeLoader::starts() const {
  absl::MutexLock lock(&mu_);
  return starts_;
}

bool FakeLoader::cancel_requested(const std::string& request_id) const {
  absl::MutexLock lock(&mu_);
  auto it = loads_.find(request_id);
  return it != loads_.end() && it->second.cancel_requested;
}

absl::Status FakeExport::Open(std::shared_ptr<const CancelFlag>, Wake wake) {
  absl::MutexLock lock(&mu_);
  ++opens_;
  wake_ = std::move(wake);
  return open_status_;
}

absl::StatusOr<bool> FakeExport::Ready() {
  absl::MutexLock lock(&mu_);
  ++ready_calls_;
  return room_;
}

std::optional<absl::Status> FakeExport::Result() {
  absl::MutexLock lock(&mu_);
  if (finishes_ == 0 || hold_result_) return std::nullopt;
  return result_;
}

void FakeExport::SetRoom(bool room) {
  absl::MutexLock lock(&mu_);
  room_ = room;
  if (wake_) wake_();
}

void FakeExport::FullAfterSends(int n) {
  absl::MutexLock lock(&mu_);
  full_after_ = static_cast<int>(sent_.size()) + n;
}

void FakeExport::HoldResult() {
  absl::MutexLock lock(&mu_);
  hold_result_ = true;
}

void FakeExport::ReleaseResult(absl::Status result) {
  absl::MutexLock lock(&mu_);
  hold_result_ = false;
  result_ = std::move(result);
  if (wake_) wake_();
}

int FakeExport::ready_calls() const {
  absl::MutexLock lock(&mu_);
  return ready_calls_;
}

absl::Status FakeExport::SendLayer(int32_t layer, int32_t token_start, int32_t count,
                                   const char* k, const char* v) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(sent_.size()) == fail_send_at_) {
    return absl::UnavailableError("fake export: link down");
  }
  Sent s{layer, token_start, count, {}, {}};
  const size_t floats = static_cast<size_t>(count) * kHeadDim;
  s.k.resize(floats);
  s.v.resize(floats);
  std::memcpy(s.k.data(), k, floats * sizeof(float));
  std::memcpy(s.v.data(), v, floats * sizeof(float));
  sent_.push_back(std::move(s));
  if (static_cast<int>(sent_.size()) == full_after_) room_ = false;
  bytes_ += 2 * floats * sizeof(float);
  return absl::OkStatus();
}

absl::Status FakeExport::Finish(const std::vector<SampleStart>& samples) {
  const sampling::SampledToken& first_token = samples.at(0).token;
  const FinishReason reason = samples.at(0).finish_reason;
  absl::MutexLock lock(&mu_);
  ++finishes_;
  token_ = first_token;
  reason_ = reason;
  samples_ = samples;
  return absl::OkStatus();
}

void FakeExport::Close() {
  absl::MutexLock lock(&mu_);
  ++closes_;
  wake_ = nullptr;  // the core may be gone after Close
}

uint64_t FakeExport::bytes_sent() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

std::vector<FakeExport::Sent> FakeExport::sent() const {
  absl::MutexLock lock(&mu_);
  return sent_;
}

int FakeExport::opens() const {
  absl::MutexLock lock(&mu_);
  return opens_;
}

int FakeExport::finishes() const {
  absl::MutexLock lock(&mu_);
  return finishes_;
}

int FakeExport::closes() const {
  absl::MutexLock lock(&mu_);
  return closes_;
}

sampling::SampledToken FakeExport::finished_token() const {
  absl::MutexLock lock(&mu_);
  return token_;
}

FinishReason FakeExport::finished_reason() const {
  absl::MutexLock lock(&mu_);
  return reason_;
}

std::vector<SampleStart> FakeExport::finished_samples() const {
  absl::MutexLock lock(&mu_);
  return samples_;
}

}  // namespace tandem::core::testing
