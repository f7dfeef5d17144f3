// The router's own counters (router/router_metrics.h), as its GetStatus
// reports them (ClusterStatus.router.router_*_total), against what the
// clients of a real cluster saw: every request, every token streamed, every
// prompt token, every cached prompt token, every refusal. /metrics serves
// the same counters (the HTTP tests compare the two).
#include <signal.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

// A fresh cluster: the router's counters start at zero.
class RouterCountersTest : public OwnClusterTest {};

TEST_F(RouterCountersTest, GetStatusCountsWhatTheClientsSaw) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ClusterOptions()));
  absl::StatusOr<v1::ClusterStatus> before = cluster().ClusterStatus();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->router().router_requests_total(), 0u);
  EXPECT_EQ(before->router().router_generation_tokens_total(), 0u);

  std::vector<v1::GenerateRequest> requests;
  requests.push_back(MakeRequest(Golden("once_upon_a_time").prompt, 16, v1::ROUTE_LOCAL));
  requests.push_back(MakeRequest(Golden("long_repeated_313tok").prompt, 8, v1::ROUTE_REMOTE));
  // The same 32-token prompt twice: the second finds it in D's prefix cache.
  requests.push_back(MakeRequest(Golden("boundary_32tok").prompt, 4, v1::ROUTE_LOCAL));
  requests.push_back(MakeRequest(Golden("boundary_32tok").prompt, 4, v1::ROUTE_LOCAL));
  // Two samples: both samples' tokens count, the request once.
  v1::GenerateRequest two = MakeRequest(Golden("lily_and_ben").prompt, 6);
  SetSeededSampling(&two, 1.0f, 42);
  two.set_n(2);
  requests.push_back(two);
  // A stop string ends the sample early (its tokens up to the match count).
  v1::GenerateRequest stop = MakeRequest(Golden("the_little_dog").prompt, 32);
  stop.add_stop(std::string(" "));
  requests.push_back(stop);

  uint64_t completion_tokens = 0, prompt_tokens = 0, cached = 0, received = 0;
  std::vector<StreamResult> results;
  for (const v1::GenerateRequest& request : requests) {
    results.push_back(RunGenerate(cluster().stub(), request));
    const StreamResult& r = results.back();
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    for (const SampleResult& s : r.samples) completion_tokens += s.completion_tokens;
    received += r.token_ids.size();
    prompt_tokens += r.prompt_tokens;
    cached += r.cached_prompt_tokens;
  }
  EXPECT_EQ(completion_tokens, received);  // what the client counted = what it got
  EXPECT_GT(cached, 0u);                   // the repeated prompt hit the cache
  EXPECT_EQ(results[1].route, "remote");
  EXPECT_EQ(results[4].samples.size(), 2u);
  EXPECT_EQ(results[5].finish_reason, v1::FINISH_STOP);  // the stop string matched
  EXPECT_LT(results[5].completion_tokens, 32u);

  // Refused before running: counted as requests and errors, no tokens.
  const StreamResult zero = RunGenerate(cluster().stub(), MakeRequest("Once", 0));
  ASSERT_EQ(zero.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::GenerateRequest empty;  // neither prompt nor messages
  empty.set_max_tokens(4);
  ASSERT_EQ(RunGenerate(cluster().stub(), empty).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // A request's admission slot is released just after its stream ended.
  absl::StatusOr<v1::ClusterStatus> after;
  EXPECT_TRUE(PollUntil(absl::Seconds(5), [&] {
    after = cluster().ClusterStatus();
    return after.ok() && after->router().running_requests() == 0;
  }));
  ASSERT_TRUE(after.ok()) << after.status();
  const v1::WorkerStatus& router = after->router();
  EXPECT_EQ(router.router_requests_total(), requests.size() + 2);
  EXPECT_EQ(router.router_request_errors_total(), 2u);
  EXPECT_EQ(router.router_generation_tokens_total(), completion_tokens);
  EXPECT_EQ(router.router_prompt_tokens_total(), prompt_tokens);
  EXPECT_EQ(router.router_prompt_tokens_cached_total(), cached);
  EXPECT_EQ(router.queued_requests(), 0u);
}

TEST_F(RouterCountersTest, QueuedAndRefusedRequestsCountWithoutTokens) {
  // One slot, one place in the queue; the decode worker stopped holds the
  // slot (no health poll meanwhile, as in admission_test.cc).
  ClusterOptions options;
  options.max_inflight = 1;
  options.max_queued = 1;
  options.poll_interval_ms = 600000;
  options.rpc_timeout_ms = 300;
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  const pid_t decode = cluster().decode_pid();
  ASSERT_EQ(kill(decode, SIGSTOP), 0);
  ASSERT_TRUE(WaitStopped(decode, absl::Seconds(5)));
  auto router_status = [&] {
    absl::StatusOr<v1::ClusterStatus> s = cluster().ClusterStatus();
    return s.ok() ? s->router() : v1::WorkerStatus();
  };
  v1::WorkerStatus router;
  auto wait_for = [&](const std::function<bool(const v1::WorkerStatus&)>& done) {
    return PollUntil(absl::Seconds(20), [&] {
      router = router_status();
      return done(router);
    });
  };

  const GoldenCase& g = Golden("once_upon_a_time");
  GenerateStream running(cluster().stub(), MakeRequest(g.prompt, 8, v1::ROUTE_LOCAL));
  ASSERT_TRUE(wait_for([](const v1::WorkerStatus& r) { return r.running_requests() == 1; }));
  GenerateStream queued(cluster().stub(), MakeRequest("The little dog", 8, v1::ROUTE_LOCAL));
  ASSERT_TRUE(wait_for([](const v1::WorkerStatus& r) { return r.queued_requests() == 1; }));
  const StreamResult refused =
      RunGenerate(cluster().stub(), MakeRequest("Lily and Ben", 8, v1::ROUTE_LOCAL));
  ASSERT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  queued.Cancel();  // leaves the queue without ever running
  EXPECT_EQ(queued.Finish().status.error_code(), grpc::StatusCode::CANCELLED);
  // Nothing ran to its end yet: the two that never got a slot are counted,
  // with no prompt or generated token.
  ASSERT_TRUE(wait_for([](const v1::WorkerStatus& r) { return r.router_requests_total() == 2; }));
  EXPECT_EQ(router.router_request_errors_total(), 2u);
  EXPECT_EQ(router.router_prompt_tokens_total(), g.prompt_ids.size());  // the running one
  EXPECT_EQ(router.router_generation_tokens_total(), 0u);

  ASSERT_EQ(kill(decode, SIGCONT), 0);
  const StreamResult& done = running.Finish();
  ASSERT_TRUE(done.status.ok()) << done.status.error_message();
  ASSERT_TRUE(wait_for([](const v1::WorkerStatus& r) {
    return r.router_requests_total() == 3 && r.running_requests() == 0;
  }));
  EXPECT_EQ(router.router_request_errors_total(), 2u);
  EXPECT_EQ(router.router_prompt_tokens_total(), done.prompt_tokens);
  EXPECT_EQ(router.router_generation_tokens_total(), done.completion_tokens);
  EXPECT_EQ(done.completion_tokens, 8u);
}

}  // namespace
}  // namespace tandem::testing
