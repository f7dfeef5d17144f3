// The router's registry with real processes (issue #12, items 4 and 5).
// Registration: a decode worker that registers with another KV dtype's
// layout id (--fault-kv-layout-id) is refused by the router with
// FAILED_PRECONDITION naming both ids, logs it and exits 1, whether the
// router was up first or started after it; the cluster keeps serving with
// its own workers. Health: with its prefill worker killed the router still
// serves (logging the change once), and drops the worker after
// router.drop_after_ms. Names (issue #13): a second process started with a
// running worker's --name is refused (ALREADY_EXISTS), keeps retrying, and
// gets the name once the first dies.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"
#include "tools/process_group.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kExitTimeout = absl::Seconds(30);

// The layout id every worker of stories260K has (5 layers, 4 KV heads of
// 8, f32 on the CPU backend), and the same with f16 K/V.
std::string GoodLayout(const std::string& fingerprint) {
  return absl::StrCat("kv4/", fingerprint, "/L5.H4.D8/f32");
}
std::string F16Layout(const std::string& fingerprint) {
  return absl::StrCat("kv4/", fingerprint, "/L5.H4.D8/f16");
}

class RegistryTest : public OwnClusterTest {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  // A decode worker "decode-0" of `options`' cluster, on fresh ports,
  // registering with `router` under `layout_id`; runs until it exits.
  ProcessResult RunBadDecodeWorker(const ClusterOptions& options, const std::string& router,
                                   const std::string& layout_id) {
    const std::string config = dir_ + "/bad.yaml";
    EXPECT_TRUE(WriteFile(config, ClusterYaml(options)));
    return RunProcess({BinaryPath("tandem-decode-worker"), "--config", config, "--name",
                       LocalCluster::kDecodeName, "--model", ModelPath(), "--router", router,
                       "--fault-kv-layout-id", layout_id},
                      kExitTimeout);
  }

  // Exit status 1 and the refusal line naming both ids.
  static void ExpectRefused(const ProcessResult& r, const std::string& router,
                            const std::string& bad_id, const std::string& good_id) {
    EXPECT_FALSE(r.timed_out) << "still running after " << kExitTimeout;
    EXPECT_TRUE(r.exited) << r.Describe();
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat(
                           "router ", router,
                           " refused registration: kv_layout_id: worker decode-0 has KV layout \"",
                           bad_id, "\" but the router's model and configuration give \"",
                           good_id, "\"")))
        << r.err;
  }

  // The router still serves with its own decode worker, at its address.
  void ExpectClusterUnchanged() {
    absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(status->can_serve());
    int decode = 0;
    for (const v1::WorkerStatus& w : status->workers()) {
      if (w.role() != v1::ROLE_DECODE) continue;
      ++decode;
      EXPECT_EQ(w.address(), cluster().decode_address());
      EXPECT_TRUE(w.healthy());
      EXPECT_EQ(w.kv_layout_id(), GoodLayout(status->router().model_fingerprint()));
    }
    EXPECT_EQ(decode, 1);
  }

  std::string dir_;
};

TEST_F(RegistryTest, AnotherKvDtypeIsRefusedNamingBothIdsRouterFirst) {
  ClusterOptions options;
  options.capture_stderr = true;
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  const std::string fingerprint = status->router().model_fingerprint();
  ASSERT_FALSE(fingerprint.empty());

  const ProcessResult r = RunBadDecodeWorker(cluster().options(), cluster().router_address(),
                                             F16Layout(fingerprint));
  ExpectRefused(r, cluster().router_address(), F16Layout(fingerprint), GoodLayout(fingerprint));
  EXPECT_THAT(cluster().CapturedStderr(),
              HasSubstr(absl::StrCat("refused worker decode-0: kv_layout_id: worker decode-0 "
                                     "has KV layout \"",
                                     F16Layout(fingerprint), "\"")));
  ExpectClusterUnchanged();
}

TEST_F(RegistryTest, AnotherKvDtypeIsRefusedNamingBothIdsWorkerFirst) {
  const int port = FreePort();
  ASSERT_NE(port, 0);
  ClusterOptions options;
  options.router_listen = absl::StrCat("127.0.0.1:", port);
  // Before the router is up its fingerprint is unknown here: the bad id
  // differs in the fingerprint as well as in the dtype.
  const std::string bad_id = F16Layout("not-the-model");
  ProcessResult r;
  // The worker retries its registration until the router listens.
  std::thread bad([&] {
    r = RunBadDecodeWorker(options, options.router_listen, bad_id);
  });
  StartCluster(options);
  bad.join();
  ASSERT_FALSE(HasFatalFailure());
  absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  ExpectRefused(r, options.router_listen, bad_id,
                GoodLayout(status->router().model_fingerprint()));
  ExpectClusterUnchanged();
}

// Lines of `log` containing `needle`.
int CountLines(const std::string& log, const std::string& needle) {
  int n = 0;
  for (const std::string& line : Lines(log)) n += line.find(needle) != std::string::npos;
  return n;
}

