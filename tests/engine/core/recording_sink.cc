#include "tests/engine/core/recording_sink.h"

#include <atomic>
#include <utility>

namespace tandem::core::testing {
namespace {

std::atomic<uint64_t> next_seq{1};

bool HasKind(const std::vector<SinkEvent>& events, SinkEvent::Kind kind) {
  for (const SinkEvent& e : events) {
    if (e.kind == kind) return true;
  }
  return false;
}

}  // namespace

void RecordingSink::Record(SinkEvent event) {
  event.seq = next_seq.fetch_add(1);
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(event));
}

void RecordingSink::OnRemotePrefill(const KvTarget& target) {
  SinkEvent e;
  e.kind = SinkEvent::Kind::kNeedRemotePrefill;
  e.kv_endpoint = target.endpoint;
  e.hit_tokens = target.hit_tokens;
  e.attempt = target.attempt;
  Record(std::move(e));
}

void RecordingSink::OnPhases(const RequestPhases& phases, const PlacementReport& placement) {
  absl::MutexLock lock(&mu_);
  size_t tokens = 0;
  for (const SinkEvent& e : events_) tokens += e.kind == SinkEvent::Kind::kToken;
  phases_calls_.push_back(PhasesCall{phases, placement, tokens});
}

std::vector<PhasesCall> RecordingSink::phases_calls() const {
  absl::MutexLock lock(&mu_);
  return phases_calls_;
}

void RecordingSink::OnToken(uint32_t sample_index, uint32_t index,
                            const sampling::SampledToken& token,
                            uint32_t prompt_tokens_computed) {
  SinkEvent e;
  e.kind = SinkEvent::Kind::kToken;
  e.sample_index = sample_index;
  e.index = index;
  e.token_id = token.token_id;
  e.logprob = token.logprob;
  e.prompt_tokens_computed = prompt_tokens_computed;
  Record(std::move(e));
  absl::MutexLock lock(&mu_);
  if (gate_index_.has_value() && *gate_index_ == index) {
    gated_ = true;
    // Bounded so a test that forgets Release() cannot hang the engine.
    mu_.AwaitWithTimeout(absl::Condition(&released_), absl::Seconds(10));
  }
}

void RecordingSink::OnSampleFinish(uint32_t sample_index, FinishReason reason) {
  {
    absl::MutexLock lock(&mu_);
    last_sample_reason_ = reason;
  }
  SinkEvent e;
  e.kind = SinkEvent::Kind::kSampleFinish;
  e.sample_index = sample_index;
  e.reason = reason;
  Record(std::move(e));
}

void RecordingSink::OnFinish(const absl::Status& status) {
  std::function<void()> fn;
  FinishReason reason;
  {
    absl::MutexLock lock(&mu_);
    fn = on_finish_;
    reason = last_sample_reason_;
  }
  if (fn) fn();
  SinkEvent e;
  e.kind = SinkEvent::Kind::kFinish;
  e.status = status;
  e.reason = status.ok() ? reason : FinishReason::kNone;
  Record(std::move(e));
}

void RecordingSink::GateAtToken(uint32_t index) {
  absl::MutexLock lock(&mu_);
  gate_index_ = index;
}

bool RecordingSink::WaitGated(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&gated_), timeout);
}

void RecordingSink::Release() {
  absl::MutexLock lock(&mu_);
  released_ = true;
}

void RecordingSink::RunAtFinish(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  on_finish_ = std::move(fn);
}

bool RecordingSink::WaitFinish(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return HasKind(events_, SinkEvent::Kind::kFinish);
  };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

bool RecordingSink::WaitNeedRemotePrefill(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return HasKind(events_, SinkEvent::Kind::kNeedRemotePrefill) ||
           HasKind(events_, SinkEvent::Kind::kFinish);
  };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout) &&
         HasKind(events_, SinkEvent::Kind::kNeedRemotePrefill);
}

std::vector<SinkEvent> RecordingSink::events() const {
  absl::MutexLock lock(&mu_);
  return events_;
}

std::vector<int32_t> RecordingSink::token_ids() const {
  std::vector<int32_t> ids;
  for (const SinkEvent& e : events()) {
    if (e.kind == SinkEvent::Kind::kToken) ids.push_back(e.token_id);
  }
  return ids;
}

std::vector<int32_t> RecordingSink::sample_token_ids(uint32_t sample_index) const {
  std::vector<int32_t> ids;
  for (const SinkEvent& e : events()) {
    if (e.kind == SinkEvent::Kind::kToken && e.sample_index == sample_index) {
      ids.push_back(e.token_id);
    }
  }
  return ids;
}

std::optional<FinishReason> RecordingSink::sample_finish(uint32_t sample_index) const {
  for (const SinkEvent& e : events()) {
    if (e.kind == SinkEvent::Kind::kSampleFinish && e.sample_index == sample_index) {
      return e.reason;
    }
  }
  return std::nullopt;
}

std::vector<uint32_t> RecordingSink::token_indices() const {
  std::vector<uint32_t> indices;
  for (const SinkEvent& e : events()) {
    if (e.kind == SinkEvent::Kind::kToken) indices.push_back(e.index);
  }
  return indices;
}

std::optional<SinkEvent> RecordingSink::finish() const {
  for (const SinkEvent& e : events()) {
    if (e.kind == SinkEvent::Kind::kFinish) return e;
  }
  return std::nullopt;
}

std::optional<SinkEvent> RecordingSink::need_remote_prefill() const {
  for (const SinkEvent& e : events()) {
    if (e.kind == SinkEvent::Kind::kNeedRemotePrefill) return e;
  }
  return std::nullopt;
}

int RecordingSink::finish_calls() const {
  int n = 0;
  for (const SinkEvent& e : events()) n += e.kind == SinkEvent::Kind::kFinish ? 1 : 0;
  return n;
}

}  // namespace tandem::core::testing
