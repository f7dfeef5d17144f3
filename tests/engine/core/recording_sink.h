// A core::RequestOutput for tests: records every event (thread-safe), lets
// the test wait for one with a timeout, and can hold the engine loop inside
// an OnToken call (a gate) so a test can act at an exact point of a
// request's life.
#ifndef TANDEM_TESTS_ENGINE_CORE_RECORDING_SINK_H_
#define TANDEM_TESTS_ENGINE_CORE_RECORDING_SINK_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/core/request.h"

namespace tandem::core::testing {

// One sink call. `seq` orders events across every sink of the process.
struct SinkEvent {
  enum class Kind { kNeedRemotePrefill, kToken, kSampleFinish, kFinish };
  Kind kind = Kind::kToken;
  uint64_t seq = 0;
  // kNeedRemotePrefill
  std::string kv_endpoint;
  uint32_t hit_tokens = 0;
  uint32_t attempt = 0;
  // kToken, kSampleFinish
  uint32_t sample_index = 0;
  // kToken
  uint32_t index = 0;
  int32_t token_id = -1;
  float logprob = 0.0f;
  uint32_t prompt_tokens_computed = 0;
  // kFinish
  absl::Status status;
  // kSampleFinish: the sample's; kFinish: the last OnSampleFinish's (kNone
  // when there was none, e.g. after an error).
  FinishReason reason = FinishReason::kNone;
};

// One OnPhases call and how many tokens had been streamed before it.
struct PhasesCall {
  RequestPhases phases;
  PlacementReport placement;
  size_t tokens_before = 0;
};

class RecordingSink : public RequestOutput {
 public:
  void OnPhases(const RequestPhases& phases, const PlacementReport& placement) override;
  void OnRemotePrefill(const KvTarget& target) override;
  void OnToken(uint32_t sample_index, uint32_t index, const sampling::SampledToken& token,
               uint32_t prompt_tokens_computed) override;
  void OnSampleFinish(uint32_t sample_index, FinishReason reason) override;
  void OnFinish(const absl::Status& status) override;

  // Makes the OnToken call with `index` block (on the engine loop thread)
  // until Release(). Set before the request is submitted.
  void GateAtToken(uint32_t index);
  // True once the gated Token call is blocked (within `timeout`).
  bool WaitGated(absl::Duration timeout = absl::Seconds(3));
  void Release();
  // Runs inside OnFinish (engine loop thread), before the event is recorded.
  void RunAtFinish(std::function<void()> fn);

  // True once OnFinish / OnRemotePrefill has been called (within `timeout`).
  bool WaitFinish(absl::Duration timeout = absl::Seconds(3));
  bool WaitNeedRemotePrefill(absl::Duration timeout = absl::Seconds(3));

  std::vector<SinkEvent> events() const;
  // Token events' ids and indices, in call order (every sample's).
  std::vector<int32_t> token_ids() const;
  // Sample `sample_index`'s token ids, in call order.
  std::vector<int32_t> sample_token_ids(uint32_t sample_index) const;
  // Sample `sample_index`'s finish reason (nullopt before OnSampleFinish).
  std::optional<FinishReason> sample_finish(uint32_t sample_index) const;
  std::vector<uint32_t> token_indices() const;
  // The Finish event (nullopt before it).
  std::optional<SinkEvent> finish() const;
  std::optional<SinkEvent> need_remote_prefill() const;
  int finish_calls() const;
  std::vector<PhasesCall> phases_calls() const;

 private:
  void Record(SinkEvent event);

  mutable absl::Mutex mu_;
  std::vector<SinkEvent> events_ ABSL_GUARDED_BY(mu_);
  std::vector<PhasesCall> phases_calls_ ABSL_GUARDED_BY(mu_);
  std::optional<uint32_t> gate_index_ ABSL_GUARDED_BY(mu_);
  bool gated_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_finish_ ABSL_GUARDED_BY(mu_);
  FinishReason last_sample_reason_ ABSL_GUARDED_BY(mu_) = FinishReason::kNone;
};

}  // namespace tandem::core::testing

#endif  // TANDEM_TESTS_ENGINE_CORE_RECORDING_SINK_H_