TEST_F(RegistryTest, KilledPrefillWorkerLeavesARouterThatServesAndIsDroppedLater) {
  ClusterOptions options;
  options.capture_stderr = true;
  options.drop_after_ms = 1500;
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  ASSERT_EQ(kill(cluster().prefill_pid(), SIGKILL), 0);

  v1::ClusterStatus last;
  auto prefill_state = [&](bool* present, bool* healthy) {
    absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
    if (!status.ok()) return false;
    last = *status;
    *present = *healthy = false;
    for (const v1::WorkerStatus& w : status->workers()) {
      if (w.name() != LocalCluster::kPrefillName) continue;
      *present = true;
      *healthy = w.healthy();
    }
    return true;
  };
  bool present = true, healthy = true;
  // Marked unhealthy after its missed polls, and still listed.
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] {
    return prefill_state(&present, &healthy) && present && !healthy;
  })) << last.DebugString();
  EXPECT_TRUE(last.can_serve());
  EXPECT_TRUE(last.router().ready());
  // The decode worker serves a prompt it prefills itself.
  const GoldenCase& g = Golden("once_upon_a_time");
  ExpectGolden(RunGenerate(cluster().stub(),
                           MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL)),
               g, "local");

  // Gone from the registry after drop_after_ms.
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] {
    return prefill_state(&present, &healthy) && !present;
  })) << last.DebugString();
  EXPECT_TRUE(last.can_serve());
  ASSERT_EQ(last.workers_size(), 1);
  EXPECT_EQ(last.workers(0).name(), LocalCluster::kDecodeName);

  const std::string log = cluster().CapturedStderr();
  EXPECT_EQ(CountLines(log, "router: no healthy prefill worker: long prompts are prefilled on "
                            "the decode workers"),
            1)
      << log;
  EXPECT_EQ(CountLines(log, "router: worker prefill-0 unhealthy for "), 1) << log;
  EXPECT_EQ(CountLines(log, " ms: dropped from the registry"), 1) << log;
  EXPECT_EQ(CountLines(log, "cluster cannot serve"), 0) << log;
}

// The whole contents of `path` ("" when it cannot be read).
std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Two processes started with one --name: the second is refused with
// ALREADY_EXISTS naming both addresses, keeps running and retrying, and the
// router keeps the first (logging the refusal once); when the first dies
// the second gets the name.
TEST_F(RegistryTest, ASecondProcessWithTheSameNameWaitsUntilTheFirstDies) {
  ClusterOptions options;
  options.capture_stderr = true;
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  const std::string config = dir_ + "/dup.yaml";
  ASSERT_TRUE(WriteFile(config, ClusterYaml(cluster().options())));  // fresh ports
  const std::string err_path = dir_ + "/dup.err";
  cli::ProcessGroup group;
  absl::StatusOr<int> dup = group.Spawn(
      "decode-0-again",
      {BinaryPath("tandem-decode-worker"), "--config", config, "--name",
       LocalCluster::kDecodeName, "--model", ModelPath(), "--router", cluster().router_address()},
      cli::ProcessGroup::SpawnOptions{.stderr_path = err_path, .env = {}});
  ASSERT_TRUE(dup.ok()) << dup.status();
  absl::StatusOr<std::string> dup_address =
      group.WaitForLine(*dup, "TANDEM_LISTENING ", absl::Seconds(30));
  ASSERT_TRUE(dup_address.ok()) << dup_address.status();
  const std::string why = absl::StrCat(
      "worker name 'decode-0' is held by a healthy worker at ", cluster().decode_address(),
      "; another process registered with the same name from ", *dup_address);
  const std::string worker_line = absl::StrCat("router ", cluster().router_address(),
                                               " refused registration: ", why,
                                               " (retrying until the name frees)");
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] {
    return CountLines(ReadAll(err_path), worker_line) == 1;
  })) << ReadAll(err_path);
  // A few more of its once-a-second retries: still running, still refused,
  // each side's line still logged once.
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_FALSE(group.ReapExited().has_value());
  EXPECT_TRUE(group.running(*dup));
  EXPECT_EQ(CountLines(ReadAll(err_path), "refused registration"), 1) << ReadAll(err_path);
  EXPECT_EQ(CountLines(cluster().CapturedStderr(), "refused worker decode-0: " + why), 1)
      << cluster().CapturedStderr();
  ExpectClusterUnchanged();

  // The first dies: once it misses its polls the second takes the name.
  ASSERT_EQ(kill(cluster().decode_pid(), SIGKILL), 0);
  v1::ClusterStatus last;
  ASSERT_TRUE(PollUntil(absl::Seconds(15), [&] {
    absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
    if (!status.ok()) return false;
    last = *status;
    for (const v1::WorkerStatus& w : last.workers()) {
      if (w.name() == LocalCluster::kDecodeName) {
        return w.healthy() && w.address() == *dup_address && last.can_serve();
      }
    }
    return false;
  })) << last.DebugString();
  // The router counts the registration before the worker logs its line.
  const std::string registered =
      absl::StrCat("registered with router ", cluster().router_address());
  EXPECT_TRUE(PollUntil(absl::Seconds(5), [&] {
    return CountLines(ReadAll(err_path), registered) >= 1;
  }));
  EXPECT_EQ(CountLines(ReadAll(err_path), registered), 1) << ReadAll(err_path);
  const GoldenCase& g = Golden("once_upon_a_time");
  ExpectGolden(RunGenerate(cluster().stub(),
                           MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL)),
               g, "local");  // served by the second process
}

}  // namespace
}  // namespace tandem::testing
