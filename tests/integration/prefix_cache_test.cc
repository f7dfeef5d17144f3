// Prefix caching through the router (DESIGN.md, Engine: prefix cache; issue
// #3): repeated prompts are served from cached blocks with the same ids, a
// remote request whose every full block D already holds moves zero KV
// bytes, a local hit still computes the last prompt token, identical
// requests at once share nothing they must not, and the P -> D handoff at
// block boundaries (L = 16, 32, 48; token 0 opens a new block) gives the
// same ids on both routes. Each test starts its own cluster, so every cache
// starts empty.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

constexpr uint32_t kBlockSize = 16;  // ClusterOptions().block_size

using PrefixCacheTest = OwnClusterTest;

TEST_F(PrefixCacheTest, TwoIdentical313TokenRequestsAtOnceGiveGoldenIds) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ClusterOptions()));
  const GoldenCase& g = Golden("long_repeated_313tok");
  ASSERT_EQ(g.prompt_ids.size(), 313u);
  const v1::GenerateRequest request = MakeRequest(g.prompt, kGoldenMaxTokens);
  const std::vector<StreamResult> results =
      RunConcurrently(cluster().stub(), {request, request});
  for (const StreamResult& r : results) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    // Remote unless the other one's prompt blocks were already published
    // when this one was admitted (then a local prefix hit).
    ExpectGolden(r, g, r.route);
  }
  EXPECT_NE(results[0].request_id, results[1].request_id);

  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(2), &last))
      << "blocks or transfers still held: " << last.DebugString();
  for (const v1::WorkerStatus& w : last.workers()) {
    EXPECT_GT(w.kv_blocks_cached(), 0u) << w.name() << " cached none of the prompt";
  }
}

TEST_F(PrefixCacheTest, LongPromptTwiceSecondIsServedFromTheCache) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ClusterOptions()));
  const GoldenCase& g = Golden("long_repeated_313tok");
  const StreamResult first = RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens));
  ExpectGolden(first, g, "remote");
  EXPECT_EQ(first.cached_prompt_tokens, 0u);

  const StreamResult second =
      RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens));
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  // D now holds the prompt's full blocks, so what is left fits a local
  // prefill; whichever route, the ids must not change.
  ExpectGolden(second, g, second.route);
  EXPECT_GT(second.cached_prompt_tokens, 0u);
  EXPECT_LT(second.cached_prompt_tokens, g.prompt_ids.size());
  EXPECT_EQ(second.token_ids, first.token_ids);
}

// boundary_32tok: L = 32 = 2 full blocks.
TEST_F(PrefixCacheTest, FullBlockPromptTwiceRemoteMovesZeroKvBytes) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ClusterOptions()));
  const GoldenCase& g = Golden("boundary_32tok");
  ASSERT_EQ(g.prompt_ids.size(), 2 * kBlockSize);
  const v1::GenerateRequest request = MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_REMOTE);

  absl::StatusOr<v1::WorkerStatus> d0 = cluster().DecodeStatus();
  ASSERT_TRUE(d0.ok()) << d0.status();
  ExpectGolden(RunGenerate(cluster().stub(), request), g, "remote");
  absl::StatusOr<v1::WorkerStatus> d1 = cluster().DecodeStatus();
  absl::StatusOr<v1::WorkerStatus> p1 = cluster().PrefillStatus();
  ASSERT_TRUE(d1.ok()) << d1.status();
  ASSERT_TRUE(p1.ok()) << p1.status();
  EXPECT_GT(d1->kv_bytes_received_total(), d0->kv_bytes_received_total());

  // D holds both full blocks: NeedRemotePrefill.hit_tokens = L, and P sends
  // [L, L) -- nothing but FINAL.
  const StreamResult second = RunGenerate(cluster().stub(), request);
  ExpectGolden(second, g, "remote");
  absl::StatusOr<v1::WorkerStatus> d2 = cluster().DecodeStatus();
  absl::StatusOr<v1::WorkerStatus> p2 = cluster().PrefillStatus();
  ASSERT_TRUE(d2.ok()) << d2.status();
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_EQ(d2->kv_bytes_received_total() - d1->kv_bytes_received_total(), 0u);
  EXPECT_EQ(p2->kv_bytes_sent_total() - p1->kv_bytes_sent_total(), 0u);
  // D computed no prompt token itself.
  EXPECT_EQ(d2->prefill_tokens_computed_total(), d1->prefill_tokens_computed_total());

  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(2), &last)) << last.DebugString();
}

