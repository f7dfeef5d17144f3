// `tandem up --prefill-workers 2 --decode-workers 2` with the real servers
// on stories260K (up_fixture.h): every worker registered under its name and
// healthy, Generate on both routes, a SIGKILLed decode worker reported by
// tandem up while the router keeps serving with the other one, and SIGTERM
// stopping every process. Then two clusters from deploy/local/cluster.yaml
// side by side, the second with --ephemeral-ports.
#include <signal.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/http_client.h"
#include "tests/integration/up_fixture.h"
#include "tests/test_util.h"

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
    // Every worker has a KV receiver (a prefill worker may become a decode
    // worker at run time); the router has none.
    EXPECT_EQ(p.kv_endpoint.empty(), p.name == "router") << p.name;
  }
  EXPECT_EQ(cluster.processes()[0].address, cluster.router_address());

  // `tandem status` (the router's order): each worker under its --name,
  // at the address in tandem up's table, healthy.
  ProcessResult status = RunProcess(
      {BinaryPath("tandem"), "status", "--router", cluster.router_address()}, absl::Seconds(20));
  ASSERT_TRUE(status.exited && status.exit_code == 0) << status.Describe();
  // A worker's step model line ("  step model: ...") sits indented under it.
  std::vector<std::string> lines;
  for (const std::string& line : Lines(status.out)) {
    if (!absl::StartsWith(line, "  step model: ")) lines.push_back(line);
  }
  // + the "slo: ..." and "cluster: ..." lines.
  ASSERT_EQ(lines.size(), names.size() + 2) << status.out;
  EXPECT_EQ(lines[lines.size() - 2], "slo: none; placement: threshold");
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

// The port of "host:port" (-1 when there is none).
int PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return -1;
  return port;
}

// Issue #32: the README's second cluster on one machine. `tandem up` on
// deploy/local/cluster.yaml holds its fixed ports (router gRPC and HTTP,
// both workers' metrics); the same config again fails on the router's
// port, and with --ephemeral-ports runs beside the first, every listener
// on a port of its own, shown in its process lines. Both serve. (Tests
// bind no fixed port: the file's 50051, 8000, 9101 and 9102 are replaced
// by ports found free at run time.)
TEST(UpTest, ASecondClusterFromTheSameConfigRunsWithEphemeralPorts) {
  std::string yaml = ReadFileOrDie(std::string(TANDEM_SOURCE_DIR) + "/deploy/local/cluster.yaml");
  // The file's port -> the free one in its place.
  std::map<std::string, int> port;
  std::set<int> fixed;
  for (const char* written : {"50051", "8000", "9101", "9102"}) {
    int free_port = 0;
    for (int i = 0; i < 10 && (free_port == 0 || fixed.count(free_port) > 0); ++i) {
      free_port = FreePort();
    }
    ASSERT_GT(free_port, 0);
    fixed.insert(free_port);
    port[written] = free_port;
    const std::string from = absl::StrCat("127.0.0.1:", written);
    const size_t at = yaml.find(from);
    ASSERT_NE(at, std::string::npos) << from << " is no longer in deploy/local/cluster.yaml";
    yaml.replace(at, from.size(), absl::StrCat("127.0.0.1:", free_port));
  }
  UpClusterOptions o;  // as scripts/up: no worker counts
  o.prefill_workers = std::nullopt;
  o.decode_workers = std::nullopt;
  o.config_yaml = yaml;

  absl::StatusOr<std::unique_ptr<UpCluster>> first = UpCluster::Start(o);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::vector<cli::UpProcess>& a = (*first)->processes();
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ((*first)->router_address(), absl::StrCat("127.0.0.1:", port["50051"]));
  EXPECT_EQ(a[0].http_address, absl::StrCat("127.0.0.1:", port["8000"]));
  EXPECT_EQ((*first)->http_address(), a[0].http_address);
  EXPECT_EQ(a[1].name, "prefill-0");
  EXPECT_EQ(a[1].metrics_address, absl::StrCat("127.0.0.1:", port["9101"]));
  EXPECT_EQ(a[2].name, "decode-0");
  EXPECT_EQ(a[2].metrics_address, absl::StrCat("127.0.0.1:", port["9102"]));

  // The same config again: its router cannot bind.
  absl::StatusOr<std::unique_ptr<UpCluster>> clash = UpCluster::Start(o);
  ASSERT_FALSE(clash.ok());
  EXPECT_THAT(clash.status().message(),
              HasSubstr(absl::StrCat("127.0.0.1:", port["50051"], " is already in use")));

  o.extra_args = {"--ephemeral-ports"};
  absl::StatusOr<std::unique_ptr<UpCluster>> second = UpCluster::Start(o);
  ASSERT_TRUE(second.ok()) << second.status();
  const std::vector<cli::UpProcess>& b = (*second)->processes();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].address, (*second)->router_address());
  for (const std::string& address :
       {b[0].address, b[0].http_address, b[1].metrics_address, b[2].metrics_address}) {
    EXPECT_TRUE(absl::StartsWith(address, "127.0.0.1:")) << address;
    EXPECT_GT(PortOf(address), 0) << address;
    EXPECT_EQ(fixed.count(PortOf(address)), 0u) << address << " is one of the first cluster's";
  }
  EXPECT_EQ((*second)->http_address(), b[0].http_address);

  // Both serve, on both routes; each metrics= and http= address answers.
  for (UpCluster* cluster : {first->get(), second->get()}) {
    ASSERT_NO_FATAL_FAILURE(
        ExpectServes(cluster->stub(), Golden("once_upon_a_time"), v1::ROUTE_LOCAL));
    ASSERT_NO_FATAL_FAILURE(
        ExpectServes(cluster->stub(), Golden("long_repeated_313tok"), v1::ROUTE_REMOTE));
    const HttpResult models = HttpCall(cluster->processes()[0].http_address, "GET", "/v1/models");
    EXPECT_EQ(models.status, 200) << models.error << models.body;
    for (size_t i = 1; i < cluster->processes().size(); ++i) {
      const HttpResult metrics =
          HttpCall(cluster->processes()[i].metrics_address, "GET", "/metrics");
      EXPECT_EQ(metrics.status, 200) << cluster->processes()[i].name << metrics.error;
      EXPECT_THAT(metrics.body, HasSubstr("tandem_")) << cluster->processes()[i].name;
    }
  }
  EXPECT_EQ((*second)->Stop(), "exited with status 0");
  EXPECT_EQ((*first)->Stop(), "exited with status 0");
}

}  // namespace
}  // namespace tandem::testing
