// The engine core's remote-prefill failover (retry, local, fail; the
// router's AbortRemotePrefill) and migration (a request that continues from
// tokens another decode worker generated). Expected tokens come from the
// fake model run alone (FakeGenerate), never from the core; a failed
// attempt leaves wrong K/V in the blocks, which the fake model would turn
// into kFakeCorruptKvToken if the core used it.
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
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
using testing::RecordingSink;
using testing::SinkEvent;

// The failover lines the core logs.
struct LogLines {
  absl::Mutex mu;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> Sink() {
    return [this](const std::string& line) {
      absl::MutexLock lock(&mu);
      lines.push_back(line);
    };
  }
  std::string Joined() {
    absl::MutexLock lock(&mu);
    std::string all;
    for (const std::string& l : lines) all += l + "\n";
    return all;
  }
};

EngineCoreOptions WithPolicy(PrefillFailurePolicy policy, LogLines* log,
                             int32_t max_attempts = 2) {
  EngineCoreOptions o = testing::Options();
  o.on_prefill_failure = policy;
  o.max_prefill_attempts = max_attempts;
  o.log = log->Sink();
  return o;
}

// Writes K/V of the wrong tokens into the load's blocks (a transfer that
// died half way), then fails it.
void FailAfterGarbage(FakeLoader* loader, const std::string& id, const absl::Status& status) {
  const FakeLoader::Load load = loader->load(id);
  const std::vector<int32_t> wrong = FakePrompt(load.prompt_tokens, 60);
  testing::WriteFakeKv(*load.storage, load.block_table, wrong, load.hit_tokens,
                       load.prompt_tokens);
  loader->Fail(id, status);
}

