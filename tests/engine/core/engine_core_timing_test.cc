// The engine core's measurements (issue #34): the start-up warm-up seeds
// the step model without serving a step or keeping a block, every step
// feeds it, and each request reports its phases (RequestOutput::OnPhases)
// once, right before the first token of sample 0 this worker streams,
// with its placement.
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "engine/core/engine_core.h"
#include "gtest/gtest.h"
#include "tests/engine/core/core_harness.h"
#include "tests/engine/core/fake_backend.h"
#include "tests/engine/core/recording_sink.h"

namespace tandem::core {
namespace {

using testing::FakeGenerate;
using testing::FakeLoader;
using testing::FakePrompt;
using testing::Harness;
using testing::Options;
using testing::PhasesCall;
using testing::RecordingSink;

// Waits until the core's step model has at least `samples` samples.
bool WaitStepModel(EngineCore& core, uint64_t samples) {
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (absl::Now() < deadline) {
    if (core.GetStats().step_model.samples >= samples) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

TEST(EngineCoreTimingTest, WarmUpSeedsTheStepModelAndKeepsNothing) {
  EngineCoreOptions options = Options();
  options.warmup = true;
  Harness h(64, nullptr, options);
  // Seven shapes fit a 64-block pool of 4-token blocks; each runs twice
  // and is fitted once.
  ASSERT_TRUE(WaitStepModel(*h.core, 7));
  const CoreStats s = h.core->GetStats();
  EXPECT_EQ(s.step_model.samples, 7u);
  EXPECT_EQ(s.step_model.mean_abs_error_ms, 0.0);  // warm-up steps are not errors
  EXPECT_EQ(h.backend->forward_calls(), 14);
  EXPECT_EQ(s.engine_steps_total, 0u);  // no serving step
  EXPECT_EQ(s.kv_blocks_in_use, 0u);
  EXPECT_EQ(s.kv_blocks_cached, 0u);  // nothing published
  // And the core serves as before.
  auto sink = h.Submit("r", FakePrompt(20, 1), 5);
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_EQ(sink->token_ids(), FakeGenerate(FakePrompt(20, 1), 5));
}

TEST(EngineCoreTimingTest, EveryStepFeedsTheStepModel) {
  Harness h(64);
  auto sink = h.Submit("r", FakePrompt(20, 1), 6);
  ASSERT_TRUE(sink->WaitFinish());
  ASSERT_TRUE(h.WaitIdle());
  const CoreStats s = h.core->GetStats();
  EXPECT_GT(s.engine_steps_total, 0u);
  EXPECT_EQ(s.step_model.samples, s.engine_steps_total);
}

void ExpectNonNegative(const RequestPhases& p) {
  for (double v : {p.placement_ms, p.prefill_queue_ms, p.prefill_ms, p.kv_transfer_ms,
                   p.decode_admission_ms, p.first_decode_ms}) {
    EXPECT_GE(v, 0.0);
  }
}

TEST(EngineCoreTimingTest, LocalPrefillReportsPhasesBeforeTokenZero) {
  Harness h(64);
  const absl::Time before = absl::Now();
  auto sink = h.Submit("local", FakePrompt(20, 2), 4);
  ASSERT_TRUE(sink->WaitFinish());
  const double elapsed_ms = absl::ToDoubleMilliseconds(absl::Now() - before);
  const std::vector<PhasesCall> calls = sink->phases_calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].tokens_before, 0u);
  EXPECT_FALSE(calls[0].placement.remote);
  const RequestPhases& p = calls[0].phases;
  ExpectNonNegative(p);
  EXPECT_EQ(p.kv_transfer_ms, 0.0);
  EXPECT_EQ(p.decode_admission_ms, 0.0);
  EXPECT_EQ(p.first_decode_ms, 0.0);
  EXPECT_LE(p.placement_ms + p.prefill_queue_ms + p.prefill_ms, elapsed_ms);
  // Threshold placement predicts nothing.
  EXPECT_EQ(calls[0].placement.ttft_local_ms, 0.0);
  EXPECT_EQ(calls[0].placement.ttft_remote_ms, 0.0);
}

TEST(EngineCoreTimingTest, RemotePrefillReportsTransferAndFirstDecodeBeforeTokenOne) {
  Harness h(64, std::make_unique<FakeLoader>());
  const std::vector<int32_t> prompt = FakePrompt(40, 3);  // 40 > 32: remote
  auto sink = h.Submit("remote", prompt, 4);
  ASSERT_TRUE(h.loader->WaitStarted("remote"));
  const absl::Time started = absl::Now();  // after the load's start
  const std::vector<int32_t> ref = FakeGenerate(prompt, 4);
  const absl::Time completed = absl::Now();  // before its done
  h.loader->Complete("remote", prompt, ref[0]);
  ASSERT_TRUE(sink->WaitFinish());
  const std::vector<PhasesCall> calls = sink->phases_calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].tokens_before, 0u);  // before token 1, the first streamed here
  EXPECT_TRUE(calls[0].placement.remote);
  const RequestPhases& p = calls[0].phases;
  ExpectNonNegative(p);
  EXPECT_GE(p.kv_transfer_ms, absl::ToDoubleMilliseconds(completed - started));
  EXPECT_EQ(p.prefill_queue_ms, 0.0);
  EXPECT_EQ(p.prefill_ms, 0.0);
  EXPECT_EQ(sink->token_ids(), std::vector<int32_t>(ref.begin() + 1, ref.end()));
}

// placement slo: the prediction behind the decision reaches the output.
TEST(EngineCoreTimingTest, SloPlacementReportsItsPredictions) {
  EngineCoreOptions options = Options();
  options.warmup = true;
  options.scheduler.placement = scheduler::PlacementPolicy::kSlo;
  options.scheduler.slo_ttft_ms = 1000;
  Harness h(64, std::make_unique<FakeLoader>(), options);
  ASSERT_TRUE(WaitStepModel(*h.core, 1));
  auto sink = std::make_shared<RecordingSink>();
  EngineRequest r;
  r.request_id = "slo";
  r.prompt = FakePrompt(40, 4);  // over the 32-token threshold
  r.max_tokens = 3;
  r.output = sink;
  // P would need 800 ms; the fake backend computes in microseconds.
  r.remote_estimate = scheduler::RemotePrefillEstimate{"prefill-0", 300, 500};
  ASSERT_TRUE(h.core->Submit(std::move(r)).ok());
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_FALSE(sink->need_remote_prefill().has_value());
  const std::vector<PhasesCall> calls = sink->phases_calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_FALSE(calls[0].placement.remote);
  EXPECT_DOUBLE_EQ(calls[0].placement.ttft_remote_ms, 800);
  EXPECT_LT(calls[0].placement.ttft_local_ms, 800);
  EXPECT_EQ(sink->token_ids(), FakeGenerate(FakePrompt(40, 4), 3));
}

}  // namespace
}  // namespace tandem::core
