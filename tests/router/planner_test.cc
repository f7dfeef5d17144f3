// The role planner alone (router/planner.h, issue #35): its load and slo
// decisions on hand-made worker views, and the no-flapping rules of Tick
// (cooldown after start, between flips and after a manual change; one flip
// per cooldown under an oscillating load) with a fake clock and fake flips.
// The recent-request window it reads (router/recent_requests.h) too.
#include <prometheus/registry.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/planner.h"
#include "router/recent_requests.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

WorkerRegistry::WorkerView Worker(const std::string& name, v1::WorkerRole role, int running = 0,
                                  int64_t queued_prefill = 0, int kv_used = 0) {
  WorkerRegistry::WorkerView w;
  w.name = name;
  w.role = role;
  w.routable = true;
  w.status.set_running_requests(running);
  w.status.set_queued_prefill_tokens(queued_prefill);
  w.status.set_kv_blocks_in_use(kv_used);
  w.status.set_kv_blocks_total(1000);
  // A step model: 2 ms + 0.1 ms/prefill token, 0.5 ms/decode sequence,
  // 1 ms per 1k decode context tokens.
  v1::StepModel* m = w.status.mutable_step_model();
  m->set_samples(100);
  m->set_base_ms(2);
  m->set_prefill_ms_per_token(0.1);
  m->set_decode_ms_per_seq(0.5);
  m->set_decode_ms_per_kilo_context(1);
  return w;
}

PlannerOptions Options(PlannerMode mode, double cooldown_s = 10) {
  PlannerOptions o;
  o.config.mode = mode;
  o.config.interval_s = 1;
  o.config.cooldown_s = cooldown_s;
  o.config.min_prefill_workers = 0;
  o.config.min_decode_workers = 1;
  o.slo.ttft_ms = 500;
  o.slo.tpot_ms = 20;
  o.max_num_batched_tokens = 512;
  o.max_num_seqs = 10;
  o.log = [](const std::string&) {};
  return o;
}

// Prefill-heavy under load mode: P's queue is deep, D is idle.
PlannerInputs PrefillHeavy() {
  PlannerInputs in;
  in.workers = {Worker("d0", v1::ROLE_DECODE, 1), Worker("d1", v1::ROLE_DECODE, 0),
                Worker("p0", v1::ROLE_PREFILL, 2, 512 * 6)};
  return in;
}

// Decode-heavy: D's batch is full, P has nothing queued.
PlannerInputs DecodeHeavy() {
  PlannerInputs in;
  in.workers = {Worker("d0", v1::ROLE_DECODE, 9), Worker("p0", v1::ROLE_PREFILL, 0, 0),
                Worker("p1", v1::ROLE_PREFILL, 1, 10)};
  return in;
}

TEST(PlannerDecideTest, LoadModeMovesTheLeastBusyWorkerTowardThePressure) {
  PlannerDecision d = DecideByLoad(Options(PlannerMode::kLoad), PrefillHeavy());
  EXPECT_EQ(d.desired_prefill, 2);
  EXPECT_EQ(d.desired_decode, 1);
  EXPECT_EQ(d.flip_worker, "d1");  // fewer running than d0
  EXPECT_EQ(d.flip_to, v1::ROLE_PREFILL);
  EXPECT_THAT(d.reason, HasSubstr("prefill backlog 6.00 steps/worker"));

  d = DecideByLoad(Options(PlannerMode::kLoad), DecodeHeavy());
  EXPECT_EQ(d.desired_prefill, 1);
  EXPECT_EQ(d.flip_worker, "p0");
  EXPECT_EQ(d.flip_to, v1::ROLE_DECODE);
}

