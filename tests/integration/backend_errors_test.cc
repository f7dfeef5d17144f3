// Backend (device) errors end to end (DESIGN.md, GPU workers: errors),
// with the workers' --fault-backend-error KIND@N over the CPU backend: a
// recoverable error fails the affected request with its code and the
// worker serves the next one; a sticky error fails the request (an error,
// not a hang), and the decode worker goes NOT_SERVING and exits with
// kExitDeviceLost. Each test starts its own cluster.
#include <sys/wait.h>

#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/server/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// A failed request must end this fast: a hang detector.
constexpr absl::Duration kPrompt = absl::Seconds(10);

std::unique_ptr<LocalCluster> StartCluster(const ClusterOptions& options) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

// The process state letter of /proc/<pid>/stat ('Z' once exited and not
// yet reaped), or 0 if it cannot be read.
char ProcState(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? 0 : stat[paren + 2];
}

// The waitpid() status of child `name` after LocalCluster::Stop().
int ExitStatusOf(const LocalCluster& cluster, const std::string& name) {
  const cli::ProcessGroup& group = cluster.group();
  for (size_t i = 0; i < group.size(); ++i) {
    if (group.name(static_cast<int>(i)) == name) return group.wait_status(static_cast<int>(i));
  }
  ADD_FAILURE() << "no child " << name;
  return -1;
}

// The decode worker's 3rd forward step fails with INTERNAL: the request in
// it (local prefill = step 1, then decode steps) gets INTERNAL with the
// device error after its first two tokens; the next request is served
// normally (the golden tokens) and no KV block is left in use.
TEST(BackendErrorsTest, RecoverableDecodeErrorFailsOnlyThatRequest) {
  ClusterOptions o;
  o.decode_fault_backend_error = "internal@3";
  std::unique_ptr<LocalCluster> cluster = StartCluster(o);
  ASSERT_NE(cluster, nullptr);
  const GoldenCase& g = Golden("once_upon_a_time");
  const absl::Time start = absl::Now();
  StreamResult failed =
      RunGenerate(cluster->stub(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL));
  EXPECT_LT(absl::Now() - start, kPrompt);
  EXPECT_EQ(failed.status.error_code(), grpc::StatusCode::INTERNAL)
      << failed.status.error_message();
  EXPECT_THAT(failed.status.error_message(),
              HasSubstr("decode worker: device error in a forward step: device error "
                        "(injected: fault internal@3, forward call 3)"));
  EXPECT_EQ(failed.token_ids.size(), 2u);

  ExpectGolden(RunGenerate(cluster->stub(),
                           MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL)),
               g, "local");
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster->WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
  absl::StatusOr<v1::WorkerStatus> decode = cluster->DecodeStatus();
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_EQ(decode->running_requests(), 0u);
  EXPECT_EQ(decode->kv_blocks_in_use(), 0u);
}

// The prefill worker's first forward step fails (out of memory): the remote
// request fails promptly on every side (the decode worker's wait for its KV
// ends too), and the next remote request is served with the golden tokens.
// What the client reads depends on which news reaches D first: the
// router's AbortTransfer naming P's error, or the closed KV connection
// (conditional.on_prefill_failure fail: UNAVAILABLE "remote prefill
// failed ..." either way, unless the router answers with P's own error).
TEST(BackendErrorsTest, RecoverablePrefillErrorFailsOnlyThatRequest) {
  ClusterOptions o;
  o.prefill_fault_backend_error = "oom@1";
  o.capture_stderr = true;
  std::unique_ptr<LocalCluster> cluster = StartCluster(o);
  ASSERT_NE(cluster, nullptr);
  const GoldenCase& g = Golden("boundary_33tok");  // 33 > 32 tokens: remote
  const absl::Time start = absl::Now();
  StreamResult failed =
      RunGenerate(cluster->stub(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_REMOTE));
  EXPECT_LT(absl::Now() - start, kPrompt);
  EXPECT_THAT(failed.status.error_code(),
              AnyOf(grpc::StatusCode::RESOURCE_EXHAUSTED, grpc::StatusCode::UNAVAILABLE))
      << failed.status.error_message();
  EXPECT_THAT(failed.status.error_message(),
              AnyOf(HasSubstr("out of memory"), HasSubstr("remote prefill failed")));
  EXPECT_TRUE(failed.token_ids.empty());
  EXPECT_THAT(cluster->CapturedStderr(),
              HasSubstr("prefill-0: forward step failed (RESOURCE_EXHAUSTED: out of memory "
                        "(injected: fault oom@1, forward call 1)): failing 1 request(s): "));

  ExpectGolden(RunGenerate(cluster->stub(),
                           MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_REMOTE)),
               g, "remote");
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster->WaitForIdleWorkers(absl::Seconds(5), &last)) << last.DebugString();
}