std::vector<uint32_t> Indices(uint32_t from, uint32_t to) {
  std::vector<uint32_t> v;
  for (uint32_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

std::vector<uint32_t> Attempts(const RecordingSink& sink) {
  std::vector<uint32_t> attempts;
  for (const SinkEvent& e : sink.events()) {
    if (e.kind == SinkEvent::Kind::kNeedRemotePrefill) attempts.push_back(e.attempt);
  }
  return attempts;
}

TEST(EngineCoreFailoverTest, RetryKeepsTheBlocksAndAsksForTheNextAttempt) {
  LogLines log;
  Harness h(64, std::make_unique<FakeLoader>(), WithPolicy(PrefillFailurePolicy::kRetry, &log));
  const std::vector<int32_t> prompt = FakePrompt(40, 1);
  const std::vector<int32_t> ref = FakeGenerate(prompt, 6);
  auto sink = h.Submit("r", prompt, 6);
  ASSERT_TRUE(h.loader->WaitStarted("r"));
  const std::vector<int32_t> table1 = h.loader->load("r").block_table;
  FailAfterGarbage(h.loader, "r", absl::DeadlineExceededError("P stalled"));
  ASSERT_TRUE(h.loader->WaitStarted("r", absl::Seconds(3), 2));
  const FakeLoader::Load second = h.loader->load("r");
  EXPECT_EQ(second.attempt, 2u);
  EXPECT_EQ(second.block_table, table1);  // the reservation is kept
  EXPECT_EQ(second.hit_tokens, 0);
  h.loader->Complete("r", prompt, ref[0]);
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->finish()->status.ok()) << sink->finish()->status;
  EXPECT_EQ(Attempts(*sink), (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(sink->token_ids(), std::vector<int32_t>(ref.begin() + 1, ref.end()));
  EXPECT_NE(log.Joined().find("request r: remote prefill attempt 1 failed"), std::string::npos);
  EXPECT_NE(log.Joined().find("P stalled; retrying (attempt 2)"), std::string::npos);
  ASSERT_TRUE(h.WaitIdle());
}

// Retries exhausted on route auto: the prompt is prefilled here rather than
// lost (issue #32: no request fails while a worker can still serve it).
TEST(EngineCoreFailoverTest, RetriesExhaustedPrefillHere) {
  LogLines log;
  Harness h(64, std::make_unique<FakeLoader>(), WithPolicy(PrefillFailurePolicy::kRetry, &log));
  const std::vector<int32_t> prompt = FakePrompt(40, 2);
  auto sink = h.Submit("r", prompt, 6);
  ASSERT_TRUE(h.loader->WaitStarted("r"));
  h.loader->Fail("r", absl::UnavailableError("connection reset"));
  ASSERT_TRUE(h.loader->WaitStarted("r", absl::Seconds(3), 2));
  h.loader->Fail("r", absl::UnavailableError("connection reset again"));
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->finish()->status.ok()) << sink->finish()->status;
  EXPECT_EQ(sink->token_ids(), FakeGenerate(prompt, 6));
  EXPECT_EQ(sink->token_indices(), Indices(0, 6));
  EXPECT_EQ(h.loader->starts(), 2);
  EXPECT_NE(log.Joined().find("request r: remote prefill attempt 2 failed: UNAVAILABLE: "
                              "connection reset again; kv.max_prefill_attempts (2) reached; "
                              "prefilling on this worker"),
            std::string::npos)
      << log.Joined();
  ASSERT_TRUE(h.WaitIdle());
}

// route_override REMOTE never prefills here: exhausted retries fail it.
TEST(EngineCoreFailoverTest, RetriesExhaustedFailARemoteOnlyRequest) {
  LogLines log;
  Harness h(64, std::make_unique<FakeLoader>(), WithPolicy(PrefillFailurePolicy::kRetry, &log));
  auto sink = h.Submit("r", FakePrompt(40, 2), 6, RouteChoice::kRemote);
  ASSERT_TRUE(h.loader->WaitStarted("r"));
  h.loader->Fail("r", absl::UnavailableError("connection reset"));
  ASSERT_TRUE(h.loader->WaitStarted("r", absl::Seconds(3), 2));
  h.loader->Fail("r", absl::UnavailableError("connection reset again"));
  ASSERT_TRUE(sink->WaitFinish());
  const absl::Status status = sink->finish()->status;
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(status.message(),
            "remote prefill failed (attempt 2): UNAVAILABLE: connection reset again; "
            "kv.max_prefill_attempts (2) reached; route_override REMOTE forbids a local "
            "prefill");
  EXPECT_EQ(h.loader->starts(), 2);
  ASSERT_TRUE(h.WaitIdle());
}

TEST(EngineCoreFailoverTest, LocalPolicyPrefillsHereOverTheFailedBytes) {
  LogLines log;
  Harness h(64, std::make_unique<FakeLoader>(), WithPolicy(PrefillFailurePolicy::kLocal, &log));
  const std::vector<int32_t> prompt = FakePrompt(40, 3);
  auto sink = h.Submit("l", prompt, 5);
  ASSERT_TRUE(h.loader->WaitStarted("l"));
  FailAfterGarbage(h.loader, "l", absl::DataLossError("bad frame"));
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->finish()->status.ok()) << sink->finish()->status;
  // Every token, index 0 included, comes from this worker's own prefill.
  EXPECT_EQ(sink->token_ids(), FakeGenerate(prompt, 5));
  EXPECT_EQ(sink->token_indices(), Indices(0, 5));
  EXPECT_EQ(sink->events()[1].prompt_tokens_computed, 40u);
  EXPECT_EQ(h.loader->starts(), 1);
  EXPECT_NE(log.Joined().find("bad frame; prefilling on this worker"), std::string::npos);
  ASSERT_TRUE(h.WaitIdle());
}

TEST(EngineCoreFailoverTest, RouterAbortCutsTheWaitShort) {
  FakeLoader::Options quiesce;
  quiesce.quiesce_on_cancel = true;  // CancelLoad -> done(CANCELLED)
  LogLines log;
  Harness h(64, std::make_unique<FakeLoader>(quiesce),
            WithPolicy(PrefillFailurePolicy::kRetry, &log));
  const std::vector<int32_t> prompt = FakePrompt(40, 4);
  const std::vector<int32_t> ref = FakeGenerate(prompt, 4);
  auto sink = h.Submit("a", prompt, 4);
  ASSERT_TRUE(h.loader->WaitStarted("a"));
  // An attempt that is not awaited is ignored.
  h.core->AbortRemotePrefill("a", 7, "stale", false);
  h.core->AbortRemotePrefill("nobody", 1, "unknown", false);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(h.loader->cancel_requested("a"));
  h.core->AbortRemotePrefill("a", 1, "Prefill on prefill-0: UNAVAILABLE: connection refused",
                             false);
  ASSERT_TRUE(h.loader->WaitStarted("a", absl::Seconds(3), 2));
  EXPECT_NE(log.Joined().find(
                "attempt 1 failed: Prefill on prefill-0: UNAVAILABLE: connection refused; "
                "retrying (attempt 2)"),
            std::string::npos);
  h.loader->Complete("a", prompt, ref[0]);
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->finish()->status.ok());
  EXPECT_EQ(sink->token_ids(), std::vector<int32_t>(ref.begin() + 1, ref.end()));
  ASSERT_TRUE(h.WaitIdle());
}