TEST_F(PrefixCacheTest, FullBlockPromptTwiceLocalStillComputesLastToken) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(ClusterOptions()));
  const GoldenCase& g = Golden("boundary_32tok");
  const uint32_t prompt_len = static_cast<uint32_t>(g.prompt_ids.size());
  ASSERT_EQ(prompt_len, 2 * kBlockSize);
  const v1::GenerateRequest request = MakeRequest(g.prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL);

  const StreamResult first = RunGenerate(cluster().stub(), request);
  ExpectGolden(first, g, "local");
  EXPECT_EQ(first.cached_prompt_tokens, 0u);
  absl::StatusOr<v1::WorkerStatus> d1 = cluster().DecodeStatus();
  ASSERT_TRUE(d1.ok()) << d1.status();

  // A local hit is capped at floor((L - 1) / block_size) * block_size = 16:
  // the last prompt token's logits must be computed.
  const uint32_t expected_hit = (prompt_len - 1) / kBlockSize * kBlockSize;
  ASSERT_EQ(expected_hit, 16u);
  const StreamResult second = RunGenerate(cluster().stub(), request);
  ExpectGolden(second, g, "local");
  EXPECT_EQ(second.cached_prompt_tokens, expected_hit);
  EXPECT_EQ(second.token_ids, first.token_ids);
  absl::StatusOr<v1::WorkerStatus> d2 = cluster().DecodeStatus();
  ASSERT_TRUE(d2.ok()) << d2.status();
  // Prompt tokens computed: L - hit; decode steps are counted separately.
  EXPECT_EQ(d2->prefill_tokens_computed_total() - d1->prefill_tokens_computed_total(),
            prompt_len - expected_hit);
}

// ---- Handoff at block boundaries --------------------------------------------------

class BlockBoundaryHandoffTest : public OwnClusterTest,
                                 public ::testing::WithParamInterface<size_t> {};

TEST_P(BlockBoundaryHandoffTest, LocalAndRemoteGiveSameIds) {
  // Without prefix caching, both routes compute the whole prompt; the
  // remote one hands over exactly L tokens and token 0 opens block L / 16.
  ClusterOptions options;
  options.enable_prefix_caching = false;
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  const size_t prompt_len = GetParam();
  const GoldenCase& g32 = Golden("boundary_32tok");
  std::string prompt;
  if (prompt_len == g32.prompt_ids.size()) {
    prompt = g32.prompt;
  } else {
    absl::StatusOr<std::string> made = PromptWithTokenCount(cluster().stub(), prompt_len);
    ASSERT_TRUE(made.ok()) << made.status();
    prompt = *made;
  }
  const StreamResult local =
      RunGenerate(cluster().stub(), MakeRequest(prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL));
  const StreamResult remote =
      RunGenerate(cluster().stub(), MakeRequest(prompt, kGoldenMaxTokens, v1::ROUTE_REMOTE));
  ASSERT_TRUE(local.status.ok()) << local.status.error_message();
  ASSERT_TRUE(remote.status.ok()) << remote.status.error_message();
  EXPECT_EQ(local.route, "local");
  EXPECT_EQ(remote.route, "remote");
  EXPECT_EQ(local.prompt_token_ids.size(), prompt_len) << prompt;
  EXPECT_EQ(local.token_ids.size(), kGoldenMaxTokens);
  EXPECT_EQ(remote.token_ids, local.token_ids) << "prompt of " << prompt_len << " tokens";
  if (prompt_len == g32.prompt_ids.size()) {
    ExpectGolden(local, g32, "local");
    ExpectGolden(remote, g32, "remote");
  }
  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(2), &last)) << last.DebugString();
}

INSTANTIATE_TEST_SUITE_P(Blocks, BlockBoundaryHandoffTest,
                         ::testing::Values(1 * kBlockSize, 2 * kBlockSize, 3 * kBlockSize),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::to_string(info.param) + "_tokens";
                         });

}  // namespace
}  // namespace tandem::testing
