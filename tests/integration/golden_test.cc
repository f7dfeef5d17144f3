// Golden outputs through the whole cluster: every case of
// stories260K_greedy.json on both routes, the conditional-disaggregation
// boundary under ROUTE_AUTO (max_local_prefill_tokens = 32), and seeded
// sampling that is repeatable and identical on both routes.
#include <ostream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

// The main suite's cluster, started once for the suites of this file.
using MainClusterTest = DefaultClusterSuite;

// ---- Every golden case, forced LOCAL and forced REMOTE ------------------------

struct RouteCase {
  std::string golden;
  v1::RouteOverride route;
};

// "once_upon_a_time_local": the test name suffix, and how gtest (and so
// ctest's test list) prints the parameter.
std::string RouteCaseName(const RouteCase& c) { return c.golden + "_" + RouteName(c.route); }
void PrintTo(const RouteCase& c, std::ostream* os) { *os << RouteCaseName(c); }

// Case names straight from the golden file, so a new case is covered too.
std::vector<RouteCase> AllRouteCases() {
  std::vector<RouteCase> cases;
  for (const GoldenCase& g : Goldens()) {
    cases.push_back({g.name, v1::ROUTE_LOCAL});
    cases.push_back({g.name, v1::ROUTE_REMOTE});
  }
  return cases;
}

class GoldenRouteTest : public MainClusterTest,
                        public ::testing::WithParamInterface<RouteCase> {};

TEST_P(GoldenRouteTest, ForcedRouteMatchesGolden) {
  const GoldenCase& g = Golden(GetParam().golden);
  StreamResult r = RunGenerate(cluster().stub(),
                               MakeRequest(g.prompt, kGoldenMaxTokens, GetParam().route));
  ExpectGolden(r, g, RouteName(GetParam().route));
}

INSTANTIATE_TEST_SUITE_P(Goldens, GoldenRouteTest, ::testing::ValuesIn(AllRouteCases()),
                         [](const ::testing::TestParamInfo<RouteCase>& info) {
                           return RouteCaseName(info.param);
                         });

// ---- ROUTE_AUTO at the boundary -------------------------------------------------

using AutoRouteTest = MainClusterTest;

TEST_F(AutoRouteTest, Prompt32TokensIsPrefilledLocally) {
  const GoldenCase& g = Golden("boundary_32tok");
  ASSERT_EQ(g.prompt_ids.size(), 32u);  // == max_local_prefill_tokens
  ExpectGolden(RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens)), g,
               "local");
}

TEST_F(AutoRouteTest, Prompt33TokensIsPrefilledRemotely) {
  const GoldenCase& g = Golden("boundary_33tok");
  ASSERT_EQ(g.prompt_ids.size(), 33u);  // one over max_local_prefill_tokens
  ExpectGolden(RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens)), g,
               "remote");
}

// ---- Seeded sampling ------------------------------------------------------------

// temperature 0.8, seed 1234: randomness for output index i is a pure
// function of (seed, i) (DESIGN.md, Sampling), so the ids depend on neither
// the attempt nor the route.
v1::GenerateRequest SeededRequest(const std::string& prompt, v1::RouteOverride route) {
  v1::GenerateRequest request = MakeRequest(prompt, kGoldenMaxTokens, route);
  request.mutable_sampling()->set_temperature(0.8f);
  request.mutable_sampling()->set_seed(1234);
  request.mutable_sampling()->set_has_seed(true);
  return request;
}

using SeededSamplingTest = MainClusterTest;

TEST_F(SeededSamplingTest, SameSeedGivesSameIdsTwice) {
  for (const char* name : {"once_upon_a_time", "long_repeated_313tok"}) {
    const GoldenCase& g = Golden(name);
    StreamResult first = RunGenerate(cluster().stub(), SeededRequest(g.prompt, v1::ROUTE_AUTO));
    StreamResult second = RunGenerate(cluster().stub(), SeededRequest(g.prompt, v1::ROUTE_AUTO));
    ASSERT_TRUE(first.status.ok()) << first.status.error_message();
    ASSERT_TRUE(second.status.ok()) << second.status.error_message();
    EXPECT_EQ(first.seed, 1234u);
    EXPECT_EQ(second.seed, 1234u);
    EXPECT_FALSE(first.token_ids.empty());
    EXPECT_EQ(first.token_ids, second.token_ids) << name;
    EXPECT_NE(first.request_id, second.request_id);
  }
}

TEST_F(SeededSamplingTest, LocalAndRemoteGiveSameIds) {
  for (const char* name : {"once_upon_a_time", "long_repeated_313tok"}) {
    const GoldenCase& g = Golden(name);
    StreamResult local = RunGenerate(cluster().stub(), SeededRequest(g.prompt, v1::ROUTE_LOCAL));
    StreamResult remote =
        RunGenerate(cluster().stub(), SeededRequest(g.prompt, v1::ROUTE_REMOTE));
    ASSERT_TRUE(local.status.ok()) << local.status.error_message();
    ASSERT_TRUE(remote.status.ok()) << remote.status.error_message();
    EXPECT_EQ(local.route, "local");
    EXPECT_EQ(remote.route, "remote");
    EXPECT_FALSE(local.token_ids.empty()) << name;
    EXPECT_EQ(local.token_ids, remote.token_ids) << name;
  }
}

}  // namespace
}  // namespace tandem::testing
