// Many requests at once through the router (issue #3): continuous batching
// on the decode worker gives every request exactly what it gives alone,
// preemption by recompute on a tiny KV pool changes no token, a request that
// can never fit is refused with RESOURCE_EXHAUSTED, and nothing leaks
// (kv_blocks_in_use and transfers_in_flight back to 0 on every worker).
// Each test starts its own cluster; the expected tokens of a request are
// those it gives alone on the same cluster, run before the concurrent ones.
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

// Runs each request alone, one after another; every one must succeed.
std::vector<StreamResult> RunEachAlone(LocalCluster& cluster,
                                       const std::vector<v1::GenerateRequest>& requests) {
  std::vector<StreamResult> results;
  for (const v1::GenerateRequest& request : requests) {
    results.push_back(RunGenerate(cluster.stub(), request));
    const StreamResult& r = results.back();
    EXPECT_TRUE(r.status.ok()) << "alone: " << r.status.error_code() << ": "
                               << r.status.error_message() << "; prompt \"" << request.prompt()
                               << "\"";
  }
  return results;
}

// Each concurrent result has the route it was forced onto and the same ids
// (and logprob bits, as batch-invariant numerics promise) as alone.
void ExpectSameAsAlone(const std::vector<v1::GenerateRequest>& requests,
                       const std::vector<StreamResult>& alone,
                       const std::vector<StreamResult>& together) {
  ASSERT_EQ(alone.size(), requests.size());
  ASSERT_EQ(together.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const StreamResult& r = together[i];
    ASSERT_TRUE(r.status.ok()) << "request " << i << ": " << r.status.error_code() << ": "
                               << r.status.error_message();
    EXPECT_EQ(r.route, RouteName(requests[i].route_override())) << "request " << i;
    EXPECT_TRUE(r.IndicesAreSequential()) << "request " << i;
    EXPECT_EQ(r.token_ids, alone[i].token_ids)
        << "request " << i << " (" << RouteName(requests[i].route_override()) << ", temperature "
        << requests[i].sampling().temperature() << "): prompt \"" << requests[i].prompt() << "\"";
    std::vector<uint32_t> bits, alone_bits;
    for (float f : r.logprobs) bits.push_back(FloatBits(f));
    for (float f : alone[i].logprobs) alone_bits.push_back(FloatBits(f));
    EXPECT_EQ(bits, alone_bits) << "request " << i << ": logprobs differ from alone";
  }
}

void ExpectNothingHeld(LocalCluster& cluster) {
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster.WaitForIdleWorkers(absl::Seconds(5), &last))
      << "KV blocks or transfers still held: " << last.DebugString();
}

using BatchingTest = OwnClusterTest;

TEST_F(BatchingTest, SixtyFourConcurrentRequestsHalfLocalHalfRemoteMatchAlone) {
  ClusterOptions options;
  options.num_kv_blocks = 1024;  // all 64 fit at once: this test is about batching
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  // Request i: route by bit 0 (LOCAL / REMOTE), sampling by bit 1 (greedy /
  // temperature 0.8 with seed 1000 + i), prompt by bit 2 (a golden prompt
  // with 32 tokens / a random one).
  constexpr size_t kRequests = 64;
  std::mt19937_64 rng(64064);
  std::vector<v1::GenerateRequest> requests;
  for (size_t i = 0; i < kRequests; ++i) {
    const v1::RouteOverride route = i % 2 == 0 ? v1::ROUTE_LOCAL : v1::ROUTE_REMOTE;
    v1::GenerateRequest request;
    if ((i / 4) % 2 == 0) {
      const GoldenCase& g = Goldens()[(i / 8) % Goldens().size()];
      request = MakeRequest(g.prompt, kGoldenMaxTokens, route);
    } else {
      request = RandomRequest(rng, route);
    }
    request.mutable_sampling()->Clear();
    if ((i / 2) % 2 == 1) SetSeededSampling(&request, 0.8f, 1000 + i);
    requests.push_back(request);
  }
  const std::vector<StreamResult> alone = RunEachAlone(cluster(), requests);
  for (size_t i = 0; i < kRequests; i += 8) {  // greedy golden prompts, both routes
    ExpectGolden(alone[i], Goldens()[(i / 8) % Goldens().size()], "local");
    ExpectGolden(alone[i + 1], Goldens()[(i / 8) % Goldens().size()], "remote");
  }
  absl::StatusOr<v1::WorkerStatus> before = cluster().DecodeStatus();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_LE(before->max_decode_batch_size(), 1u) << "requests alone shared a decode step";

  const std::vector<StreamResult> together = RunConcurrently(cluster().stub(), requests);
  ExpectSameAsAlone(requests, alone, together);

  absl::StatusOr<v1::WorkerStatus> d = cluster().DecodeStatus();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_GT(d->max_decode_batch_size(), 1u);
  ExpectNothingHeld(cluster());
}

