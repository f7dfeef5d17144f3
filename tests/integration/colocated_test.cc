// Colocated mode (issue #17; docs/architecture.md, "Colocated mode"): a
// cluster with no prefill workers and conditional.max_local_prefill_tokens
// unbounded serves every golden case exactly, routes long prompts "local",
// shows no prefill worker in its status and refuses route_override REMOTE
// with UNAVAILABLE. Also: no prefill workers with a finite threshold (the
// router's fallback to local prefill), unbounded with prefill workers
// present (allowed, with a warning), and the shipped
// deploy/local/colocated.yaml under `tandem up`.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/cluster_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/http_client.h"
#include "tests/integration/up_fixture.h"

namespace tandem::testing {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// The golden cases longer than the default threshold of 32 tokens
// (stories260K_greedy.json: 313 and 33 tokens with BOS).
const std::vector<std::string> kLongCases = {"long_repeated_313tok", "boundary_33tok"};

// One decode worker (ExpectGolden checks responses name decode-0), no
// prefill workers, every prompt prefilled locally.
ClusterOptions ColocatedOptions() {
  ClusterOptions o;
  o.num_prefill_workers = 0;
  o.num_decode_workers = 1;
  o.max_local_prefill_tokens = kUnboundedLocalPrefillTokens;
  o.capture_stderr = true;
  return o;
}

class ColocatedTest : public ClusterSuite {
 protected:
  static void SetUpTestSuite() { StartSuiteCluster(ColocatedOptions()); }
};

TEST_F(ColocatedTest, ServesEveryGoldenCaseUnderRouteAuto) {
  ASSERT_FALSE(Goldens().empty());
  for (const GoldenCase& g : Goldens()) {
    SCOPED_TRACE(g.name);
    ExpectGolden(RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens)), g,
                 "local");
  }
}

TEST_F(ColocatedTest, PromptsOverTheDefaultThresholdArePrefilledLocally) {
  for (const std::string& name : kLongCases) {
    const GoldenCase& g = Golden(name);
    ASSERT_GT(g.prompt_ids.size(), 32u) << name;  // the default would send it remote
    const StreamResult r = RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens));
    ASSERT_TRUE(r.status.ok()) << name << ": " << r.status.error_message();
    EXPECT_EQ(r.route, "local") << name;
    EXPECT_EQ(r.prefill_worker, "") << name;
  }
}

TEST_F(ColocatedTest, StatusShowsNoPrefillWorker) {
  absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->can_serve());
  ASSERT_EQ(status->workers_size(), 1);
  EXPECT_EQ(status->workers(0).name(), LocalCluster::kDecodeName);
  EXPECT_EQ(status->workers(0).role(), v1::ROLE_DECODE);
  // The same through `tandem status`: the decode worker and no prefill line.
  ProcessResult cli = RunProcess(
      {BinaryPath("tandem"), "status", "--router", cluster().router_address()},
      absl::Seconds(20));
  ASSERT_TRUE(cli.exited && cli.exit_code == 0) << cli.Describe();
  EXPECT_THAT(cli.out, HasSubstr("decode-0 decode "));
  // No process line has the role prefill (a step model line may say "prefill").
  for (const std::string& line : Lines(cli.out)) {
    const std::vector<std::string> fields = absl::StrSplit(line, ' ');
    EXPECT_FALSE(fields.size() > 1 && fields[1] == "prefill") << cli.out;
  }
}

TEST_F(ColocatedTest, RouteRemoteFailsUnavailable) {
  const StreamResult r = RunGenerate(
      cluster().stub(),
      MakeRequest(Golden("once_upon_a_time").prompt, kGoldenMaxTokens, v1::ROUTE_REMOTE));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_EQ(r.status.error_message(), "route_override REMOTE: no healthy prefill worker");
  EXPECT_TRUE(r.token_ids.empty());
}

TEST_F(ColocatedTest, RouterLogsTheColocatedPlacement) {
  EXPECT_THAT(cluster().CapturedStderr(),
              HasSubstr("prefill placement: colocated (no prefill workers, "
                        "conditional.max_local_prefill_tokens unbounded: every prompt is "
                        "prefilled by its decode worker)"));
}

// ---- No prefill workers, a finite threshold: the router's fallback ----------------

// The router marks every ROUTE_AUTO request LOCAL while no prefill worker is
// routable (GenerateCall::StartDecode), so the decode worker never asks for
// a remote prefill: long prompts are served locally and exactly.
using ColocatedFiniteThresholdTest = OwnClusterTest;

