// The real tandem CLI (build/tandem) against the real cluster.
#include <signal.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

using ::testing::ElementsAreArray;

using CliTest = DefaultClusterSuite;

TEST_F(CliTest, StatusCheckIdleExitsZeroAfterRequests) {
  // Requests on both routes first; finished requests must leave nothing
  // held (no blocks, transfers or running requests).
  for (const char* name : {"once_upon_a_time", "long_repeated_313tok"}) {
    const GoldenCase& g = Golden(name);
    StreamResult r = RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens));
    ASSERT_TRUE(r.status.ok()) << name << ": " << r.status.error_message();
  }
  ProcessResult status = RunProcess(
      {BinaryPath("tandem"), "status", "--check-idle", "--router", cluster().router_address()},
      absl::Seconds(20));
  EXPECT_TRUE(status.exited && status.exit_code == 0) << status.Describe() << status.out;
}

// Issue #32: a SIGSTOPped worker does not answer the router's GetStatus;
// `tandem status --check-idle` must not read its missing numbers as idle
// (it showed "running=0 kv_blocks=0/0" and exited 0). It is unknown (exit
// 4, its line says unreachable) until the router drops it
// (router.drop_after_ms); then it no longer counts (exit 0).
TEST(CliStatusTest, CheckIdleCallsAStoppedWorkerUnknownUntilItIsDropped) {
  ClusterOptions o;
  o.num_decode_workers = 2;  // the cluster still serves without decode-1
  o.rpc_timeout_ms = 500;    // a GetStatus of the stopped worker gives up soon
  o.drop_after_ms = 2000;
  absl::StatusOr<std::unique_ptr<LocalCluster>> started = LocalCluster::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& cluster = **started;
  const std::vector<std::string> check = {BinaryPath("tandem"), "status", "--check-idle",
                                          "--router", cluster.router_address()};
  ProcessResult idle = RunProcess(check, absl::Seconds(20));
  ASSERT_TRUE(idle.exited && idle.exit_code == 0) << idle.Describe() << idle.out;

  const pid_t decode1 = cluster.worker_pid("decode-1");
  ASSERT_GT(decode1, 0);
  ASSERT_EQ(kill(decode1, SIGSTOP), 0);
  ASSERT_TRUE(WaitStopped(decode1, absl::Seconds(5)));
  ProcessResult unknown = RunProcess(check, absl::Seconds(20));
  EXPECT_TRUE(unknown.exited && unknown.exit_code == 4) << unknown.Describe() << unknown.out;
  EXPECT_THAT(unknown.out,
              ::testing::ContainsRegex("\ndecode-1 decode [0-9.:]+ unreachable unhealthy \\(no "
                                       "answer to the router's GetStatus: its load is "
                                       "unknown\\)\n"));
  EXPECT_EQ(unknown.err,
            "tandem: idle unknown: decode-1 did not answer the router (its KV blocks and "
            "requests are unknown)\n");

  // Dropped: no longer listed, no longer counted.
  ProcessResult last;
  EXPECT_TRUE(PollUntil(absl::Seconds(20), [&] {
    last = RunProcess(check, absl::Seconds(20));
    return last.exited && last.exit_code == 0;
  }, absl::Milliseconds(200))) << last.Describe() << last.out;
  EXPECT_THAT(last.out, ::testing::Not(::testing::HasSubstr("decode-1")));
  kill(decode1, SIGCONT);
}

// Issue #34: the router reports the config's slo (0: not set) and
// conditional.placement in GetModelInfo and GetStatus; `tandem status`
// prints them in one line, and --json as "slo" (null: not set) and
// "placement".
void ExpectObjectives(LocalCluster& cluster, double ttft_ms, double tpot_ms,
                      const std::string& placement, const std::string& line,
                      const std::string& json_slo) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetModelInfoResponse info;
  ASSERT_TRUE(cluster.stub().GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.slo().ttft_ms(), ttft_ms);
  EXPECT_EQ(info.slo().tpot_ms(), tpot_ms);
  EXPECT_EQ(info.placement(), placement);
  absl::StatusOr<v1::ClusterStatus> status = cluster.ClusterStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->slo().ttft_ms(), ttft_ms);
  EXPECT_EQ(status->slo().tpot_ms(), tpot_ms);
  EXPECT_EQ(status->placement(), placement);

  ProcessResult text = RunProcess(
      {BinaryPath("tandem"), "status", "--router", cluster.router_address()}, absl::Seconds(20));
  ASSERT_TRUE(text.exited && text.exit_code == 0) << text.Describe();
  EXPECT_THAT(text.out, ::testing::HasSubstr("\n" + line + "\ncluster: ")) << text.out;
  ProcessResult json = RunProcess(
      {BinaryPath("tandem"), "status", "--json", "--router", cluster.router_address()},
      absl::Seconds(20));
  ASSERT_TRUE(json.exited && json.exit_code == 0) << json.Describe();
  try {
    const nlohmann::json j = nlohmann::json::parse(json.out);
    EXPECT_EQ(j.at("slo").dump(), json_slo);
    EXPECT_EQ(j.at("placement").get<std::string>(), placement);
  } catch (const nlohmann::json::exception& e) {
    FAIL() << e.what() << " in: " << json.out;
  }
}

TEST_F(CliTest, NoSloMeansThresholdPlacement) {
  ExpectObjectives(cluster(), 0, 0, "threshold", "slo: none; placement: threshold",
                   R"({"tpot_ms":null,"ttft_ms":null})");
}

TEST(CliStatusTest, SloAndItsPlacementAreReported) {
  ClusterOptions o;
  o.slo_ttft_ms = 2000;
  o.slo_tpot_ms = 50;
  absl::StatusOr<std::unique_ptr<LocalCluster>> started = LocalCluster::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  ExpectObjectives(**started, 2000, 50, "slo", "slo: ttft 2000 ms, tpot 50 ms; placement: slo",
                   R"({"tpot_ms":50.0,"ttft_ms":2000.0})");
}

TEST_F(CliTest, GenerateJsonPrintsOneLineWithGoldenIds) {
  const GoldenCase& g = Golden("once_upon_a_time");
  ProcessResult run = RunProcess({BinaryPath("tandem"), "generate", "--json", "--max-tokens", "32",
                                  "--temperature", "0", "--router", cluster().router_address(),
                                  g.prompt},
                                 absl::Seconds(30));
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.Describe();
  const std::vector<std::string> lines = Lines(run.out);
  ASSERT_EQ(lines.size(), 1u) << run.out;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(lines[0]);
    EXPECT_EQ(j.at("route").get<std::string>(), "local");
    EXPECT_THAT(j.at("prompt_token_ids").get<std::vector<int32_t>>(),
                ElementsAreArray(g.prompt_ids));
    const std::vector<int32_t> ids = j.at("token_ids").get<std::vector<int32_t>>();
    ASSERT_GE(ids.size(), g.strict_prefix_len);
    EXPECT_LE(ids.size(), kGoldenMaxTokens);
    EXPECT_THAT(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(
                                                                    g.strict_prefix_len)),
                ElementsAreArray(g.StrictIds()));
  } catch (const nlohmann::json::exception& e) {
    FAIL() << e.what() << " in: " << lines[0];
  }
}

}  // namespace
}  // namespace tandem::testing
