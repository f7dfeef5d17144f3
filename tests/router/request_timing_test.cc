// A request's RequestTiming and Placement (router/request_timing.h) from
// recorded marks and worker reports: the local and remote routes, clamping
// of reports the router's clock contradicts, the phases adding up to
// ttft_ms, and which decode stream's report counts after a retry or a
// migration. Expected values are worked out by hand from the rules in the
// header (and proto/tandem/v1/generation.proto's RequestTiming).
#include "router/request_timing.h"

#include <chrono>
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using Clock = RequestTimingRecorder::Clock;

// The phases on the first token's path.
double PathSum(const v1::RequestTiming& t) {
  return t.router_queue_ms() + t.placement_ms() + t.prefill_queue_ms() + t.prefill_ms();
}

// Every field of `t`, in RequestTiming's order: ttft, e2e, router_queue,
// placement, prefill_queue, prefill, kv_transfer, decode_admission,
// first_decode.
std::vector<double> Fields(const v1::RequestTiming& t) {
  return {t.ttft_ms(),          t.e2e_ms(),     t.router_queue_ms(), t.placement_ms(),
          t.prefill_queue_ms(), t.prefill_ms(), t.kv_transfer_ms(),  t.decode_admission_ms(),
          t.first_decode_ms()};
}

// Fields() equal to `want` up to rounding (times made of steady-clock
// durations are not exact in ms).
void ExpectFields(const v1::RequestTiming& t, const std::vector<double>& want) {
  EXPECT_THAT(Fields(t), ::testing::Pointwise(::testing::DoubleNear(1e-9), want))
      << t.ShortDebugString();
}

RequestMarks Marks(double decode_call, std::optional<double> prefill_call, double first_token,
                   double last_message) {
  RequestMarks m;
  m.decode_call_ms = decode_call;
  m.prefill_call_ms = prefill_call;
  m.first_token_ms = first_token;
  m.last_message_ms = last_message;
  return m;
}

v1::WorkerPhases Phases(double placement, double prefill_queue, double prefill, double kv = 0,
                        double admission = 0, double first_decode = 0) {
  v1::WorkerPhases p;
  p.set_placement_ms(placement);
  p.set_prefill_queue_ms(prefill_queue);
  p.set_prefill_ms(prefill);
  p.set_kv_transfer_ms(kv);
  p.set_decode_admission_ms(admission);
  p.set_first_decode_ms(first_decode);
  return p;
}

TEST(AssembleRequestTimingTest, LocalSplitsTheDecodeCallWithDsReport) {
  // D: 1 ms to decide, 3 ms queued; its own prefill_ms (5) is not used:
  // the router's prefill_ms, (12 - 2) - 1 - 3, also holds the RPC transits.
  ExpectFields(AssembleRequestTiming(Marks(2, std::nullopt, 12, 30), Phases(1, 3, 5), {}),
               {12, 30, 2, 1, 3, 6, 0, 0, 0});
}

TEST(AssembleRequestTimingTest, LocalIgnoresDsRemoteOnlyPhases) {
  // prefill: (4 - 1) - 0.5 - 0.5.
  ExpectFields(
      AssembleRequestTiming(Marks(1, std::nullopt, 4, 4), Phases(0.5, 0.5, 1, 9, 9, 9), {}),
      {4, 4, 1, 0.5, 0.5, 2, 0, 0, 0});
}

TEST(AssembleRequestTimingTest, RemoteTakesPlacementFromTheRouterAndQueueFromP) {
  // D's placement_ms (0.5) is inside the router's 5 - 2 = 3 ms; P queued
  // 4 ms; prefill: (20 - 5) - 4; D's KV transfer, admission and first
  // decode follow token 0.
  ExpectFields(
      AssembleRequestTiming(Marks(2, 5, 20, 50), Phases(0.5, 0, 0, 3, 1, 2), Phases(0, 4, 7)),
      {20, 50, 2, 3, 4, 11, 3, 1, 2});
}

