// A cluster whose CPU workers hold their KV cache in F16
// (engine.kv_cache_dtype: f16, issue #19), through real processes: the
// workers report the f16 layout id; every stories260K golden case gives the
// same ids and first-logprob bits by remote prefill (16-bit rows sent from
// the prefill worker) and by local prefill (after the remote one, so the
// decode worker's prefix cache serves blocks of received 16-bit rows), and
// those ids are llama.cpp's F16-KV greedy ids (generated_token_ids) up to
// strict_prefix_len; the prefill worker sends 2 bytes per element.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"
#include "tests/test_util.h"

namespace tandem::testing {
namespace {

using Kv16ClusterTest = OwnClusterTest;

// stories260K: 5 layers, K and V, 4 KV heads x 8, F16: bytes per token.
constexpr uint64_t kF16BytesPerToken = 5 * 2 * 32 * 2;

TEST_F(Kv16ClusterTest, RemoteAndLocalPrefillGiveTheF16GoldenIds) {
  ClusterOptions options;
  options.kv_cache_dtype = "f16";
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  for (const absl::StatusOr<v1::WorkerStatus>& s :
       {cluster().PrefillStatus(), cluster().DecodeStatus()}) {
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(absl::EndsWith(s->kv_layout_id(), "/L5.H4.D8/f16")) << s->kv_layout_id();
  }
  const nlohmann::json goldens =
      nlohmann::json::parse(ReadFileOrDie(SharedPath("goldens/stories260K_greedy.json")));
  uint64_t remote_prompt_tokens = 0;
  for (const nlohmann::json& c : goldens.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(name);
    const auto f16_ids = c.at("generated_token_ids").get<std::vector<int32_t>>();
    const size_t strict = c.at("strict_prefix_len").get<size_t>();
    const std::string prompt = c.at("prompt").get<std::string>();
    const StreamResult remote =
        RunGenerate(cluster().stub(), MakeRequest(prompt, kGoldenMaxTokens, v1::ROUTE_REMOTE));
    const StreamResult local =
        RunGenerate(cluster().stub(), MakeRequest(prompt, kGoldenMaxTokens, v1::ROUTE_LOCAL));
    ASSERT_TRUE(remote.status.ok()) << remote.status.error_message();
    ASSERT_TRUE(local.status.ok()) << local.status.error_message();
    EXPECT_EQ(remote.route, "remote");
    EXPECT_EQ(local.route, "local");
    remote_prompt_tokens += remote.prompt_token_ids.size();
    EXPECT_EQ(remote.token_ids, local.token_ids);
    ASSERT_FALSE(remote.logprobs.empty());
    ASSERT_FALSE(local.logprobs.empty());
    EXPECT_EQ(FloatBits(remote.logprobs[0]), FloatBits(local.logprobs[0]));
    ASSERT_GE(remote.token_ids.size(), strict);
    EXPECT_EQ(std::vector<int32_t>(remote.token_ids.begin(), remote.token_ids.begin() + strict),
              std::vector<int32_t>(f16_ids.begin(), f16_ids.begin() + strict));
  }
  // Rows went out as F16: a whole number of 2-byte tokens, at most every
  // prompt token of the remote requests.
  absl::StatusOr<v1::WorkerStatus> p = cluster().PrefillStatus();
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GT(p->kv_bytes_sent_total(), 0u);
  EXPECT_EQ(p->kv_bytes_sent_total() % kF16BytesPerToken, 0u);
  EXPECT_LE(p->kv_bytes_sent_total(), remote_prompt_tokens * kF16BytesPerToken);
}

}  // namespace
}  // namespace tandem::testing
