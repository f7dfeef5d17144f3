// Where TTFT goes (issue #34) through a real cluster: on the local and the
// remote route each sample's last message carries `placement`, whose
// decision names the route, and `timing`, whose phases are >= 0 and add up
// to ttft_ms within a millisecond (proto/tandem/v1/generation.proto,
// RequestTiming; router/request_timing.h). The workers' own reports
// (WorkerPhases) must arrive: D's placement and prefill queue on the local
// route, P's prefill queue and D's KV transfer and first decode step on
// the remote one.
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

using RequestTimingTest = DefaultClusterSuite;

// The phases on the first token's path.
double PathSum(const v1::RequestTiming& t) {
  return t.router_queue_ms() + t.placement_ms() + t.prefill_queue_ms() + t.prefill_ms();
}

// Sample `s`'s placement and timing on `route` ("local" / "remote").
void ExpectPlacementAndTiming(const SampleResult& s, const std::string& route) {
  ASSERT_TRUE(s.placement.has_value()) << "the sample's last message has no placement";
  EXPECT_EQ(s.placement->decision(), route);
  ASSERT_TRUE(s.timing.has_value()) << "the sample's last message has no timing";
  const v1::RequestTiming& t = *s.timing;
  const std::string all = t.ShortDebugString();
  for (double phase : {t.router_queue_ms(), t.placement_ms(), t.prefill_queue_ms(), t.prefill_ms(),
                       t.kv_transfer_ms(), t.decode_admission_ms(), t.first_decode_ms()}) {
    EXPECT_GE(phase, 0) << all;
  }
  EXPECT_GT(t.ttft_ms(), 0) << all;
  EXPECT_GE(t.e2e_ms(), t.ttft_ms()) << all;
  EXPECT_NEAR(PathSum(t), t.ttft_ms(), 1.0) << all;
  if (route == "local") {
    EXPECT_EQ(t.kv_transfer_ms(), 0) << all;
    EXPECT_EQ(t.decode_admission_ms(), 0) << all;
    EXPECT_EQ(t.first_decode_ms(), 0) << all;
    // Without D's WorkerPhases the router's prefill_ms would hold all of
    // the decode call.
    EXPECT_GT(t.placement_ms() + t.prefill_queue_ms(), 0)
        << "no placement_ms / prefill_queue_ms from the decode worker "
           "(DecodeGenerateResponse.phases with sample 0's first tokens): "
        << all;
  } else {
    EXPECT_GT(t.prefill_queue_ms(), 0)
        << "no prefill_queue_ms from the prefill worker (PrefillResponse.phases): " << all;
    EXPECT_GT(t.kv_transfer_ms(), 0)
        << "no kv_transfer_ms from the decode worker (DecodeGenerateResponse.phases): " << all;
    EXPECT_GT(t.first_decode_ms(), 0)
        << "no first_decode_ms from the decode worker (DecodeGenerateResponse.phases): " << all;
  }
}

// One greedy request for a golden prompt forced onto `route`, checked.
void ExpectRouteTiming(v1::Generation::Stub& stub, v1::RouteOverride route) {
  const GoldenCase& g = Golden("once_upon_a_time");
  StreamResult r = RunGenerate(stub, MakeRequest(g.prompt, 8, route));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.served_route, RouteName(route));
  ASSERT_EQ(r.samples.size(), 1u);
  ExpectPlacementAndTiming(r.samples[0], RouteName(route));
}

TEST_F(RequestTimingTest, LocalRoutePhasesAddUpToTtft) {
  ExpectRouteTiming(cluster().stub(), v1::ROUTE_LOCAL);
}

TEST_F(RequestTimingTest, RemoteRoutePhasesAddUpToTtft) {
  ExpectRouteTiming(cluster().stub(), v1::ROUTE_REMOTE);
}

TEST_F(RequestTimingTest, EverySampleCarriesTheRequestsPhases) {
  const GoldenCase& g = Golden("once_upon_a_time");
  for (v1::RouteOverride route : {v1::ROUTE_LOCAL, v1::ROUTE_REMOTE}) {
    v1::GenerateRequest request = MakeRequest(g.prompt, 8, route);
    SetSeededSampling(&request, 0.8f, 42);
    request.set_n(2);
    StreamResult r = RunGenerate(cluster().stub(), request);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.samples.size(), 2u);
    for (const SampleResult& s : r.samples) {
      ExpectPlacementAndTiming(s, RouteName(route));
    }
    ASSERT_TRUE(r.samples[0].timing.has_value() && r.samples[1].timing.has_value());
    // One first token per request; each sample ends on its own.
    const v1::RequestTiming& t0 = *r.samples[0].timing;
    const v1::RequestTiming& t1 = *r.samples[1].timing;
    EXPECT_EQ(t0.ttft_ms(), t1.ttft_ms());
    EXPECT_EQ(t0.router_queue_ms(), t1.router_queue_ms());
    EXPECT_EQ(t0.prefill_ms(), t1.prefill_ms());
  }
}

}  // namespace
}  // namespace tandem::testing