TEST(AssembleRequestTimingTest, LocalReportLongerThanTheCallIsShrunkLaterPhasesFirst) {
  // 3 ms between the decode call and the first token; D claims 2 + 4.
  ExpectFields(AssembleRequestTiming(Marks(2, std::nullopt, 5, 9), Phases(2, 4, 0), {}),
               {5, 9, 2, 2, 1, 0, 0, 0, 0});
  // D's placement alone is longer than the call: it gets all 3 ms.
  ExpectFields(AssembleRequestTiming(Marks(2, std::nullopt, 5, 9), Phases(7, 4, 0), {}),
               {5, 9, 2, 3, 0, 0, 0, 0, 0});
}

TEST(AssembleRequestTimingTest, RemoteQueueLongerThanTheCallIsShrunk) {
  ExpectFields(AssembleRequestTiming(Marks(1, 3, 6, 6), {}, Phases(0, 10, 0)),
               {6, 6, 1, 2, 3, 0, 0, 0, 0});
}

TEST(AssembleRequestTimingTest, NegativeReportsAndMarksAreZero) {
  // The Prefill call's start before the decode call's (a path that
  // changed) and the last message before the first token (e2e is ttft).
  ExpectFields(
      AssembleRequestTiming(Marks(2, 1, 8, 7), Phases(0, 0, 0, -1, -2, -3), Phases(0, -4, 0)),
      {8, 8, 2, 0, 0, 6, 0, 0, 0});
}

TEST(AssembleRequestTimingTest, PhasesAddUpToTtftOnBothRoutes) {
  const v1::WorkerPhases d = Phases(0.0314159, 1.41421356, 9.9, 2.718281828, 0.577, 1.618);
  const v1::RequestTiming local =
      AssembleRequestTiming(Marks(0.123456789, std::nullopt, 37.000000123, 91.5), d, {});
  EXPECT_NEAR(PathSum(local), 37.000000123, 1e-6);
  const v1::RequestTiming remote = AssembleRequestTiming(
      Marks(0.123456789, 0.987654321, 37.000000123, 91.5), d, Phases(0, 3.33333333, 20));
  EXPECT_NEAR(PathSum(remote), 37.000000123, 1e-6);
  EXPECT_DOUBLE_EQ(remote.prefill_queue_ms(), 3.33333333);
}

TEST(PlacementOfTest, WithoutDsReportTheRouteDecidesAndPredictionsAreZero) {
  const v1::Placement local = PlacementOf(nullptr, false);
  EXPECT_EQ(local.decision(), "local");
  EXPECT_EQ(local.ttft_local_ms(), 0);
  EXPECT_EQ(local.ttft_remote_ms(), 0);
  EXPECT_EQ(PlacementOf(nullptr, true).decision(), "remote");
}

TEST(PlacementOfTest, KeepsDsPredictionsAndNamesWhereThePromptWasPrefilled) {
  v1::Placement d;
  d.set_decision("remote");
  d.set_ttft_local_ms(120);
  d.set_ttft_remote_ms(80);
  const v1::Placement remote = PlacementOf(&d, true);
  EXPECT_EQ(remote.decision(), "remote");
  EXPECT_EQ(remote.ttft_local_ms(), 120);
  EXPECT_EQ(remote.ttft_remote_ms(), 80);
  // D chose remote, the prefill failed and D prefilled itself.
  const v1::Placement fallback = PlacementOf(&d, false);
  EXPECT_EQ(fallback.decision(), "local");
  EXPECT_EQ(fallback.ttft_local_ms(), 120);
  EXPECT_EQ(fallback.ttft_remote_ms(), 80);
}

// Times on the recorder's clock, in ms after a fixed arrival.
class RequestTimingRecorderTest : public ::testing::Test {
 protected:
  Clock::time_point At(double ms) const {
    return arrival_ + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double, std::milli>(ms));
  }
  const Clock::time_point arrival_ = Clock::now();
  RequestTimingRecorder recorder_{arrival_};
};

