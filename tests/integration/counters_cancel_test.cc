// What a request leaves behind in the workers' counters: the exact KV bytes
// and prefill tokens of a remote prefill, and nothing held after a cancel.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

// KV bytes per prompt token over all layers, from stories260K.gguf's
// metadata: block_count 5 layers x (K and V) x head_count_kv 4 x head_dim 8
// (embedding_length 64 / head_count 8) x 4 bytes (f32 KV cache).
constexpr uint64_t kKvBytesPerToken = 5 * 2 * 4 * 8 * 4;

// The status of worker `name` in a cluster status; fails the test if absent.
v1::WorkerStatus Worker(const v1::ClusterStatus& status, const std::string& name) {
  for (const v1::WorkerStatus& w : status.workers()) {
    if (w.name() == name) return w;
  }
  ADD_FAILURE() << "no worker " << name << " in " << status.DebugString();
  return v1::WorkerStatus();
}

// Its own cluster: the counters must see only this test's request (and a
// decode-side prefix cache must not hold this prompt from an earlier test).
class RemotePrefillCountersTest : public ClusterSuite {
 protected:
  static void SetUpTestSuite() { StartSuiteCluster(ClusterOptions()); }
};

TEST_F(RemotePrefillCountersTest, LongPromptShipsExactKvBytesAndStartsWithBos) {
  const GoldenCase& g = Golden("long_repeated_313tok");
  ASSERT_EQ(g.prompt_ids.size(), 313u);
  absl::StatusOr<v1::ClusterStatus> before = cluster().ClusterStatus();
  ASSERT_TRUE(before.ok()) << before.status();

  StreamResult r = RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens));
  ExpectGolden(r, g, "remote");
  // The golden continuation opens with BOS, an ordinary token when
  // generated; only EOS stops.
  ASSERT_FALSE(r.token_ids.empty());
  EXPECT_EQ(r.token_ids[0], kBosId);
  EXPECT_GT(r.token_ids.size(), 1u);

  absl::StatusOr<v1::ClusterStatus> after = cluster().ClusterStatus();
  ASSERT_TRUE(after.ok()) << after.status();
  const v1::WorkerStatus d0 = Worker(*before, LocalCluster::kDecodeName);
  const v1::WorkerStatus d1 = Worker(*after, LocalCluster::kDecodeName);
  const v1::WorkerStatus p0 = Worker(*before, LocalCluster::kPrefillName);
  const v1::WorkerStatus p1 = Worker(*after, LocalCluster::kPrefillName);
  const uint64_t expected_bytes = kKvBytesPerToken * 313;
  ASSERT_EQ(expected_bytes, 400640u);
  EXPECT_EQ(d1.prefill_tokens_computed_total() - d0.prefill_tokens_computed_total(), 0u);
  EXPECT_EQ(d1.kv_bytes_received_total() - d0.kv_bytes_received_total(), expected_bytes);
  EXPECT_EQ(p1.prefill_tokens_computed_total() - p0.prefill_tokens_computed_total(), 313u);
  EXPECT_EQ(p1.kv_bytes_sent_total() - p0.kv_bytes_sent_total(), expected_bytes);
}

// Issue #16: CPU workers under kv.transport auto support tcp only; D's
// offer reaches P through the router and the bytes are counted under tcp,
// on both sides, and under nothing else.
TEST_F(RemotePrefillCountersTest, KvTransportBytesAreCountedUnderTcp) {
  absl::StatusOr<v1::ClusterStatus> before = cluster().ClusterStatus();
  ASSERT_TRUE(before.ok()) << before.status();
  // A prompt no other test sends (nothing of it cached), long enough to be
  // prefilled remotely.
  std::string prompt;
  for (int i = 0; i < 6; ++i) prompt += "The small red fox ran over the hill to find a friend. ";
  StreamResult r = RunGenerate(cluster().stub(), MakeRequest(prompt, 2));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.route, "remote");
  absl::StatusOr<v1::ClusterStatus> after = cluster().ClusterStatus();
  ASSERT_TRUE(after.ok()) << after.status();
  const v1::WorkerStatus d0 = Worker(*before, LocalCluster::kDecodeName);
  const v1::WorkerStatus d1 = Worker(*after, LocalCluster::kDecodeName);
  const v1::WorkerStatus p0 = Worker(*before, LocalCluster::kPrefillName);
  const v1::WorkerStatus p1 = Worker(*after, LocalCluster::kPrefillName);
  const uint64_t sent = p1.kv_bytes_sent_total() - p0.kv_bytes_sent_total();
  EXPECT_GT(sent, 0u);
  EXPECT_EQ(sent % kKvBytesPerToken, 0u);
  EXPECT_EQ(d1.kv_bytes_received_total() - d0.kv_bytes_received_total(), sent);
  for (const v1::WorkerStatus* w : {&d0, &d1, &p0, &p1}) {
    SCOPED_TRACE(w->name());
    ASSERT_EQ(w->kv_bytes_by_transport().size(), 1u);
    ASSERT_EQ(w->kv_bytes_by_transport().count("tcp"), 1u);
  }
  EXPECT_EQ(p1.kv_bytes_by_transport().at("tcp") - p0.kv_bytes_by_transport().at("tcp"), sent);
  EXPECT_EQ(d1.kv_bytes_by_transport().at("tcp") - d0.kv_bytes_by_transport().at("tcp"), sent);
}

// ---- Cancel after the first token ------------------------------------------------

class CancelTest : public DefaultClusterSuite,
                   public ::testing::WithParamInterface<v1::RouteOverride> {};

TEST_P(CancelTest, CancelAfterFirstTokenFreesEverything) {
  const GoldenCase& g = Golden("long_repeated_313tok");
  // As long as the context allows, so the request is still decoding when
  // the cancel arrives.
  const uint32_t max_tokens = kContextLength - static_cast<uint32_t>(g.prompt_ids.size());
  absl::StatusOr<v1::WorkerStatus> d0 = cluster().DecodeStatus();
  ASSERT_TRUE(d0.ok()) << d0.status();

  GenerateStream stream(cluster().stub(), MakeRequest(g.prompt, max_tokens, GetParam()));
  ASSERT_TRUE(stream.ReadUntilFirstToken()) << stream.Finish().status.error_message();
  EXPECT_EQ(stream.result().route, RouteName(GetParam()));
  stream.Cancel();
  const StreamResult& r = stream.Finish();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED) << r.status.error_message();

  v1::ClusterStatus last;
  EXPECT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(2), &last))
      << "still busy 2 s after the cancel: " << last.DebugString();
  // The cancel reached the decode worker: it stopped well before max_tokens.
  absl::StatusOr<v1::WorkerStatus> d1 = cluster().DecodeStatus();
  ASSERT_TRUE(d1.ok()) << d1.status();
  EXPECT_EQ(d1->running_requests(), 0u);
  EXPECT_LT(d1->decode_tokens_total() - d0->decode_tokens_total(), max_tokens - 1)
      << "the request ran to max_tokens: the cancel never reached the decode worker";
}

INSTANTIATE_TEST_SUITE_P(Routes, CancelTest,
                         ::testing::Values(v1::ROUTE_LOCAL, v1::ROUTE_REMOTE),
                         [](const ::testing::TestParamInfo<v1::RouteOverride>& info) {
                           return RouteName(info.param);
                         });

}  // namespace
}  // namespace tandem::testing