// ---- Preemption ---------------------------------------------------------------------

TEST_F(BatchingTest, TinyDecodePoolPreemptsAndKeepsEveryToken) {
  // 8 blocks of 16 = 128 token slots per worker. Each request alone fits
  // (prompt + max_tokens <= 113 tokens, <= 8 blocks), together they need
  // four times the pool.
  ClusterOptions options;
  options.num_kv_blocks = 8;
  options.block_size = 16;
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  struct Spec {
    const char* golden;
    uint32_t max_tokens;
    v1::RouteOverride route;
    bool seeded;
  };
  const Spec specs[] = {
      {"once_upon_a_time", 90, v1::ROUTE_LOCAL, false},
      {"the_little_dog", 90, v1::ROUTE_LOCAL, true},
      {"lily_and_ben", 80, v1::ROUTE_LOCAL, false},
      {"boundary_33tok", 80, v1::ROUTE_REMOTE, false},
      {"boundary_32tok", 64, v1::ROUTE_LOCAL, true},
      {"once_upon_a_time", 90, v1::ROUTE_REMOTE, true},
  };
  std::vector<v1::GenerateRequest> requests;
  for (const Spec& s : specs) {
    const GoldenCase& g = Golden(s.golden);
    ASSERT_LE(g.prompt_ids.size() + s.max_tokens, 8u * 16u) << s.golden;
    v1::GenerateRequest request = MakeRequest(g.prompt, s.max_tokens, s.route);
    if (s.seeded) SetSeededSampling(&request, 0.8f, 77);
    requests.push_back(request);
  }
  const std::vector<StreamResult> alone = RunEachAlone(cluster(), requests);
  absl::StatusOr<v1::WorkerStatus> d0 = cluster().DecodeStatus();
  ASSERT_TRUE(d0.ok()) << d0.status();
  EXPECT_EQ(d0->preemptions_total(), 0u) << "a request alone was preempted";

  const std::vector<StreamResult> together = RunConcurrently(cluster().stub(), requests);
  ExpectSameAsAlone(requests, alone, together);

  absl::StatusOr<v1::WorkerStatus> d1 = cluster().DecodeStatus();
  ASSERT_TRUE(d1.ok()) << d1.status();
  EXPECT_GT(d1->preemptions_total(), 0u) << "the pool never ran out: nothing was preempted";
  ExpectNothingHeld(cluster());
}

// ---- Admission -----------------------------------------------------------------------

// The integers in `text` ("needs up to 13 KV blocks ... only 8" -> {13, 8}).
std::set<int64_t> NumbersIn(const std::string& text) {
  std::set<int64_t> numbers;
  for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(" ,;:()[]/="))) {
    int64_t n;
    if (absl::SimpleAtoi(word, &n)) numbers.insert(n);
  }
  return numbers;
}

TEST_F(BatchingTest, RequestThatCanNeverFitIsResourceExhausted) {
  ClusterOptions options;
  options.num_kv_blocks = 8;  // 128 token slots
  options.block_size = 16;
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  struct Oversized {
    const char* golden;
    uint32_t max_tokens;
    int64_t blocks;  // ceil((L + max_tokens) / 16); the same with L + max_tokens - 1
  };
  const Oversized cases[] = {
      {"once_upon_a_time", 200, 13},    // L = 5: the generated tokens do not fit
      {"long_repeated_313tok", 1, 20},  // L = 313: the prompt alone does not fit
  };
  for (const Oversized& c : cases) {
    const GoldenCase& g = Golden(c.golden);
    const StreamResult r = RunGenerate(cluster().stub(), MakeRequest(g.prompt, c.max_tokens));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << c.golden << ": " << r.status.error_code() << ": " << r.status.error_message();
    EXPECT_TRUE(r.token_ids.empty()) << c.golden;
    const std::set<int64_t> numbers = NumbersIn(r.status.error_message());
    EXPECT_EQ(numbers.count(c.blocks), 1u) << "needed blocks not named: " << r.status.error_message();
    EXPECT_EQ(numbers.count(8), 1u) << "pool size not named: " << r.status.error_message();
  }
  // The cluster still serves.
  ExpectNothingHeld(cluster());
  const GoldenCase& g = Golden("once_upon_a_time");
  ExpectGolden(RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens)), g, "local");
  ExpectNothingHeld(cluster());
}

}  // namespace
}  // namespace tandem::testing