TEST_F(ColocatedFiniteThresholdTest, LongPromptsFallBackToLocalPrefill) {
  ClusterOptions o = ColocatedOptions();
  o.max_local_prefill_tokens = 32;
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  for (const std::string& name : kLongCases) {
    SCOPED_TRACE(name);
    const GoldenCase& g = Golden(name);
    ExpectGolden(RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens)), g,
                 "local");
  }
  EXPECT_THAT(cluster().CapturedStderr(),
              HasSubstr("prefill placement: colocated while no prefill worker registers (none "
                        "in the config; conditional.max_local_prefill_tokens 32 applies to any "
                        "that does)"));
}

// ---- Unbounded with prefill workers: allowed, the router warns --------------------

// The one cluster where `unbounded` itself decides a long prompt's route
// (without prefill workers the router forces LOCAL anyway): with the
// default 32 the 313-token prompt would go remote (AutoRouteTest).
using ColocatedWithPrefillWorkerTest = OwnClusterTest;

TEST_F(ColocatedWithPrefillWorkerTest, PrefillWorkerGetsOnlyRouteRemote) {
  ClusterOptions o = ColocatedOptions();
  o.num_prefill_workers = 1;
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  EXPECT_THAT(cluster().CapturedStderr(),
              HasSubstr("warning: conditional.max_local_prefill_tokens is unbounded, so the 1 "
                        "prefill workers get only requests with route_override REMOTE"));
  const GoldenCase& g = Golden("long_repeated_313tok");
  ExpectGolden(RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens)), g,
               "local");
  ExpectGolden(
      RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_REMOTE)),
      g, "remote");
}

// ---- deploy/local/colocated.yaml under `tandem up` ---------------------------------

// The shipped file with its fixed ports (router 50051, HTTP 8000, metrics
// 9102/9103) made ephemeral, so the test runs beside anything else; the
// rest (no prefill workers, unbounded, two decode workers, HTTP) as shipped.
std::string ShippedColocatedYamlOnEphemeralPorts() {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/deploy/local/colocated.yaml");
  std::ostringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty()) << "cannot read deploy/local/colocated.yaml";
  return absl::StrReplaceAll(text.str(), {{"127.0.0.1:50051", "127.0.0.1:0"},
                                          {"127.0.0.1:8000", "127.0.0.1:0"},
                                          {"127.0.0.1:9102", "127.0.0.1:0"},
                                          {"127.0.0.1:9103", "127.0.0.1:0"}});
}

TEST(ColocatedUpTest, ShippedConfigServesTheGoldens) {
  UpClusterOptions options;
  options.prefill_workers = 0;
  options.decode_workers = 2;
  options.config_yaml = ShippedColocatedYamlOnEphemeralPorts();
  absl::StatusOr<std::unique_ptr<UpCluster>> started = UpCluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  UpCluster& up = **started;
  std::vector<std::string> names;
  for (const cli::UpProcess& p : up.processes()) names.push_back(p.name);
  EXPECT_THAT(names, ElementsAreArray({"router", "decode-0", "decode-1"}));
  ASSERT_FALSE(up.http_address().empty()) << "no HTTP line in tandem up's table";
  EXPECT_EQ(HttpCall(up.http_address(), "GET", "/health").status, 200);

  // Greedy, ROUTE_AUTO, every case: prefilled locally, llama.cpp's ids.
  for (const GoldenCase& g : Goldens()) {
    const StreamResult r = RunGenerate(up.stub(), MakeRequest(g.prompt, kGoldenMaxTokens));
    ASSERT_TRUE(r.status.ok()) << g.name << ": " << r.status.error_message();
    EXPECT_EQ(r.route, "local") << g.name;
    EXPECT_EQ(r.prefill_worker, "") << g.name;
    EXPECT_THAT(r.decode_worker, ::testing::AnyOf("decode-0", "decode-1")) << g.name;
    ASSERT_GE(r.token_ids.size(), g.strict_prefix_len) << g.name;
    EXPECT_THAT(std::vector<int32_t>(r.token_ids.begin(),
                                     r.token_ids.begin() +
                                         static_cast<ptrdiff_t>(g.strict_prefix_len)),
                ElementsAreArray(g.StrictIds()))
        << g.name;
  }
  EXPECT_EQ(up.Stop(), "exited with status 0");
}

}  // namespace
}  // namespace tandem::testing