TEST(PlannerDecideTest, LoadModeHysteresisAndMinimums) {
  // Between the thresholds (backlog 2 steps, pressure 0.6): keep.
  PlannerInputs in;
  in.workers = {Worker("d0", v1::ROLE_DECODE, 6), Worker("p0", v1::ROLE_PREFILL, 0, 1024)};
  PlannerDecision d = DecideByLoad(Options(PlannerMode::kLoad), in);
  EXPECT_TRUE(d.flip_worker.empty()) << d.reason;
  EXPECT_EQ(d.desired_prefill, 1);
  // The last decode worker is never moved (min_decode_workers 1).
  in.workers = {Worker("d0", v1::ROLE_DECODE, 0), Worker("p0", v1::ROLE_PREFILL, 0, 512 * 10)};
  d = DecideByLoad(Options(PlannerMode::kLoad), in);
  EXPECT_TRUE(d.flip_worker.empty()) << d.reason;
  // min_prefill_workers 1 restores a prefill worker.
  PlannerOptions o = Options(PlannerMode::kLoad);
  o.config.min_prefill_workers = 1;
  in.workers = {Worker("d0", v1::ROLE_DECODE, 0), Worker("d1", v1::ROLE_DECODE, 3)};
  d = DecideByLoad(o, in);
  EXPECT_EQ(d.flip_worker, "d0");
  EXPECT_EQ(d.flip_to, v1::ROLE_PREFILL);
  // A worker out of routing is neither counted nor moved.
  in.workers[0].routable = false;
  d = DecideByLoad(o, in);
  EXPECT_TRUE(d.flip_worker.empty()) << d.reason;
}

TEST(PlannerDecideTest, SloModePicksTheSplitWithTheBestPredictedGoodput) {
  // Decode-heavy traffic: 4 req/s of 64-token prompts and 128 output
  // tokens on workers whose decode step costs 1.5 ms per sequence. One
  // decode worker: utilisation (1.5 + 0.128) ms x 4 x 128 = 0.83, TPOT =
  // 2 ms / 0.17 = 12 ms, over the 5 ms SLO; two: 0.42, 3.5 ms (prefill's
  // share 4 x 8.4 ms / 2 = 1.7% on top). The planner wants 0 + 2.
  PlannerInputs in;
  in.workers = {Worker("d0", v1::ROLE_DECODE, 8), Worker("p0", v1::ROLE_PREFILL)};
  for (auto& w : in.workers) w.status.mutable_step_model()->set_decode_ms_per_seq(1.5);
  in.load.count = 40;
  in.load.request_rate = 4;
  in.load.mean_uncached_prompt_tokens = 64;
  in.load.mean_output_tokens = 128;
  PlannerOptions o = Options(PlannerMode::kSlo);
  o.slo.tpot_ms = 5;
  PlannerDecision d = DecideBySlo(o, in);
  EXPECT_EQ(d.desired_prefill, 0) << d.reason;
  EXPECT_EQ(d.flip_worker, "p0");
  EXPECT_EQ(d.flip_to, v1::ROLE_DECODE);
  EXPECT_THAT(d.reason, HasSubstr("0+2: ttft"));
  // No load: keep, saying why.
  in.load = RecentLoad();
  d = DecideBySlo(o, in);
  EXPECT_TRUE(d.flip_worker.empty());
  EXPECT_THAT(d.reason, HasSubstr("no recent requests"));
}

// Tick under an oscillating load (prefill-heavy and decode-heavy every
// other second) for 60 s with a 10 s cooldown: no flip in the first
// cooldown, never two within one, at most one per cooldown.
TEST(PlannerTickTest, OscillatingLoadFlipsAtMostOncePerCooldown) {
  auto registry = std::make_shared<prometheus::Registry>();
  const absl::Time t0 = absl::FromUnixSeconds(1000000);
  int tick = 0;
  std::vector<absl::Time> flips;
  absl::Time now = t0;
  Planner planner(
      Options(PlannerMode::kLoad),
      [&](absl::Time) { return (tick % 2 == 0) ? PrefillHeavy() : DecodeHeavy(); },
      [&](const std::string&, v1::WorkerRole) {
        flips.push_back(now);
        return absl::OkStatus();
      },
      registry);
  for (tick = 0; tick < 60; ++tick) {
    now = t0 + absl::Seconds(tick);
    planner.Tick(now);
  }
  ASSERT_FALSE(flips.empty());
  EXPECT_GE(flips.front() - t0, absl::Seconds(10));
  for (size_t i = 1; i < flips.size(); ++i) {
    EXPECT_GE(flips[i] - flips[i - 1], absl::Seconds(10)) << i;
  }
  EXPECT_LE(flips.size(), 6u);
  EXPECT_EQ(planner.flips(), flips.size());
  const v1::PlannerStatus status = planner.Status();
  EXPECT_EQ(status.mode(), "load");
  EXPECT_EQ(status.role_changes_total(), flips.size());
  EXPECT_FALSE(status.last_decision().empty());
}

