// Workers that bind every interface and advertise another loopback
// address (127.0.0.2 standing in for a second host): the router reaches
// them at the advertised address, the prefill worker sends KV to the decode
// worker's advertised KV endpoint, and both routes serve the goldens
// (issue #12, item 1).
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

class AdvertiseTest : public ClusterSuite {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions options;
    options.worker_listen_host = "0.0.0.0";
    options.worker_advertise = "127.0.0.2";
    StartSuiteCluster(options);
  }
};

TEST_F(AdvertiseTest, WorkersAreReachedAtTheirAdvertisedAddress) {
  absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->can_serve());
  ASSERT_EQ(status->workers_size(), 2);
  for (const v1::WorkerStatus& w : status->workers()) {
    SCOPED_TRACE(w.name());
    EXPECT_TRUE(w.healthy());
    EXPECT_TRUE(absl::StartsWith(w.address(), "127.0.0.2:")) << w.address();
    if (w.role() == v1::ROLE_DECODE) {
      EXPECT_TRUE(absl::StartsWith(w.kv_endpoint(), "127.0.0.2:")) << w.kv_endpoint();
    }
  }
  for (const v1::RouteOverride route : {v1::ROUTE_LOCAL, v1::ROUTE_REMOTE}) {
    SCOPED_TRACE(RouteName(route));
    const GoldenCase& g = Golden("once_upon_a_time");
    const StreamResult r =
        RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens, route));
    ExpectGolden(r, g, RouteName(route));
  }
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
}

}  // namespace
}  // namespace tandem::testing
