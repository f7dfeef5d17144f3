// Process lifecycle: a decode worker that dies (SIGKILL) makes requests fail
// with UNAVAILABLE instead of hanging, and SIGTERM stops a whole cluster
// cleanly (exit status 0, nothing left running). Each test starts its own
// cluster because it ends it.
#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A call that fails because of a dead worker must end this fast: a hang
// detector, far above the few milliseconds a refused call takes.
constexpr absl::Duration kPrompt = absl::Seconds(2);

std::unique_ptr<LocalCluster> StartCluster() {
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(ClusterOptions());
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

// SIGKILLs the decode worker and reaps it (through the group, at Stop()).
void KillDecodeWorker(LocalCluster& cluster) {
  ASSERT_EQ(kill(cluster.decode_pid(), SIGKILL), 0);
}

// The router's missed-poll window, plus one control-RPC deadline and a
// second of slack: by then the router must have marked the worker unhealthy.
absl::Duration NoticeWindow(const ClusterOptions& o) {
  return absl::Milliseconds(o.poll_interval_ms * o.unhealthy_after_missed_polls +
                            o.rpc_timeout_ms) +
         absl::Seconds(1);
}

TEST(DecodeWorkerDownTest, InFlightRequestFailsUnavailable) {
  std::unique_ptr<LocalCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  const GoldenCase& g = Golden("long_repeated_313tok");
  const uint32_t max_tokens = kContextLength - static_cast<uint32_t>(g.prompt_ids.size());
  GenerateStream stream(cluster->stub(), MakeRequest(g.prompt, max_tokens, v1::ROUTE_LOCAL),
                        absl::Seconds(30));
  ASSERT_TRUE(stream.ReadUntilFirstToken()) << stream.Finish().status.error_message();
  KillDecodeWorker(*cluster);
  const absl::Time killed = absl::Now();
  const StreamResult& r = stream.Finish();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_LT(absl::Now() - killed, kPrompt);
}

// Regression: a frozen (SIGSTOPped) decode worker kept its in-flight
// streams open until the client's deadline, although the router had marked
// it unhealthy. The router now fails them with UNAVAILABLE at that moment.
TEST(DecodeWorkerDownTest, FrozenWorkerFailsInFlightRequestsWhenMarkedUnhealthy) {
  std::unique_ptr<LocalCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  const GoldenCase& g = Golden("long_repeated_313tok");
  const uint32_t max_tokens = kContextLength - static_cast<uint32_t>(g.prompt_ids.size());
  GenerateStream stream(cluster->stub(), MakeRequest(g.prompt, max_tokens, v1::ROUTE_LOCAL),
                        absl::Seconds(60));
  ASSERT_TRUE(stream.ReadUntilFirstToken()) << stream.Finish().status.error_message();
  ASSERT_EQ(kill(cluster->decode_pid(), SIGSTOP), 0);
  const absl::Time stopped = absl::Now();
  const StreamResult& r = stream.Finish();
  const absl::Duration took = absl::Now() - stopped;
  kill(cluster->decode_pid(), SIGCONT);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_THAT(r.status.error_message(), HasSubstr("decode-0"));
  // Each missed poll may wait a whole rpc_timeout on the frozen worker.
  const ClusterOptions o;
  EXPECT_LT(took, absl::Milliseconds((o.poll_interval_ms + o.rpc_timeout_ms) *
                                     o.unhealthy_after_missed_polls) +
                      absl::Seconds(2));
}

TEST(DecodeWorkerDownTest, NewRequestsFailUnavailablePromptly) {
  std::unique_ptr<LocalCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  const GoldenCase& g = Golden("once_upon_a_time");
  KillDecodeWorker(*cluster);
  const absl::Time killed = absl::Now();

  // Before the router notices: the broken connection fails the call.
  {
    const absl::Time start = absl::Now();
    StreamResult r = RunGenerate(cluster->stub(), MakeRequest(g.prompt, kGoldenMaxTokens),
                                 absl::Seconds(30));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
    EXPECT_LT(absl::Now() - start, kPrompt);
  }

  // The router notices within its missed-poll window.
  v1::ClusterStatus last;
  const bool noticed = PollUntil(
      NoticeWindow(cluster->options()) - (absl::Now() - killed),
      [&] {
        absl::StatusOr<v1::ClusterStatus> s = cluster->ClusterStatus(absl::Seconds(3));
        if (!s.ok()) return false;
        last = *s;
        return !s->can_serve();
      },
      absl::Milliseconds(20));
  ASSERT_TRUE(noticed) << "router still can_serve: " << last.DebugString();
  for (const v1::WorkerStatus& w : last.workers()) {
    EXPECT_EQ(w.healthy(), w.name() != LocalCluster::kDecodeName) << w.DebugString();
  }

  // Then every request is refused at once, on either route.
  for (v1::RouteOverride route : {v1::ROUTE_AUTO, v1::ROUTE_LOCAL, v1::ROUTE_REMOTE}) {
    const absl::Time start = absl::Now();
    StreamResult r =
        RunGenerate(cluster->stub(), MakeRequest(g.prompt, kGoldenMaxTokens, route),
                    absl::Seconds(30));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
    EXPECT_THAT(r.status.error_message(), HasSubstr("decode"));
    EXPECT_LT(absl::Now() - start, kPrompt);
  }
}

TEST(ClusterShutdownTest, SigtermStopsEveryProcessCleanly) {
  std::unique_ptr<LocalCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  const GoldenCase& g = Golden("boundary_33tok");
  ExpectGolden(RunGenerate(cluster->stub(), MakeRequest(g.prompt, kGoldenMaxTokens)), g,
               "remote");
  const pid_t pids[] = {cluster->router_pid(), cluster->prefill_pid(), cluster->decode_pid()};
  // shutdown_grace_s is 1: everything is idle, so SIGTERM suffices.
  EXPECT_THAT(cluster->Stop(absl::Seconds(10)), IsEmpty()) << "had to SIGKILL these";
  const cli::ProcessGroup& group = cluster->group();
  for (size_t i = 0; i < group.size(); ++i) {
    const int index = static_cast<int>(i);
    EXPECT_FALSE(group.running(index));
    EXPECT_TRUE(WIFEXITED(group.wait_status(index)) && WEXITSTATUS(group.wait_status(index)) == 0)
        << group.name(index) << " " << cli::DescribeWaitStatus(group.wait_status(index));
  }
  for (pid_t pid : pids) {
    errno = 0;
    EXPECT_TRUE(kill(pid, 0) != 0 && errno == ESRCH) << "pid " << pid << " still exists";
  }
}

// SIGTERM to the decode worker alone: it drains. The router stops routing
// to it (GetStatus ready = false) but must not fail its in-flight streams,
// which run longer than the router's missed-poll window (64 streams of 400
// tokens at a 100 ms poll period), and the worker exits 0 once they are
// done.
TEST(ClusterShutdownTest, DrainingDecodeWorkerFinishesItsStreams) {
  ClusterOptions o;
  o.poll_interval_ms = 100;
  o.shutdown_grace_s = 30;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const GoldenCase& g = Golden("boundary_33tok");
  std::vector<std::unique_ptr<GenerateStream>> streams;
  for (int i = 0; i < 64; ++i) {
    streams.push_back(std::make_unique<GenerateStream>(
        (*cluster)->stub(), MakeRequest(g.prompt, 400, v1::ROUTE_LOCAL), absl::Seconds(60)));
  }
  for (auto& s : streams) ASSERT_TRUE(s->ReadUntilFirstToken()) << s->Finish().status.error_message();
  ASSERT_EQ(kill((*cluster)->decode_pid(), SIGTERM), 0);

  // New work is refused once the router has seen the drain.
  const bool noticed = PollUntil(absl::Seconds(10), [&] {
    absl::StatusOr<v1::ClusterStatus> s = (*cluster)->ClusterStatus(absl::Seconds(3));
    return s.ok() && !s->can_serve();
  });
  EXPECT_TRUE(noticed) << "router still routes to the draining decode worker";
  for (auto& s : streams) {
    const StreamResult& r = s->Finish();
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_NE(r.finish_reason, v1::FINISH_NONE);
  }
  EXPECT_THAT((*cluster)->Stop(absl::Seconds(10)), IsEmpty()) << "had to SIGKILL these";
  const cli::ProcessGroup& group = (*cluster)->group();
  for (size_t i = 0; i < group.size(); ++i) {
    const int index = static_cast<int>(i);
    EXPECT_TRUE(WIFEXITED(group.wait_status(index)) && WEXITSTATUS(group.wait_status(index)) == 0)
        << group.name(index) << " " << cli::DescribeWaitStatus(group.wait_status(index));
  }
}

}  // namespace
}  // namespace tandem::testing
