// Router admission (issue #12, item 2) on a real cluster with
// router.max_inflight 1 and router.max_queued 1. The decode worker is
// SIGSTOPped, so the first Generate holds the only slot for as long as the
// test wants (the router's health polls are slowed down so that it is not
// marked unhealthy meanwhile); the router's GetStatus shows running and
// queued requests.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <map>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

constexpr char kPrompt[] = "Once upon a time";
constexpr uint32_t kMaxTokens = 8;

ClusterOptions AdmissionOptions() {
  ClusterOptions o;
  o.max_inflight = 1;
  o.max_queued = 1;
  // No health poll while the decode worker is stopped (it would be marked
  // unhealthy and the running request failed); GetStatus's own query of the
  // stopped worker gives up after rpc_timeout_ms.
  o.poll_interval_ms = 600000;
  o.rpc_timeout_ms = 300;
  return o;
}

// The router's own counts from GetStatus: {running, queued}; {-1, -1} when
// the call failed.
std::pair<int, int> RouterCounts(LocalCluster& cluster) {
  absl::StatusOr<v1::ClusterStatus> s = cluster.ClusterStatus();
  if (!s.ok()) return {-1, -1};
  return {static_cast<int>(s->router().running_requests()),
          static_cast<int>(s->router().queued_requests())};
}

// Waits until the router reports `running` and `queued` requests.
::testing::AssertionResult WaitForCounts(LocalCluster& cluster, int running, int queued) {
  std::pair<int, int> last;
  if (PollUntil(absl::Seconds(20), [&] {
        last = RouterCounts(cluster);
        return last == std::make_pair(running, queued);
      })) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "the router reports " << last.first << " running, "
                                       << last.second << " queued";
}

// One Generate read to its end, keeping the server's trailing metadata.
struct RawCall {
  grpc::Status status;
  int messages = 0;
  std::multimap<grpc::string_ref, grpc::string_ref> trailers;  // valid with `context`
  grpc::ClientContext context;
};

void RunRaw(LocalCluster& cluster, RawCall* call) {
  call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto reader = cluster.stub().Generate(&call->context, MakeRequest(kPrompt, kMaxTokens));
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) ++call->messages;
  call->status = reader->Finish();
  call->trailers = call->context.GetServerTrailingMetadata();
}

// The retry-after-ms trailer as a number; -1 (and a test failure) when it
// is missing or not a decimal integer.
int64_t RetryAfterMs(const RawCall& call) {
  auto it = call.trailers.find("retry-after-ms");
  if (it == call.trailers.end()) {
    ADD_FAILURE() << "no retry-after-ms trailer";
    return -1;
  }
  const std::string text(it->second.data(), it->second.size());
  int64_t ms = 0;
  if (!absl::SimpleAtoi(text, &ms)) {
    ADD_FAILURE() << "retry-after-ms is not a number: " << text;
    return -1;
  }
  return ms;
}

// Each test starts with the decode worker stopped.
class RouterAdmissionTest : public OwnClusterTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartCluster(AdmissionOptions()));
    ASSERT_NO_FATAL_FAILURE(StopDecode());
  }
  void TearDown() override { ResumeDecode(); }
  void StopDecode() {
    ASSERT_EQ(kill(cluster().decode_pid(), SIGSTOP), 0);
    stopped_ = true;
    ASSERT_TRUE(WaitStopped(cluster().decode_pid(), absl::Seconds(5)))
        << "the decode worker did not stop";
  }
  void ResumeDecode() {
    if (stopped_) kill(cluster().decode_pid(), SIGCONT);
    stopped_ = false;
  }

 private:
  bool stopped_ = false;
};

