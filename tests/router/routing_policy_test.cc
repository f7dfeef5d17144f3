// router/routing_policy: each input moves the kv_aware score by exactly its
// documented term, the explanation names the inputs, equal scores are taken
// in turn, and least_loaded / round_robin choose as documented. Values are
// chosen so every term is an exact binary fraction.
#include "router/routing_policy.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

RoutingOptions KvAware() {
  RoutingOptions o;  // weights 1, 0.25, 1, 1; 64 sequences, 2048 tokens per step
  o.policy = RouterPolicy::kKvAware;
  return o;
}

Candidate Idle(const std::string& name) {
  Candidate c;
  c.name = name;
  c.kv_blocks_total = 2048;
  return c;
}

// The names chosen by `count` choices in a row from `candidates`.
std::vector<std::string> Choose(const std::vector<Candidate>& candidates, bool decode,
                                const RoutingOptions& options, int count, uint64_t* cursor) {
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) {
    std::optional<Choice> choice = ChooseCandidate(candidates, decode, 200, options, cursor);
    names.push_back(choice.has_value() ? candidates[choice->index].name : "none");
  }
  return names;
}

TEST(RoutingPolicyTest, DecodeScoreIsTheDocumentedSum) {
  Candidate c = Idle("decode-0");
  c.cached_prefix_tokens = 150;  // 150/200 = 0.75
  c.kv_blocks_in_use = 512;      // 1536/2048 free = 0.75, x 0.25
  c.running = 8;
  c.waiting = 4;
  c.in_flight = 4;  // 16/64 = 0.25
  const Scored s = ScoreCandidate(c, /*decode=*/true, 200, KvAware());
  EXPECT_EQ(s.score, 0.75 + 0.1875 - 0.25);
  EXPECT_EQ(s.explanation,
            "kv_aware score 0.69: 150/200 prompt tokens cached, 1536/2048 blocks free, "
            "8 running, 4 waiting, 4 in flight");
}

TEST(RoutingPolicyTest, EachDecodeInputMovesTheScoreByItsTerm) {
  const RoutingOptions o = KvAware();
  const Candidate base = Idle("d");
  const double s0 = ScoreCandidate(base, true, 200, o).score;
  EXPECT_EQ(s0, 0.25);  // nothing cached, all blocks free, no load

  Candidate c = base;
  c.cached_prefix_tokens = 50;  // + 1.0 x 50/200
  EXPECT_EQ(ScoreCandidate(c, true, 200, o).score, s0 + 0.25);
  c = base;
  c.kv_blocks_in_use = 1024;  // half the blocks: - 0.25 x 0.5
  EXPECT_EQ(ScoreCandidate(c, true, 200, o).score, s0 - 0.125);
  for (int input = 0; input < 3; ++input) {
    c = base;
    if (input == 0) c.running = 2;
    if (input == 1) c.waiting = 2;
    if (input == 2) c.in_flight = 2;
    EXPECT_EQ(ScoreCandidate(c, true, 200, o).score, s0 - 2.0 / 64) << "input " << input;
  }
  // The weights scale their terms; 0 removes one.
  RoutingOptions weighted = o;
  weighted.weights.prefix_weight = 2;
  weighted.weights.free_blocks_weight = 0;
  weighted.weights.load_weight = 0.5;
  c = base;
  c.cached_prefix_tokens = 100;
  c.kv_blocks_in_use = 2048;
  c.running = 16;
  EXPECT_EQ(ScoreCandidate(c, true, 200, weighted).score, 2 * 0.5 - 0.5 * 0.25);
  // The load is per engine.max_num_seqs.
  weighted.max_num_seqs = 16;
  EXPECT_EQ(ScoreCandidate(c, true, 200, weighted).score, 2 * 0.5 - 0.5 * 1.0);
}

// The polled running + waiting less this router's requests counted in it,
// plus this router's requests now.
TEST(RoutingPolicyTest, LoadCountsThisRoutersRequestsOnce) {
  Candidate c = Idle("d");
  c.running = 3;
  c.waiting = 1;
  c.in_flight_at_poll = 2;  // two of the four polled were ours
  c.in_flight = 1;          // one of them has finished since
  EXPECT_EQ(CandidateLoad(c), 3);
  EXPECT_EQ(ScoreCandidate(c, true, 200, KvAware()).score, 0.25 - 3.0 / 64);
  c.in_flight_at_poll = 6;  // more than polled (the poll raced a start)
  EXPECT_EQ(CandidateLoad(c), 1);
  RoutingOptions least;
  least.policy = RouterPolicy::kLeastLoaded;
  EXPECT_EQ(ScoreCandidate(c, true, 200, least).score, -1.0);
  // A poll that saw our one request, which has ended since: idle again.
  Candidate ended = Idle("e");
  ended.running = 1;
  ended.in_flight_at_poll = 1;
  EXPECT_EQ(CandidateLoad(ended), 0);
}

