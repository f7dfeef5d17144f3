// router.policy with real processes (issue #13, item 2): two decode
// workers, sequential requests with short distinct prompts (nothing cached
// anywhere). The router polls no status during a test (poll period 60 s),
// so both workers stay equal and idle to it: kv_aware takes them in turn
// and logs each choice with its score; round_robin alternates too. The
// workers' own decode counters agree with the headers. (Scores from
// polled load: tests/router/worker_registry_test.cc.)
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

class RoutingPolicyTest : public OwnClusterTest {
 protected:
  static ClusterOptions Options(const std::string& policy) {
    ClusterOptions o;
    o.num_prefill_workers = 0;
    o.num_decode_workers = 2;
    o.router_policy = policy;
    o.capture_stderr = true;
    o.poll_interval_ms = 60000;  // no poll: no stale load in the scores
    return o;
  }

  // Runs `count` requests one after the other, each a different short
  // prompt; returns the decode worker of each.
  std::vector<std::string> RunSequential(int count) {
    static const char* const kPrompts[] = {"One day a cat", "The sun was hot",
                                           "A little boy ran", "She found a red ball",
                                           "Tom had a big dog", "The bird sang",
                                           "Lily went to the park", "Once a frog jumped"};
    std::vector<std::string> workers;
    for (int i = 0; i < count; ++i) {
      v1::GenerateRequest request = MakeRequest(kPrompts[i % 8], 4);
      request.set_ignore_eos(true);  // 4 tokens: token 0 from the prefill, 3 decoded
      const StreamResult r = RunGenerate(cluster().stub(), request, absl::Seconds(60));
      EXPECT_TRUE(r.status.ok()) << r.status.error_message();
      workers.push_back(r.decode_worker);
    }
    return workers;
  }

  // decode_tokens_total of each worker, from the router's cluster status.
  std::map<std::string, uint64_t> DecodeTokens() {
    std::map<std::string, uint64_t> tokens;
    absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
    EXPECT_TRUE(status.ok()) << status.status();
    if (!status.ok()) return tokens;
    for (const v1::WorkerStatus& w : status->workers()) {
      if (w.role() == v1::ROLE_DECODE) tokens[w.name()] = w.decode_tokens_total();
    }
    return tokens;
  }
};

TEST_F(RoutingPolicyTest, KvAwareSpreadsRequestsThatShareNothing) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(Options("")));  // kv_aware is the default
  const std::vector<std::string> workers = RunSequential(8);
  EXPECT_THAT(workers, ::testing::ElementsAre("decode-0", "decode-1", "decode-0", "decode-1",
                                              "decode-0", "decode-1", "decode-0", "decode-1"));
  uint64_t on_0 = 0;
  for (const std::string& w : workers) on_0 += w == "decode-0";
  // The workers' own counters agree: 3 decoded tokens per request served.
  const std::map<std::string, uint64_t> tokens = DecodeTokens();
  EXPECT_EQ(tokens.at("decode-0"), 3 * on_0);
  EXPECT_EQ(tokens.at("decode-1"), 3 * (8 - on_0));
  // One line per request names the chosen worker with its score.
  const std::string log = cluster().CapturedStderr();
  EXPECT_TRUE(absl::StrContains(log, "routing policy: kv_aware (prefix_weight 1"));
  int lines = 0;
  for (const std::string& line : Lines(log)) {
    if (absl::StrContains(line, ": decode worker decode-") &&
        absl::StrContains(line, "(kv_aware score 0.25: 0/") &&
        absl::StrContains(line, " prompt tokens cached, blocks not polled yet, 0 running, "
                                "0 waiting, 0 in flight)")) {
      ++lines;
    }
  }
  EXPECT_EQ(lines, 8) << log;
}

TEST_F(RoutingPolicyTest, RoundRobinAlternates) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(Options("round_robin")));
  EXPECT_THAT(RunSequential(4),
              ::testing::ElementsAre("decode-0", "decode-1", "decode-0", "decode-1"));
  const std::string log = cluster().CapturedStderr();
  EXPECT_TRUE(absl::StrContains(log, "routing policy: round_robin"));
  EXPECT_TRUE(absl::StrContains(log, ": decode worker decode-1 (round_robin)")) << log;
}

}  // namespace
}  // namespace tandem::testing