TEST(PlannerTickTest, ManualChangeAndFlipRolesFalseHoldFlips) {
  auto registry = std::make_shared<prometheus::Registry>();
  const absl::Time t0 = absl::FromUnixSeconds(2000000);
  int flips = 0;
  Planner planner(
      Options(PlannerMode::kLoad), [](absl::Time) { return PrefillHeavy(); },
      [&](const std::string&, v1::WorkerRole) {
        ++flips;
        return absl::OkStatus();
      },
      registry);
  planner.Tick(t0);  // starts the first cooldown
  planner.NoteManualChange(t0 + absl::Seconds(9));
  planner.Tick(t0 + absl::Seconds(12));  // past the start, within the manual change's
  EXPECT_EQ(flips, 0);
  EXPECT_THAT(planner.Status().last_decision(), HasSubstr("cooldown of the last role change"));
  planner.Tick(t0 + absl::Seconds(20));
  EXPECT_EQ(flips, 1);

  PlannerOptions o = Options(PlannerMode::kLoad);
  o.config.flip_roles = false;
  int held = 0;
  Planner exporter(
      o, [](absl::Time) { return PrefillHeavy(); },
      [&](const std::string&, v1::WorkerRole) {
        ++held;
        return absl::OkStatus();
      },
      std::make_shared<prometheus::Registry>());
  for (int i = 0; i < 30; ++i) exporter.Tick(t0 + absl::Seconds(i));
  EXPECT_EQ(held, 0);
  EXPECT_EQ(exporter.Status().desired_prefill_workers(), 2u);  // the wanted split is exported
  EXPECT_EQ(exporter.Status().desired_decode_workers(), 1u);
}

TEST(RecentRequestsTest, WindowRatesLengthsAndPercentiles) {
  RecentRequests recent;
  const absl::Time t0 = absl::FromUnixSeconds(3000000);
  for (int i = 0; i < 10; ++i) {
    FinishedRequest r;
    r.arrival = t0 + absl::Seconds(i);
    r.finished = t0 + absl::Seconds(i) + absl::Milliseconds(500);
    r.prompt_tokens = 100;
    r.cached_tokens = 20;
    r.output_tokens = 10;
    r.ttft_s = 0.1 * (i + 1);  // 0.1 .. 1.0
    r.tpot_s = 0.01;
    recent.Add(r);
  }
  // The last 5 s: requests 5..9 finished in (t0 + 4.6, t0 + 9.6].
  const RecentLoad load =
      recent.Window(t0 + absl::Seconds(9) + absl::Milliseconds(600), absl::Seconds(5), 0.85, 0);
  EXPECT_EQ(load.count, 5);
  EXPECT_DOUBLE_EQ(load.request_rate, 1.0);
  EXPECT_DOUBLE_EQ(load.mean_prompt_tokens, 100);
  EXPECT_DOUBLE_EQ(load.mean_uncached_prompt_tokens, 80);
  EXPECT_DOUBLE_EQ(load.mean_output_tokens, 10);
  EXPECT_NEAR(load.ttft_p90_s, 1.0, 1e-9);
  EXPECT_NEAR(load.tpot_p90_s, 0.01, 1e-12);
  EXPECT_NEAR(load.slo_attainment, 0.6, 1e-12);  // ttft 0.6, 0.7, 0.8 of 0.6..1.0 meet 0.85
  EXPECT_EQ(recent.Window(t0, absl::Seconds(5)).count, 0);
}

}  // namespace
}  // namespace tandem::router