TEST(RoutingPolicyTest, DecodeEdgeCases) {
  const RoutingOptions o = KvAware();
  Candidate c;  // never polled: free blocks count as all free
  c.name = "new";
  Scored s = ScoreCandidate(c, true, 200, o);
  EXPECT_EQ(s.score, 0.25);
  EXPECT_EQ(s.explanation,
            "kv_aware score 0.25: 0/200 prompt tokens cached, blocks not polled yet, 0 running, "
            "0 waiting, 0 in flight");
  // More cached than the prompt (a stale index) counts as the whole prompt;
  // an empty prompt has no prefix term.
  c = Idle("d");
  c.cached_prefix_tokens = 300;
  EXPECT_EQ(ScoreCandidate(c, true, 200, o).score, 1.25);
  EXPECT_EQ(ScoreCandidate(c, true, 0, o).score, 0.25);
  // More blocks in use than total (a torn status) counts as none free.
  c.kv_blocks_in_use = 4096;
  EXPECT_EQ(ScoreCandidate(c, true, 0, o).score, 0.0);
}

TEST(RoutingPolicyTest, PrefillScoreIsTheDocumentedSum) {
  const RoutingOptions o = KvAware();
  Candidate c = Idle("prefill-0");
  c.cached_prefix_tokens = 100;       // + 0.5
  c.queued_prefill_tokens = 1024;     // - 1.0 x 1024/2048
  c.in_flight = 2;                    // - 1.0 x 2/64
  c.kv_blocks_in_use = 2048;          // not a prefill input
  c.running = 7;                      // not a prefill input
  const Scored s = ScoreCandidate(c, /*decode=*/false, 200, o);
  EXPECT_EQ(s.score, 0.5 - 0.5 - 2.0 / 64);
  EXPECT_EQ(s.explanation,
            "kv_aware score -0.03: 100/200 prompt tokens cached, 1024 queued prefill tokens, "
            "2 in flight");
  // Each input moves it by its own term.
  const Candidate base = Idle("p");
  const double s0 = ScoreCandidate(base, false, 200, o).score;
  EXPECT_EQ(s0, 0.0);
  Candidate more = base;
  more.cached_prefix_tokens = 200;
  EXPECT_EQ(ScoreCandidate(more, false, 200, o).score, s0 + 1.0);
  more = base;
  more.queued_prefill_tokens = 512;
  EXPECT_EQ(ScoreCandidate(more, false, 200, o).score, s0 - 0.25);
  RoutingOptions queue_heavy = o;
  queue_heavy.weights.prefill_queue_weight = 4;
  queue_heavy.max_num_batched_tokens = 1024;
  EXPECT_EQ(ScoreCandidate(more, false, 200, queue_heavy).score, s0 - 2.0);
}

TEST(RoutingPolicyTest, CachedPrefixOutweighsModestLoadButNotSaturation) {
  RoutingOptions o = KvAware();
  Candidate warm = Idle("a-warm");
  warm.cached_prefix_tokens = 192;
  warm.running = 10;
  const Candidate cold = Idle("b-cold");
  uint64_t cursor = 0;
  EXPECT_THAT(Choose({warm, cold}, true, o, 3, &cursor),
              ::testing::ElementsAre("a-warm", "a-warm", "a-warm"));
  warm.running = 40;
  warm.waiting = 30;  // 70/64 sequences' worth of load
  EXPECT_THAT(Choose({warm, cold}, true, o, 1, &cursor), ::testing::ElementsAre("b-cold"));
  // A prefill worker with a long queue loses to an idle one with nothing
  // cached.
  Candidate queued = Idle("a-queued");
  queued.cached_prefix_tokens = 100;  // + 0.5
  queued.queued_prefill_tokens = 4096;  // - 2.0
  EXPECT_THAT(Choose({queued, Idle("b-idle")}, false, o, 1, &cursor),
              ::testing::ElementsAre("b-idle"));
}

TEST(RoutingPolicyTest, EqualScoresAreTakenInTurn) {
  const RoutingOptions o = KvAware();
  uint64_t cursor = 0;
  EXPECT_THAT(Choose({Idle("d0"), Idle("d1")}, true, o, 4, &cursor),
              ::testing::ElementsAre("d0", "d1", "d0", "d1"));
  EXPECT_EQ(cursor, 4u);
  // A worse candidate is never taken; the two best alternate.
  Candidate busy = Idle("d2");
  busy.in_flight = 1;
  EXPECT_THAT(Choose({Idle("d0"), busy, Idle("d1")}, true, o, 4, &cursor),
              ::testing::ElementsAre("d0", "d1", "d0", "d1"));
  // Prefill picks break ties the same way.
  EXPECT_THAT(Choose({Idle("p0"), Idle("p1")}, false, o, 2, &cursor),
              ::testing::ElementsAre("p0", "p1"));
}