TEST(EngineCoreFailoverTest, NoPrefillWorkerPrefillsLocallyEvenUnderFail) {
  FakeLoader::Options quiesce;
  quiesce.quiesce_on_cancel = true;
  LogLines log;
  Harness h(64, std::make_unique<FakeLoader>(quiesce),
            WithPolicy(PrefillFailurePolicy::kFail, &log));
  const std::vector<int32_t> prompt = FakePrompt(40, 5);
  auto sink = h.Submit("n", prompt, 3);
  ASSERT_TRUE(h.loader->WaitStarted("n"));
  h.core->AbortRemotePrefill("n", 1, "no healthy prefill worker", true);
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->finish()->status.ok()) << sink->finish()->status;
  EXPECT_EQ(sink->token_ids(), FakeGenerate(prompt, 3));

  // An explicit REMOTE route is never prefilled here: it fails instead.
  auto remote = h.Submit("m", FakePrompt(40, 6), 3, RouteChoice::kRemote);
  ASSERT_TRUE(h.loader->WaitStarted("m"));
  h.core->AbortRemotePrefill("m", 1, "no healthy prefill worker", true);
  ASSERT_TRUE(remote->WaitFinish());
  EXPECT_EQ(remote->finish()->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(remote->finish()->status.message(),
            "remote prefill failed (attempt 1): no healthy prefill worker; "
            "route_override REMOTE forbids a local prefill");
  ASSERT_TRUE(h.WaitIdle());
}

TEST(EngineCoreFailoverTest, CancelDuringAFailedOverWaitStillFreesEverything) {
  LogLines log;
  Harness h(64, std::make_unique<FakeLoader>(), WithPolicy(PrefillFailurePolicy::kRetry, &log));
  auto sink = h.Submit("c", FakePrompt(40, 7), 6);
  ASSERT_TRUE(h.loader->WaitStarted("c"));
  h.loader->Fail("c", absl::DeadlineExceededError("stalled"));
  ASSERT_TRUE(h.loader->WaitStarted("c", absl::Seconds(3), 2));
  h.core->Cancel("c");
  absl::SleepFor(absl::Milliseconds(10));
  EXPECT_FALSE(sink->finish().has_value());  // attempt 2 may still write
  h.loader->Fail("c", absl::CancelledError("quiesced"));
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_EQ(sink->finish()->status.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(h.WaitIdle());
}

// Migration: the request continues at output index k from tokens another
// worker generated; the ids equal the undisturbed run's.
TEST(EngineCoreFailoverTest, MigratedRequestContinuesAtIndexK) {
  Harness h(64);
  const std::vector<int32_t> prompt = FakePrompt(20, 8);
  const std::vector<int32_t> ref = FakeGenerate(prompt, 9);
  auto sink = std::make_shared<RecordingSink>();
  EngineRequest r;
  r.request_id = "mig";
  r.prompt = prompt;
  r.generated.assign(ref.begin(), ref.begin() + 4);
  r.max_tokens = 9;  // counted from the original start: 5 more
  r.output = sink;
  ASSERT_TRUE(h.core->Submit(std::move(r)).ok());
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->finish()->status.ok());
  EXPECT_EQ(sink->token_indices(), Indices(4, 9));
  EXPECT_EQ(sink->token_ids(), std::vector<int32_t>(ref.begin() + 4, ref.end()));
  EXPECT_EQ(sink->finish()->reason, FinishReason::kLength);
  ASSERT_TRUE(h.WaitIdle());
}

TEST(EngineCoreFailoverTest, MigrationRefusesWhatCannotContinue) {
  Harness h(64, std::make_unique<FakeLoader>());
  auto submit = [&](std::vector<int32_t> generated, int64_t max_tokens, int64_t n,
                    RouteChoice route) {
    EngineRequest r;
    r.request_id = "bad";
    r.prompt = FakePrompt(8, 9);
    r.generated = std::move(generated);
    r.max_tokens = max_tokens;
    r.controls.n = n;
    r.route = route;
    r.output = std::make_shared<RecordingSink>();
    return h.core->Submit(std::move(r));
  };
  EXPECT_EQ(submit({5, 6}, 2, 1, RouteChoice::kAuto).message(),
            "generated_token_ids: 2 tokens leave nothing to generate under max_tokens 2");
  EXPECT_EQ(submit({5}, 4, 2, RouteChoice::kAuto).message(),
            "generated_token_ids: for n = 1 only (an n > 1 request migrates with "
            "migrated_samples), got n = 2");
  EXPECT_EQ(submit({5, 64}, 4, 1, RouteChoice::kAuto).message(),
            "generated_token_ids[1]: 64 is outside the vocabulary [0, 64)");
  EXPECT_EQ(submit({5}, 4, 1, RouteChoice::kRemote).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.core->GetStats().running_requests, 0u);
}

}  // namespace
}  // namespace tandem::core