TEST_F(RequestTimingRecorderTest, LocalRoute) {
  recorder_.DecodeStarted(1, At(2));
  v1::WorkerPhases d = Phases(1, 3, 5);
  v1::Placement p;
  p.set_decision("local");
  p.set_ttft_local_ms(11);
  recorder_.DecodeReported(1, &d, &p);
  recorder_.TokenSent(At(12));
  recorder_.TokenSent(At(15));  // a later message: not the first token
  ExpectFields(recorder_.Timing(At(30)), {12, 30, 2, 1, 3, 6, 0, 0, 0});
  const v1::Placement placement = recorder_.Placement(false);
  EXPECT_EQ(placement.decision(), "local");
  EXPECT_EQ(placement.ttft_local_ms(), 11);
}

TEST_F(RequestTimingRecorderTest, RemoteRouteTakesDsReportAfterTheFirstToken) {
  recorder_.DecodeStarted(1, At(2));
  recorder_.PrefillDelivered(At(5), Phases(0, 4, 7));
  recorder_.TokenSent(At(20));
  // D's first tokens message (token 1) carries its phases.
  v1::WorkerPhases d = Phases(0.5, 0, 0, 3, 1, 2);
  recorder_.DecodeReported(1, &d, nullptr);
  ExpectFields(recorder_.Timing(At(50)), {20, 50, 2, 3, 4, 11, 3, 1, 2});
  EXPECT_EQ(recorder_.Placement(true).decision(), "remote");
  EXPECT_EQ(recorder_.Placement(true).ttft_remote_ms(), 0);  // D sent no placement
}

TEST_F(RequestTimingRecorderTest, StreamStartedBeforeTheFirstTokenReplacesThePath) {
  // The first decode stream got a prefill worker's token 0 but never sent
  // it (a rerouted request); the second prefills locally: prefill is
  // (16 - 10) - 1 - 2.
  recorder_.DecodeStarted(1, At(1));
  v1::WorkerPhases old = Phases(9, 9, 9);
  recorder_.DecodeReported(1, &old, nullptr);
  recorder_.PrefillDelivered(At(3), Phases(0, 2, 2));
  recorder_.DecodeStarted(2, At(10));
  v1::WorkerPhases d = Phases(1, 2, 0);
  recorder_.DecodeReported(2, &d, nullptr);
  recorder_.TokenSent(At(16));
  ExpectFields(recorder_.Timing(At(20)), {16, 20, 10, 1, 2, 3, 0, 0, 0});
}

TEST_F(RequestTimingRecorderTest, MigrationAfterTheFirstTokenChangesNothing) {
  recorder_.DecodeStarted(1, At(2));
  v1::WorkerPhases d = Phases(1, 3, 5);
  recorder_.DecodeReported(1, &d, nullptr);
  recorder_.TokenSent(At(12));
  // D died; the new stream prefills prompt + the tokens streamed so far.
  recorder_.DecodeStarted(2, At(40));
  v1::WorkerPhases migrated = Phases(4, 4, 4);
  v1::Placement p;
  p.set_decision("local");
  p.set_ttft_local_ms(99);
  recorder_.DecodeReported(2, &migrated, &p);
  ExpectFields(recorder_.Timing(At(60)), {12, 60, 2, 1, 3, 6, 0, 0, 0});
  EXPECT_EQ(recorder_.Placement(false).ttft_local_ms(), 0);
}

TEST_F(RequestTimingRecorderTest, NoTokenSentUsesTheLastMessageAsTheFirst) {
  recorder_.DecodeStarted(1, At(2));
  ExpectFields(recorder_.Timing(At(7)), {7, 7, 2, 0, 0, 5, 0, 0, 0});
}

}  // namespace
}  // namespace tandem::router