// A sticky error at the decode worker's 2nd forward step: the request ends
// with an error (not a hang), the worker logs one line with the cause and
// exits with kExitDeviceLost; the router stops routing to it.
TEST(BackendErrorsTest, StickyDecodeErrorExitsWithTheDeviceLostCode) {
  ClusterOptions o;
  o.decode_fault_backend_error = "sticky@2";
  o.capture_stderr = true;
  std::unique_ptr<LocalCluster> cluster = StartCluster(o);
  ASSERT_NE(cluster, nullptr);
  const GoldenCase& g = Golden("once_upon_a_time");
  const absl::Time start = absl::Now();
  StreamResult failed =
      RunGenerate(cluster->stub(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL));
  EXPECT_LT(absl::Now() - start, kPrompt);
  EXPECT_EQ(failed.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << failed.status.error_message();
  EXPECT_THAT(failed.status.error_message(), HasSubstr("decode"));

  const pid_t decode = cluster->decode_pid();
  EXPECT_TRUE(PollUntil(absl::Seconds(10), [&] { return ProcState(decode) == 'Z'; }))
      << "decode worker still running, state " << ProcState(decode);
  // The router notices and refuses new work instead of hanging.
  EXPECT_TRUE(PollUntil(absl::Seconds(10), [&] {
    absl::StatusOr<v1::ClusterStatus> s = cluster->ClusterStatus(absl::Seconds(3));
    return s.ok() && !s->can_serve();
  }));
  StreamResult refused = RunGenerate(
      cluster->stub(), MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL), kPrompt);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << refused.status.error_message();

  const std::string log = cluster->CapturedStderr();
  EXPECT_THAT(log, HasSubstr("device lost: decode worker: illegal memory access (injected: "
                             "fault sticky@2, forward call 2); exiting with status 75"));
  cluster->Stop(absl::Seconds(10));
  const int ws = ExitStatusOf(*cluster, LocalCluster::kDecodeName);
  EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == kExitDeviceLost)
      << cli::DescribeWaitStatus(ws);
  EXPECT_EQ(kExitDeviceLost, 75);
}

// Several streams on a decode worker whose device is lost: each client
// learns the cause ("device lost"), also those the router fails on its own
// once the first failure made it mark the worker unreachable.
TEST(BackendErrorsTest, EveryStreamOfALostDeviceSaysDeviceLost) {
  ClusterOptions o;
  o.decode_fault_backend_error = "sticky@4";
  std::unique_ptr<LocalCluster> cluster = StartCluster(o);
  ASSERT_NE(cluster, nullptr);
  const GoldenCase& g = Golden("once_upon_a_time");
  constexpr int kStreams = 4;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      results[i] = RunGenerate(cluster->stub(),
                               MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL), kPrompt);
    });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(results[i].status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << results[i].status.error_message();
    EXPECT_THAT(results[i].status.error_message(), HasSubstr("device lost"));
  }
  cluster->Stop(absl::Seconds(10));
}

// A bad --fault-backend-error value: the worker refuses to start with one
// line naming the flag.
TEST(BackendErrorsTest, BadFaultFlagIsRefused) {
  ClusterOptions o;
  o.decode_fault_backend_error = "segfault@1";
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  ASSERT_FALSE(cluster.ok());
  EXPECT_THAT(std::string(cluster.status().message()), HasSubstr("exited with status 1"));
}

}  // namespace
}  // namespace tandem::testing