TEST_F(RouterAdmissionTest, ThirdRequestRefusedWithRetryAfterAndSecondRunsAfterFirst) {
  GenerateStream first(cluster().stub(), MakeRequest(kPrompt, kMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_TRUE(WaitForCounts(cluster(), 1, 0)) << "the first request is not running";
  GenerateStream second(cluster().stub(), MakeRequest(kPrompt, kMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_TRUE(WaitForCounts(cluster(), 1, 1)) << "the second request is not queued";

  RawCall third;
  RunRaw(cluster(), &third);
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(third.status.error_message(),
            "router at capacity: 1 running, 1 queued (router.max_inflight, router.max_queued)");
  EXPECT_EQ(third.messages, 0);
  // No request has completed yet: the estimate's upper clamp.
  EXPECT_EQ(RetryAfterMs(third), 10000);
  // The refusal left the queue as it was.
  EXPECT_EQ(RouterCounts(cluster()), std::make_pair(1, 1));
  // The CLI names the hint, and `tandem status` shows the queue.
  const ProcessResult cli =
      RunProcess({BinaryPath("tandem"), "generate", "--router", cluster().router_address(),
                  "--max-tokens", "4", "Once upon a time"},
                 absl::Seconds(20));
  EXPECT_EQ(cli.exit_code, 1) << cli.Describe();
  EXPECT_EQ(cli.err,
            "tandem: RESOURCE_EXHAUSTED: router at capacity: 1 running, 1 queued "
            "(router.max_inflight, router.max_queued) (retry after 10000 ms)\n");
  const ProcessResult status = RunProcess(
      {BinaryPath("tandem"), "status", "--router", cluster().router_address()},
      absl::Seconds(20));
  EXPECT_THAT(status.out, ::testing::HasSubstr(" running=1 queued=1 ")) << status.Describe();

  ResumeDecode();
  const StreamResult& a = first.Finish();
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.token_ids.size(), kMaxTokens);
  const StreamResult& b = second.Finish();
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  // Greedy, same prompt: the queued request ran in full, with the same ids.
  EXPECT_EQ(b.token_ids, a.token_ids);
  EXPECT_NE(b.request_id, a.request_id);
  EXPECT_TRUE(WaitForCounts(cluster(), 0, 0));

  // With two completions to estimate from, a refusal's hint follows them:
  // (1 queued + 1) * (time since the older one) / 2, well below the clamp.
  StopDecode();
  GenerateStream x(cluster().stub(), MakeRequest(kPrompt, kMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_TRUE(WaitForCounts(cluster(), 1, 0));
  GenerateStream y(cluster().stub(), MakeRequest(kPrompt, kMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_TRUE(WaitForCounts(cluster(), 1, 1));
  RawCall z;
  RunRaw(cluster(), &z);
  EXPECT_EQ(z.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(RetryAfterMs(z), ::testing::AllOf(::testing::Ge(100), ::testing::Lt(10000)));
  ResumeDecode();
  EXPECT_TRUE(x.Finish().status.ok());
  EXPECT_TRUE(y.Finish().status.ok());
}

TEST_F(RouterAdmissionTest, CancelledQueuedRequestLeavesTheQueueAtOnce) {
  GenerateStream first(cluster().stub(), MakeRequest(kPrompt, kMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_TRUE(WaitForCounts(cluster(), 1, 0)) << "the first request is not running";
  GenerateStream second(cluster().stub(), MakeRequest(kPrompt, kMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_TRUE(WaitForCounts(cluster(), 1, 1)) << "the second request is not queued";

  second.Cancel();
  EXPECT_EQ(second.Finish().status.error_code(), grpc::StatusCode::CANCELLED);
  // Its place is free while the first still runs: a third request queues.
  ASSERT_TRUE(WaitForCounts(cluster(), 1, 0)) << "the cancelled request is still queued";
  GenerateStream third(cluster().stub(), MakeRequest(kPrompt, kMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_TRUE(WaitForCounts(cluster(), 1, 1)) << "the third request is not queued";

  ResumeDecode();
  EXPECT_TRUE(first.Finish().status.ok());
  const StreamResult& c = third.Finish();
  EXPECT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.token_ids.size(), kMaxTokens);
  EXPECT_TRUE(WaitForCounts(cluster(), 0, 0));
}

TEST_F(RouterAdmissionTest, QueuedRequestPastItsDeadlineLeavesTheQueue) {
  GenerateStream first(cluster().stub(), MakeRequest(kPrompt, kMaxTokens, v1::ROUTE_LOCAL));
  ASSERT_TRUE(WaitForCounts(cluster(), 1, 0)) << "the first request is not running";
  // Long enough that a loaded machine still sees it queued (each status
  // call waits rpc_timeout_ms on the stopped decode worker).
  GenerateStream second(cluster().stub(), MakeRequest(kPrompt, kMaxTokens, v1::ROUTE_LOCAL),
                        absl::Seconds(8));
  ASSERT_TRUE(WaitForCounts(cluster(), 1, 1)) << "the second request is not queued";
  EXPECT_EQ(second.Finish().status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitForCounts(cluster(), 1, 0)) << "the expired request is still queued";

  ResumeDecode();
  EXPECT_TRUE(first.Finish().status.ok());
  EXPECT_TRUE(WaitForCounts(cluster(), 0, 0));
}

}  // namespace
}  // namespace tandem::testing
