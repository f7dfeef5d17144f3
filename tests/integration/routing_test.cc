// router.policy with real processes (issue #13, item 2): two decode
// workers, sequential requests with short distinct prompts (nothing cached
// anywhere). The router polls no status during a test (poll period 60 s),
// so both workers stay equal and idle to it: kv_aware takes them in turn
// and logs each choice with its score; round_robin alternates too. The
// workers' own decode counters agree with the headers. (Scores from
// polled load: tests/router/worker_registry_test.cc.) With one prefill
// worker and real status polls: 8 distinct long prompts, then each again,
// the repeats go to the decode worker that holds the prompt's blocks (the
// router's prefix index, fed by KV events) and are served from its cache.
#include <algorithm>
#include <map>
#include <regex>
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

// 8 distinct long prompts over 2 decode workers (prefilled remotely by P,
// the KV shipped to the chosen D, which caches the full blocks), then each
// prompt again: every repeat lands on the decode worker that served it
// first and reports every full block before the last prompt token as
// cached. Without the index a repeat would find its worker by chance (all
// 8: 1/256).
TEST_F(RoutingPolicyTest, KvAwareSendsARepeatedPromptToTheWorkerHoldingItsPrefix) {
  ClusterOptions o = Options("");
  o.num_prefill_workers = 1;
  o.poll_interval_ms = 200;  // real polls: load and free blocks as a user has them
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  static const char* const kOpenings[] = {"Tom",  "Lily", "A big dog", "The old man",
                                          "Sue",  "Ben",  "A small cat", "The queen"};
  const std::string body =
      " went to the park with a red ball. The sun was warm and the sky was blue. They played "
      "and ran and laughed until it was time to go home for dinner. At home, mom made soup "
      "and bread, and everyone was happy.";
  std::vector<std::string> first(8);
  std::vector<uint32_t> prompt_tokens(8);
  for (int i = 0; i < 8; ++i) {
    const StreamResult r =
        RunGenerate(cluster().stub(), MakeRequest(kOpenings[i] + body, 4), absl::Seconds(60));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(r.route, "remote") << i;  // longer than max_local_prefill_tokens
    ASSERT_GT(r.prompt_tokens, 3 * 16u) << i;
    EXPECT_EQ(r.cached_prompt_tokens, 0u) << i;
    first[i] = r.decode_worker;
    prompt_tokens[i] = r.prompt_tokens;
  }
  // Nothing shared: the first round spreads over both decode workers.
  EXPECT_GE(std::count(first.begin(), first.end(), "decode-0"), 2);
  EXPECT_GE(std::count(first.begin(), first.end(), "decode-1"), 2);
  // The index has caught up with each decode worker's own cache (events
  // are asynchronous) before the repeats.
  ASSERT_TRUE(PollUntil(absl::Seconds(10), [&] {
    absl::StatusOr<v1::ClusterStatus> status = cluster().ClusterStatus();
    if (!status.ok()) return false;
    for (const v1::WorkerStatus& w : status->workers()) {
      if (w.role() != v1::ROLE_DECODE) continue;
      if (w.kv_blocks_cached() == 0 || w.kv_index_blocks() != w.kv_blocks_cached()) return false;
    }
    return true;
  }));
  for (int i = 0; i < 8; ++i) {
    const StreamResult r =
        RunGenerate(cluster().stub(), MakeRequest(kOpenings[i] + body, 4), absl::Seconds(60));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.decode_worker, first[i]) << "repeat of prompt " << i;
    // D's local prefix hit: every full block before the last prompt token.
    EXPECT_EQ(r.cached_prompt_tokens, (prompt_tokens[i] - 1) / 16 * 16) << "prompt " << i;
  }
  const std::string log = cluster().CapturedStderr();
  // The repeats' log lines show the index's hit (the first round's show 0/L).
  const std::regex hit(
      R"(: decode worker decode-[01] \(kv_aware score [-0-9.]+: [1-9][0-9]*/[0-9]+ prompt tokens cached)");
  int hits = 0;
  for (const std::string& line : Lines(log)) hits += std::regex_search(line, hit);
  EXPECT_EQ(hits, 8) << log;
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
