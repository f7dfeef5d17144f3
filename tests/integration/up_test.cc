// `tandem up --prefill-workers 2 --decode-workers 2` with the real servers
// on stories260K (up_fixture.h): every worker registered under its name and
// healthy, Generate on both routes, a SIGKILLed decode worker reported by
// tandem up while the router keeps serving with the other one, and SIGTERM
// stopping every process.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/up_fixture.h"

namespace tandem::testing {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// The first `n` generated ids of `r` (all of them when fewer).
std::vector<int32_t> Prefix(const StreamResult& r, size_t n) {
  return std::vector<int32_t>(
      r.token_ids.begin(),
      r.token_ids.begin() + static_cast<ptrdiff_t>(std::min(n, r.token_ids.size())));
}

// A greedy request for golden case `g` on `route` returns g's strict ids.
void ExpectServes(v1::Generation::Stub& stub, const GoldenCase& g, v1::RouteOverride route,
                  StreamResult* out = nullptr) {
  StreamResult r = RunGenerate(stub, MakeRequest(g.prompt, kGoldenMaxTokens, route));
  ASSERT_TRUE(r.status.ok()) << g.name << ": " << r.status.error_message();
  EXPECT_EQ(r.route, RouteName(route)) << g.name;
  EXPECT_THAT(Prefix(r, g.strict_prefix_len), ElementsAreArray(g.StrictIds())) << g.name;
  if (out != nullptr) *out = r;
}

TEST(UpTest, TwoPrefillTwoDecodeWorkersSurviveADecodeWorkersDeath) {
  absl::StatusOr<std::unique_ptr<UpCluster>> started = UpCluster::Start(UpClusterOptions());
  ASSERT_TRUE(started.ok()) << started.status();
  UpCluster& cluster = **started;
  const std::vector<std::string> names = {"router", "prefill-0", "prefill-1", "decode-0",
                                          "decode-1"};
  ASSERT_EQ(cluster.processes().size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const cli::UpProcess& p = cluster.processes()[i];
    EXPECT_EQ(p.name, names[i]);
    EXPECT_GT(p.pid, 0) << p.name;
    EXPECT_FALSE(ProcessGone(p.pid)) << p.name;
    EXPECT_EQ(p.kv_endpoint.empty(), !absl::StartsWith(p.name, "decode-")) << p.name;
  }
  EXPECT_EQ(cluster.processes()[0].address, cluster.router_address());

  // `tandem status` (the router's order): each worker under its --name,
  // at the address in tandem up's table, healthy.
  ProcessResult status = RunProcess(
      {BinaryPath("tandem"), "status", "--router", cluster.router_address()}, absl::Seconds(20));
  ASSERT_TRUE(status.exited && status.exit_code == 0) << status.Describe();
  const std::vector<std::string> lines = Lines(status.out);
  ASSERT_EQ(lines.size(), names.size() + 1) << status.out;  // + the "cluster: ..." line
  EXPECT_EQ(lines.back(),
            "cluster: open (no cluster.secret_file: any host that reaches a worker port can "
            "register or call it)");
  for (size_t i = 1; i < names.size(); ++i) {
    const cli::UpProcess& p = cluster.processes()[i];
    const std::string head = absl::StrCat(p.name, " ", p.role, " ", p.address, " ");
    int found = 0;
    for (const std::string& line : lines) {
      if (!absl::StartsWith(line, head)) continue;
      ++found;
      EXPECT_THAT(line, HasSubstr(" ready healthy ")) << line;
    }
    EXPECT_EQ(found, 1) << head << " in:\n" << status.out;
  }

  // Both routes work: local (short prompt) and remote (a long one).
  ASSERT_NO_FATAL_FAILURE(
      ExpectServes(cluster.stub(), Golden("once_upon_a_time"), v1::ROUTE_LOCAL));
  ASSERT_NO_FATAL_FAILURE(
      ExpectServes(cluster.stub(), Golden("long_repeated_313tok"), v1::ROUTE_REMOTE));

  // SIGKILL decode-1: tandem up says so and keeps everything else running.
  const pid_t decode1 = cluster.pid("decode-1");
  ASSERT_EQ(kill(decode1, SIGKILL), 0);
  EXPECT_TRUE(cluster.WaitForStderr(
      absl::StrCat("tandem: decode-1 (pid ", decode1,
                   ") killed by SIGKILL (signal 9); still running: router, prefill-0, "
                   "prefill-1, decode-0\n"),
      absl::Seconds(10)));
  EXPECT_EQ(cluster.WaitForExit(absl::ZeroDuration()), std::nullopt) << "tandem up exited";
  for (const char* name : {"router", "prefill-0", "prefill-1", "decode-0"}) {
    EXPECT_FALSE(ProcessGone(cluster.pid(name))) << name;
  }
  // Once the router's registry has marked decode-1 unhealthy (its log line
  // in tandem up's stderr: GetStatus says unhealthy as soon as one direct
  // call fails, before routing changes), every request goes to decode-0.
  const ClusterOptions& o = UpClusterOptions().cluster;
  ASSERT_TRUE(cluster.WaitForStderr(
      absl::StrCat("worker decode-1 missed ", o.unhealthy_after_missed_polls, " polls"),
      absl::Milliseconds(o.poll_interval_ms * o.unhealthy_after_missed_polls + o.rpc_timeout_ms) +
          absl::Seconds(5)))
      << "the router never marked decode-1 unhealthy";
  for (int i = 0; i < 3; ++i) {
    StreamResult r;
    ASSERT_NO_FATAL_FAILURE(
        ExpectServes(cluster.stub(), Golden("once_upon_a_time"), v1::ROUTE_LOCAL, &r));
    EXPECT_EQ(r.decode_worker, "decode-0");
    ASSERT_NO_FATAL_FAILURE(
        ExpectServes(cluster.stub(), Golden("long_repeated_313tok"), v1::ROUTE_REMOTE, &r));
    EXPECT_EQ(r.decode_worker, "decode-0");
  }

  // SIGTERM to tandem up stops every child: no process is left.
  EXPECT_EQ(cluster.Stop(), "exited with status 0");
  for (const cli::UpProcess& p : cluster.processes()) {
    EXPECT_TRUE(ProcessGone(p.pid)) << p.name << " (pid " << p.pid << ") outlived tandem up";
  }
  EXPECT_THAT(cluster.Stderr(), HasSubstr("tandem: received SIGTERM, stopping the cluster\n"));
}

}  // namespace
}  // namespace tandem::testing