TEST(RoutingPolicyTest, LeastLoadedCountsRunningWaitingAndInFlight) {
  RoutingOptions o;
  o.policy = RouterPolicy::kLeastLoaded;
  Candidate a = Idle("a");
  a.running = 1;
  a.waiting = 2;
  a.in_flight = 3;
  a.cached_prefix_tokens = 200;  // ignored by least_loaded
  Candidate b = Idle("b");
  b.running = 5;
  Candidate c = Idle("c");
  c.waiting = 5;
  const Scored s = ScoreCandidate(a, true, 200, o);
  EXPECT_EQ(s.score, -6.0);
  EXPECT_EQ(s.explanation, "least_loaded: 1 running, 2 waiting, 3 in flight");
  uint64_t cursor = 0;
  EXPECT_THAT(Choose({a, b, c}, true, o, 4, &cursor),
              ::testing::ElementsAre("b", "c", "b", "c"));
  b.in_flight = 1;
  EXPECT_THAT(Choose({a, b, c}, true, o, 2, &cursor), ::testing::ElementsAre("c", "c"));
}

TEST(RoutingPolicyTest, RoundRobinRotatesOverEveryCandidate) {
  RoutingOptions o;
  o.policy = RouterPolicy::kRoundRobin;
  Candidate busy = Idle("b");
  busy.running = 50;
  uint64_t cursor = 0;
  EXPECT_THAT(Choose({Idle("a"), busy, Idle("c")}, true, o, 4, &cursor),
              ::testing::ElementsAre("a", "b", "c", "a"));
  EXPECT_EQ(ScoreCandidate(busy, false, 200, o).explanation, "round_robin");
}

TEST(RoutingPolicyTest, PredictedQueueWaitIsQueuedTokensOverTheMeasuredRate) {
  Candidate c;
  c.queued_prefill_tokens = 6000;
  EXPECT_EQ(PredictedQueueWaitSeconds(c), 0.0);  // no rate yet: starts at once
  c.prefill_tokens_per_s = 1500;
  EXPECT_EQ(PredictedQueueWaitSeconds(c), 4.0);
  c.queued_prefill_tokens = 0;
  EXPECT_EQ(PredictedQueueWaitSeconds(c), 0.0);
}

// placement slo: a prefill worker is picked by when it would finish this
// prompt: (queued + uncached prompt tokens) / its rate.
TEST(RoutingPolicyTest, PrefillByFinishTimePicksTheEarliestFinish) {
  RoutingOptions options = KvAware();
  options.prefill_by_finish_time = true;
  Candidate busy = Idle("busy");  // 1000 queued at 1000 tokens/s: 1 s + 0.2 s
  busy.queued_prefill_tokens = 1000;
  busy.prefill_tokens_per_s = 1000;
  Candidate slow = Idle("slow");  // nothing queued, 250 tokens/s: 0.8 s
  slow.prefill_tokens_per_s = 250;
  Candidate cached = Idle("cached");  // 600 queued at 1000/s, 150 of 200 cached: 0.65 s
  cached.queued_prefill_tokens = 600;
  cached.prefill_tokens_per_s = 1000;
  cached.cached_prefix_tokens = 150;
  EXPECT_DOUBLE_EQ(PredictedFinishSeconds(busy, 200), 1.2);
  EXPECT_DOUBLE_EQ(PredictedFinishSeconds(slow, 200), 0.8);
  EXPECT_DOUBLE_EQ(PredictedFinishSeconds(cached, 200), 0.65);
  uint64_t cursor = 0;
  EXPECT_EQ(Choose({busy, slow, cached}, /*decode=*/false, options, 1, &cursor),
            std::vector<std::string>{"cached"});
  const Scored scored = ScoreCandidate(cached, false, 200, options);
  EXPECT_DOUBLE_EQ(scored.score, -0.65);
  EXPECT_THAT(scored.explanation, ::testing::HasSubstr("predicted finish 650.0 ms"));
  // Decode picks are unchanged by it.
  EXPECT_EQ(ScoreCandidate(busy, true, 200, options).score,
            ScoreCandidate(busy, true, 200, KvAware()).score);
  // This router's calls since the poll count at once: 600 polled of which
  // 200 were ours then; 500 of ours now -> 400 + 500 queued.
  cached.prefill_tokens_in_flight_at_poll = 200;
  cached.prefill_tokens_in_flight = 500;
  EXPECT_EQ(QueuedPrefillTokensNow(cached), 900);
  EXPECT_DOUBLE_EQ(PredictedFinishSeconds(cached, 200), 0.95);
  // An unknown rate predicts 0 (taken to start and finish at once).
  EXPECT_EQ(PredictedFinishSeconds(Idle("new"), 200), 0.0);
}

TEST(RoutingPolicyTest, NoCandidateIsNoChoice) {
  uint64_t cursor = 7;
  EXPECT_FALSE(ChooseCandidate({}, true, 200, KvAware(), &cursor).has_value());
  EXPECT_EQ(cursor, 7u);
}

}  // namespace
}  // namespace tandem::router
