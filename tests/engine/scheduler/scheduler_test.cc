// Scheduler policy tests: token budget, decode first, FCFS, chunked
// prefill, preemption by recompute, prefix hits at admission. The "model"
// is a pure function of the tokens so far, so a sequence's output must not
// depend on batching or preemption.
#include "engine/scheduler/scheduler.h"

#include <map>
#include <numeric>
#include <set>

#include "gtest/gtest.h"
#include "tests/engine/scheduler/known_step_model.h"

namespace tandem::scheduler {
namespace {

constexpr int32_t kBlockSize = 4;

// Next token of a sequence: depends only on its tokens.
int32_t FakeModel(const std::vector<int32_t>& tokens) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : tokens) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  return static_cast<int32_t>(h % 500) + 3;
}

std::vector<int32_t> Prompt(int32_t n, int32_t seed) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = (seed * 7 + i * 13) % 500 + 3;
  return p;
}

SeqState MakeSeq(int64_t id, std::vector<int32_t> prompt) {
  SeqState s;
  s.id = id;
  s.num_prompt_tokens = static_cast<int32_t>(prompt.size());
  s.tokens = std::move(prompt);
  return s;
}

struct Harness {
  Harness(int32_t num_blocks, SchedulerOptions options, const StepModel* model = nullptr)
      : pool(num_blocks),
        kv(&pool, kv::KvCacheManagerOptions{true, "test-model", kBlockSize}),
        scheduler(options, &kv, model) {}

  // One step: plan, "run", feed back; returns the plan. Finished sequences
  // (max_new tokens generated) are removed and their outputs recorded.
  StepPlan Step(const std::set<int64_t>& held = {}) {
    StepPlan plan = scheduler.Schedule(held);
    std::vector<int32_t> sampled;
    for (const ScheduledChunk& c : plan.chunks) {
      const SeqState* s = scheduler.Find(c.id);
      EXPECT_NE(s, nullptr);
      EXPECT_EQ(c.start, s->num_computed) << "chunk must continue where KV ends";
      if (c.samples) sampled.push_back(FakeModel(s->tokens));
    }
    scheduler.OnStepDone(plan, sampled);
    for (const ScheduledChunk& c : plan.chunks) {
      const SeqState* s = scheduler.Find(c.id);
      if (s == nullptr) continue;
      const int32_t generated = static_cast<int32_t>(s->tokens.size()) - s->num_prompt_tokens;
      if (generated >= max_new[c.id]) {
        outputs[c.id] = std::vector<int32_t>(s->tokens.begin() + s->num_prompt_tokens,
                                             s->tokens.end());
        scheduler.Remove(c.id);
      }
    }
    return plan;
  }

  void RunToCompletion(int max_steps = 10000) {
    for (int i = 0; i < max_steps && scheduler.HasWork(); ++i) Step();
    ASSERT_FALSE(scheduler.HasWork()) << "did not finish";
  }

  kv::BlockPool pool;
  kv::KvCacheManager kv;
  Scheduler scheduler;
  std::map<int64_t, int32_t> max_new;
  std::map<int64_t, std::vector<int32_t>> outputs;
};

// Reference: the sequence generated with nothing else around.
std::vector<int32_t> Alone(const std::vector<int32_t>& prompt, int32_t max_new) {
  std::vector<int32_t> tokens = prompt, out;
  for (int32_t i = 0; i < max_new; ++i) {
    tokens.push_back(FakeModel(tokens));
    out.push_back(tokens.back());
  }
  return out;
}

TEST(SchedulerTest, BudgetAndChunkSizeAreRespected) {
  Harness h(256, SchedulerOptions{64, 8, 32, true});
  for (int64_t id = 1; id <= 3; ++id) {
    h.scheduler.Add(MakeSeq(id, Prompt(100, static_cast<int32_t>(id))));
    h.max_new[id] = 5;
  }
  for (int i = 0; i < 1000 && h.scheduler.HasWork(); ++i) {
    StepPlan plan = h.Step();
    int32_t total = 0;
    for (const ScheduledChunk& c : plan.chunks) {
      EXPECT_LE(c.count, 32);
      total += c.count;
    }
    EXPECT_EQ(total, plan.num_batched_tokens);
    EXPECT_LE(total, 64);
  }
  for (int64_t id = 1; id <= 3; ++id) {
    EXPECT_EQ(h.outputs[id], Alone(Prompt(100, static_cast<int32_t>(id)), 5));
  }
  EXPECT_EQ(h.kv.num_blocks_in_use(), 0);
}

TEST(SchedulerTest, DecodesComeFirstThenPrefillChunks) {
  Harness h(256, SchedulerOptions{16, 8, 16, true});
  h.scheduler.Add(MakeSeq(1, Prompt(6, 1)));
  h.max_new[1] = 20;
  h.Step();  // seq 1 prefilled, samples its first token
  h.scheduler.Add(MakeSeq(2, Prompt(40, 2)));
  h.max_new[2] = 2;
  StepPlan plan = h.Step();
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].id, 1);
  EXPECT_EQ(plan.chunks[0].count, 1);
  EXPECT_TRUE(plan.chunks[0].samples);
  EXPECT_EQ(plan.chunks[1].id, 2);
  EXPECT_EQ(plan.chunks[1].count, 15);  // budget 16 minus the decode token
  EXPECT_FALSE(plan.chunks[1].samples);
}

TEST(SchedulerTest, HeldSequencesGetNoChunkAndResumeWhereTheyStopped) {
  Harness h(256, SchedulerOptions{64, 8, 16, true});
  h.scheduler.Add(MakeSeq(1, Prompt(40, 1)));
  h.scheduler.Add(MakeSeq(2, Prompt(40, 2)));
  h.max_new[1] = h.max_new[2] = 3;
  StepPlan plan = h.Step();  // both admitted: 16 tokens each
  ASSERT_EQ(plan.chunks.size(), 2u);
  plan = h.Step({1});
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].id, 2);
  EXPECT_EQ(plan.chunks[0].start, 16);
  EXPECT_EQ(h.scheduler.Find(1)->num_computed, 16);
  plan = h.Step({1, 2});
  EXPECT_TRUE(plan.chunks.empty());
  EXPECT_FALSE(plan.progress());
  plan = h.Step();
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].id, 1);
  EXPECT_EQ(plan.chunks[0].start, 16);  // continues where it stopped
  h.RunToCompletion();
  EXPECT_EQ(h.outputs[1], Alone(Prompt(40, 1), 3));
  EXPECT_EQ(h.outputs[2], Alone(Prompt(40, 2), 3));
}

TEST(SchedulerTest, AdmissionIsFcfs) {
  // Budget for one 8-token prompt per step: admissions follow arrival.
  Harness h(256, SchedulerOptions{8, 8, 8, true});
  for (int64_t id : {5, 3, 9}) {
    h.scheduler.Add(MakeSeq(id, Prompt(8, static_cast<int32_t>(id))));
    h.max_new[id] = 50;
  }
  std::vector<int64_t> admitted;
  for (int i = 0; i < 3; ++i) {
    for (const ScheduledChunk& c : h.Step().chunks) {
      if (c.start == 0) admitted.push_back(c.id);
    }
  }
  EXPECT_EQ(admitted, (std::vector<int64_t>{5, 3, 9}));
}

TEST(SchedulerTest, MaxNumSeqsCapsTheRunningSet) {
  Harness h(256, SchedulerOptions{512, 2, 64, true});
  for (int64_t id = 1; id <= 4; ++id) {
    h.scheduler.Add(MakeSeq(id, Prompt(5, static_cast<int32_t>(id))));
    h.max_new[id] = 3;
  }
  StepPlan plan = h.Step();
  EXPECT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(h.scheduler.num_running(), 2u);
  EXPECT_EQ(h.scheduler.num_waiting(), 2u);
  h.RunToCompletion();
  for (int64_t id = 1; id <= 4; ++id) {
    EXPECT_EQ(h.outputs[id], Alone(Prompt(5, static_cast<int32_t>(id)), 3));
  }
}

TEST(SchedulerTest, PreemptionByRecomputeGivesIdenticalTokens) {
  // 8 blocks of 4 tokens = 32 slots; two sequences that each grow to 24
  // tokens cannot both stay resident: the newer one is preempted and
  // recomputes later.
  Harness h(8, SchedulerOptions{64, 8, 64, /*enable_prefix_caching=*/false});
  h.scheduler.Add(MakeSeq(1, Prompt(8, 1)));
  h.scheduler.Add(MakeSeq(2, Prompt(8, 2)));
  h.max_new[1] = 16;
  h.max_new[2] = 16;
  bool preempted = false;
  for (int i = 0; i < 1000 && h.scheduler.HasWork(); ++i) {
    StepPlan plan = h.Step();
    for (int64_t id : plan.preempted) {
      EXPECT_EQ(id, 2) << "the newest sequence is the victim";
      preempted = true;
    }
    EXPECT_LE(h.kv.num_blocks_in_use(), 8);
  }
  EXPECT_TRUE(preempted);
  EXPECT_EQ(h.outputs[1], Alone(Prompt(8, 1), 16));
  EXPECT_EQ(h.outputs[2], Alone(Prompt(8, 2), 16));
  EXPECT_EQ(h.kv.num_blocks_in_use(), 0);
}

TEST(SchedulerTest, PreemptedSequenceResumesWithItsGeneratedTokens) {
  Harness h(8, SchedulerOptions{64, 8, 64, false});
  h.scheduler.Add(MakeSeq(1, Prompt(8, 1)));
  h.scheduler.Add(MakeSeq(2, Prompt(8, 2)));
  h.max_new[1] = 16;
  h.max_new[2] = 16;
  for (int i = 0; i < 1000; ++i) {
    StepPlan plan = h.Step();
    if (!plan.preempted.empty()) break;
  }
  const SeqState* victim = h.scheduler.Find(2);
  ASSERT_NE(victim, nullptr);
  EXPECT_EQ(victim->num_computed, 0);
  EXPECT_EQ(victim->num_preemptions, 1);
  EXPECT_GT(victim->tokens.size(), 8u) << "generated tokens are kept for recompute";
  EXPECT_FALSE(h.kv.HasSequence(2));
}

TEST(SchedulerTest, PrefixHitSkipsCachedBlocksButComputesTheLastToken) {
  Harness h(64, SchedulerOptions{256, 8, 256, true});
  const std::vector<int32_t> prompt = Prompt(12, 4);  // exactly 3 blocks
  h.scheduler.Add(MakeSeq(1, prompt));
  h.max_new[1] = 1;
  h.RunToCompletion();
  h.scheduler.Add(MakeSeq(2, prompt));
  h.max_new[2] = 1;
  StepPlan plan = h.Step();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 8);  // floor((12 - 1) / 4) * 4
  EXPECT_EQ(plan.chunks[0].count, 4);
  EXPECT_EQ(h.outputs[2], h.outputs[1]);
  EXPECT_EQ(h.kv.num_blocks_in_use(), 0);
}

TEST(SchedulerTest, CachedPromptTokensAreReportedOnce) {
  Harness h(64, SchedulerOptions{256, 8, 256, true});
  const std::vector<int32_t> prompt = Prompt(10, 6);
  h.scheduler.Add(MakeSeq(1, prompt));
  h.max_new[1] = 1;
  h.RunToCompletion();
  h.scheduler.Add(MakeSeq(2, prompt));
  h.max_new[2] = 4;
  h.Step();
  const SeqState* s = h.scheduler.Find(2);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->num_cached_prompt_tokens, 8);
  EXPECT_EQ(h.scheduler.cached_prompt_tokens_total(), 8u);
  h.RunToCompletion();
  EXPECT_EQ(h.scheduler.cached_prompt_tokens_total(), 8u);
}

// cached_prompt_tokens_total (a worker's tandem_prompt_tokens_cached_total):
// a head that cannot get its blocks yet adds nothing until admitted, and a
// forked sample admitted through the normal path adds nothing (its
// request's hit counted with the parent).
TEST(SchedulerTest, CachedPromptTokensTotalCountsEachRequestOnce) {
  kv::BlockPool pool(6);
  kv::KvCacheManager kv(&pool, kv::KvCacheManagerOptions{true, "test-model", kBlockSize});
  Scheduler scheduler(SchedulerOptions{256, 8, 256, true}, &kv);
  const std::vector<int32_t> prompt = Prompt(9, 5);  // 2 full blocks + 1
  scheduler.Add(MakeSeq(1, prompt));
  StepPlan plan = scheduler.Schedule();
  scheduler.OnStepDone(plan, {7});  // blocks 0-1 published, 3 blocks held
  // Same prompt, hit 8: needs 1 new block + room for its growth; a third
  // sequence holding the free blocks makes it wait.
  scheduler.Add(MakeSeq(3, Prompt(12, 9)));  // 3 blocks: 6 in use
  plan = scheduler.Schedule();
  scheduler.OnStepDone(plan, std::vector<int32_t>(plan.chunks.size(), 7));
  EXPECT_EQ(scheduler.cached_prompt_tokens_total(), 0u);
  scheduler.Add(MakeSeq(2, prompt));
  plan = scheduler.Schedule();
  EXPECT_NE(scheduler.Find(2)->status, SeqStatus::kRunning) << "no block for it yet";
  EXPECT_EQ(scheduler.cached_prompt_tokens_total(), 0u);
  scheduler.OnStepDone(plan, std::vector<int32_t>(plan.chunks.size(), 7));
  scheduler.Remove(3);
  plan = scheduler.Schedule();
  EXPECT_EQ(scheduler.Find(2)->status, SeqStatus::kRunning);
  EXPECT_EQ(scheduler.cached_prompt_tokens_total(), 8u);
  scheduler.OnStepDone(plan, std::vector<int32_t>(plan.chunks.size(), 7));
  // A short prompt's fork waits with nothing computed and is admitted by
  // the normal path: no new count.
  scheduler.Remove(1);
  scheduler.Remove(2);
  scheduler.Add(MakeSeq(4, Prompt(3, 3)));
  plan = scheduler.Schedule();
  scheduler.OnStepDone(plan, std::vector<int32_t>(plan.chunks.size(), 9));
  scheduler.Fork(4, 5, 10);
  plan = scheduler.Schedule();
  EXPECT_EQ(scheduler.Find(5)->status, SeqStatus::kRunning);
  EXPECT_EQ(scheduler.cached_prompt_tokens_total(), 8u);
}

TEST(SchedulerTest, RemoveFreesBlocksAnywhere) {
  Harness h(64, SchedulerOptions{8, 8, 8, true});
  h.scheduler.Add(MakeSeq(1, Prompt(20, 1)));
  h.scheduler.Add(MakeSeq(2, Prompt(20, 2)));
  h.max_new[1] = h.max_new[2] = 5;
  h.Step();  // 1 running (chunk of 8), 2 waiting
  h.scheduler.Remove(2);
  h.scheduler.Remove(1);
  h.scheduler.Remove(7);  // unknown: no-op
  EXPECT_FALSE(h.scheduler.HasWork());
  EXPECT_EQ(h.kv.num_blocks_in_use(), 0);
}

// ---- Remote prefill as a scheduler state (WAITING_FOR_REMOTE_KV) ----

SchedulerOptions RemoteOptions() {
  SchedulerOptions o{64, 8, 64, true};
  o.remote_prefill_available = true;
  o.max_local_prefill_tokens = 8;
  return o;
}

SeqState MakeRouted(int64_t id, std::vector<int32_t> prompt, RouteChoice route) {
  SeqState s = MakeSeq(id, std::move(prompt));
  s.route = route;
  return s;
}

TEST(SchedulerRemoteTest, LongPromptWaitsForRemoteKvWithBlocksForLPlusOne) {
  Harness h(64, RemoteOptions());
  h.scheduler.Add(MakeRouted(1, Prompt(20, 1), RouteChoice::kAuto));  // 20 > 8
  h.scheduler.Add(MakeRouted(2, Prompt(6, 2), RouteChoice::kAuto));   // 6 <= 8
  StepPlan plan = h.scheduler.Schedule();
  ASSERT_EQ(plan.remote_kv_starts.size(), 1u);
  EXPECT_EQ(plan.remote_kv_starts[0].id, 1);
  EXPECT_EQ(plan.remote_kv_starts[0].hit_tokens, 0);
  ASSERT_EQ(plan.chunks.size(), 1u);  // the short one prefills here
  EXPECT_EQ(plan.chunks[0].id, 2);
  EXPECT_TRUE(plan.progress());
  const SeqState* s = h.scheduler.Find(1);
  EXPECT_EQ(s->status, SeqStatus::kWaitingForRemoteKv);
  EXPECT_EQ(h.kv.BlockTable(1).size(), 6u);  // ceil(21 / 4)
  EXPECT_EQ(h.scheduler.num_waiting_for_remote_kv(), 1u);
  h.scheduler.OnStepDone(plan, {FakeModel(h.scheduler.Find(2)->tokens)});

  // Nothing runs for it until the KV is there.
  plan = h.scheduler.Schedule();
  for (const ScheduledChunk& c : plan.chunks) EXPECT_NE(c.id, 1);
  h.scheduler.OnStepDone(plan, {FakeModel(h.scheduler.Find(2)->tokens)});

  h.scheduler.FinishRemoteKv(1, FakeModel(Prompt(20, 1)));
  EXPECT_EQ(h.scheduler.Find(1)->status, SeqStatus::kRunning);
  EXPECT_EQ(h.scheduler.Find(1)->num_computed, 20);
  EXPECT_EQ(h.scheduler.Find(1)->tokens.size(), 21u);
  // The prompt's full blocks are published.
  EXPECT_EQ(h.kv.FindCachedPrefix(Prompt(20, 1), 20).num_tokens, 20);
  plan = h.scheduler.Schedule();
  bool decoded = false;
  for (const ScheduledChunk& c : plan.chunks) {
    if (c.id != 1) continue;
    decoded = true;
    EXPECT_EQ(c.start, 20);
    EXPECT_EQ(c.count, 1);
    EXPECT_TRUE(c.samples);
  }
  EXPECT_TRUE(decoded);
}

TEST(SchedulerRemoteTest, RoutesAndThreshold) {
  Harness h(64, RemoteOptions());
  h.scheduler.Add(MakeRouted(1, Prompt(3, 1), RouteChoice::kRemote));   // short but forced
  h.scheduler.Add(MakeRouted(2, Prompt(30, 2), RouteChoice::kLocal));   // long but forced
  h.scheduler.Add(MakeRouted(3, Prompt(9, 3), RouteChoice::kAuto));     // 9 > 8
  StepPlan plan = h.scheduler.Schedule();
  std::vector<int64_t> remote;
  for (const RemoteKvStart& r : plan.remote_kv_starts) remote.push_back(r.id);
  EXPECT_EQ(remote, (std::vector<int64_t>{1, 3}));
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].id, 2);
  // Without remote prefill, every prompt is prefilled here.
  Harness local(64, SchedulerOptions{64, 8, 64, true});
  local.scheduler.Add(MakeRouted(1, Prompt(30, 1), RouteChoice::kAuto));
  EXPECT_TRUE(local.scheduler.Schedule().remote_kv_starts.empty());
}

TEST(SchedulerRemoteTest, RemoteHitCoversEveryFullBlockAndLocalHitLeavesTheLastToken) {
  Harness h(64, RemoteOptions());
  const std::vector<int32_t> prompt = Prompt(12, 5);  // 3 full blocks
  h.scheduler.Add(MakeRouted(1, prompt, RouteChoice::kLocal));
  h.max_new[1] = 1;
  h.RunToCompletion();
  h.scheduler.Add(MakeRouted(2, prompt, RouteChoice::kRemote));
  h.scheduler.Add(MakeRouted(3, prompt, RouteChoice::kLocal));
  StepPlan plan = h.scheduler.Schedule();
  ASSERT_EQ(plan.remote_kv_starts.size(), 1u);
  EXPECT_EQ(plan.remote_kv_starts[0].hit_tokens, 12);  // a zero-byte transfer
  EXPECT_EQ(h.scheduler.Find(2)->num_cached_prompt_tokens, 12);
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 8);  // local: floor(11 / 4) * 4
  EXPECT_EQ(h.kv.prefix_cache_stats().lookups, 3u);  // one per admission
}

TEST(SchedulerRemoteTest, RemoteHeadWaitsForBlocksInOrder) {
  // 8 blocks: a 20-token remote prompt needs 6; a second needs 6 more.
  Harness h(8, RemoteOptions());
  h.scheduler.Add(MakeRouted(1, Prompt(20, 1), RouteChoice::kRemote));
  h.scheduler.Add(MakeRouted(2, Prompt(20, 2), RouteChoice::kRemote));
  h.scheduler.Add(MakeRouted(3, Prompt(4, 3), RouteChoice::kLocal));
  StepPlan plan = h.scheduler.Schedule();
  ASSERT_EQ(plan.remote_kv_starts.size(), 1u);
  EXPECT_TRUE(plan.chunks.empty()) << "FCFS: 3 waits behind the blocked head";
  EXPECT_EQ(h.scheduler.Find(2)->status, SeqStatus::kWaiting);
  EXPECT_FALSE(h.kv.HasSequence(2));
  // Nothing changes until blocks come back.
  plan = h.scheduler.Schedule();
  EXPECT_FALSE(plan.progress());
  h.scheduler.AbortRemoteKv(1);
  EXPECT_EQ(h.scheduler.Find(1)->status, SeqStatus::kAbortingRemoteKv);
  EXPECT_EQ(h.kv.num_blocks_in_use(), 6) << "aborting keeps the blocks until quiesced";
  h.scheduler.Remove(1);
  plan = h.scheduler.Schedule();
  ASSERT_EQ(plan.remote_kv_starts.size(), 1u);
  EXPECT_EQ(plan.remote_kv_starts[0].id, 2);
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].id, 3);
}

TEST(SchedulerRemoteTest, PreemptedSequenceNeverGoesRemoteAgain) {
  // 13 blocks of 4: the remote sequence (16 tokens + decode) and a local
  // one cannot both grow to 40 tokens.
  Harness h(13, RemoteOptions());
  h.scheduler.Add(MakeRouted(1, Prompt(6, 1), RouteChoice::kLocal));
  h.max_new[1] = 30;
  h.Step();
  h.scheduler.Add(MakeRouted(2, Prompt(16, 2), RouteChoice::kAuto));
  h.max_new[2] = 24;
  StepPlan plan = h.Step();
  ASSERT_EQ(plan.remote_kv_starts.size(), 1u);
  h.scheduler.FinishRemoteKv(2, FakeModel(Prompt(16, 2)));
  bool preempted = false;
  for (int i = 0; i < 1000 && h.scheduler.HasWork(); ++i) {
    plan = h.Step();
    EXPECT_TRUE(plan.remote_kv_starts.empty());
    for (int64_t id : plan.preempted) preempted |= id == 2;
  }
  EXPECT_TRUE(preempted);
  EXPECT_EQ(h.outputs[1], Alone(Prompt(6, 1), 30));
  EXPECT_EQ(h.outputs[2], Alone(Prompt(16, 2), 24));
  EXPECT_EQ(h.kv.num_blocks_in_use(), 0);
}

// Fork: a child shares the parent's full prompt blocks (reference counts,
// prefix caching off), waits at the head of the queue, and recomputes only
// the partial last block plus its first token.
TEST(SchedulerTest, ForkSharesFullPromptBlocksAndRecomputesThePartialBlock) {
  SchedulerOptions o;
  o.max_num_batched_tokens = 64;
  o.prefill_chunk_tokens = 64;
  o.enable_prefix_caching = false;
  kv::BlockPool pool(32);
  kv::KvCacheManager kv(&pool, kv::KvCacheManagerOptions{false, "test-model", kBlockSize});
  Scheduler scheduler(o, &kv);
  scheduler.Add(MakeSeq(1, Prompt(10, 1)));  // 2 full blocks + 2 tokens
  StepPlan plan = scheduler.Schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  scheduler.OnStepDone(plan, {42});
  const std::vector<int32_t> parent_table = kv.BlockTable(1);
  ASSERT_EQ(parent_table.size(), 3u);

  scheduler.Fork(1, 2, 43);
  scheduler.Fork(1, 3, 44);
  scheduler.Add(MakeSeq(4, Prompt(3, 2)));  // arrives later: queued behind the children
  const SeqState* child = scheduler.Find(2);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->status, SeqStatus::kWaiting);
  EXPECT_EQ(child->num_computed, 8);
  EXPECT_EQ(child->num_prompt_tokens, 10);
  std::vector<int32_t> expected_tokens = Prompt(10, 1);
  expected_tokens.push_back(43);
  EXPECT_EQ(child->tokens, expected_tokens);
  // Shared, not copied: the first two blocks are the parent's, ref 3.
  EXPECT_EQ(kv.BlockTable(2), std::vector<int32_t>(parent_table.begin(), parent_table.begin() + 2));
  EXPECT_EQ(kv.RefCount(parent_table[0]), 3);
  EXPECT_EQ(kv.num_blocks_in_use(), 3);

  // The next step decodes the parent, then admits the children in order
  // (each recomputes tokens [8, 11): two prompt tokens and its token 0),
  // then the later arrival.
  plan = scheduler.Schedule();
  ASSERT_EQ(plan.chunks.size(), 4u);
  EXPECT_EQ(plan.chunks[0].id, 1);
  EXPECT_EQ(plan.chunks[1].id, 2);
  EXPECT_EQ(plan.chunks[1].start, 8);
  EXPECT_EQ(plan.chunks[1].count, 3);
  EXPECT_TRUE(plan.chunks[1].samples);
  EXPECT_EQ(plan.chunks[2].id, 3);
  EXPECT_EQ(plan.chunks[3].id, 4);
  // Each child holds one private block beside the two shared ones.
  EXPECT_EQ(kv.BlockTable(2).size(), 3u);
  EXPECT_NE(kv.BlockTable(2)[2], parent_table[2]);
  EXPECT_EQ(kv.num_blocks_in_use(), 3 + 1 + 1 + 1);
  scheduler.OnStepDone(plan, {50, 51, 52, 53});

  // Removing the parent keeps the shared blocks alive for the children.
  scheduler.Remove(1);
  EXPECT_EQ(kv.RefCount(parent_table[0]), 2);
  scheduler.Remove(2);
  scheduler.Remove(3);
  scheduler.Remove(4);
  EXPECT_EQ(kv.num_blocks_in_use(), 0);
}

// A prompt shorter than a block shares nothing: the child is admitted and
// prefilled like any waiting sequence; a child removed while waiting
// releases only its own references.
TEST(SchedulerTest, ForkOfAShortPromptAndRemovalWhileWaiting) {
  SchedulerOptions o;
  o.enable_prefix_caching = false;
  kv::BlockPool pool(16);
  kv::KvCacheManager kv(&pool, kv::KvCacheManagerOptions{false, "test-model", kBlockSize});
  Scheduler scheduler(o, &kv);
  scheduler.Add(MakeSeq(1, Prompt(3, 3)));
  StepPlan plan = scheduler.Schedule();
  scheduler.OnStepDone(plan, {9});
  scheduler.Fork(1, 2, 10);
  EXPECT_FALSE(kv.HasSequence(2));
  EXPECT_EQ(scheduler.Find(2)->num_computed, 0);
  plan = scheduler.Schedule();
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[1].id, 2);
  EXPECT_EQ(plan.chunks[1].start, 0);
  EXPECT_EQ(plan.chunks[1].count, 4);

  scheduler.Add(MakeSeq(5, Prompt(9, 4)));
  plan = scheduler.Schedule();
  scheduler.OnStepDone(plan, std::vector<int32_t>(plan.chunks.size(), 7));
  const int32_t before = kv.num_blocks_in_use();
  scheduler.Fork(5, 6, 11);  // shares 2 blocks, waits
  EXPECT_EQ(kv.num_blocks_in_use(), before);
  scheduler.Remove(6);
  EXPECT_EQ(kv.num_blocks_in_use(), before);
  EXPECT_EQ(kv.RefCount(kv.BlockTable(5)[0]), 1);
}

// A sequence waiting for remote KV holds one of max_num_seqs: when it
// arrives the running set never exceeds the cap.
TEST(SchedulerTest, RemoteWaitersCountAgainstMaxNumSeqs) {
  SchedulerOptions o;
  o.max_num_seqs = 2;
  o.remote_prefill_available = true;
  o.max_local_prefill_tokens = 4;
  kv::BlockPool pool(64);
  kv::KvCacheManager kv(&pool, kv::KvCacheManagerOptions{true, "test-model", kBlockSize});
  Scheduler scheduler(o, &kv);
  for (int64_t id = 1; id <= 3; ++id) {
    scheduler.Add(MakeRouted(id, Prompt(20, static_cast<int32_t>(id)), RouteChoice::kAuto));
  }
  StepPlan plan = scheduler.Schedule();
  ASSERT_EQ(plan.remote_kv_starts.size(), 2u);
  EXPECT_EQ(scheduler.num_waiting(), 1u);
  scheduler.FinishRemoteKv(1, 7);
  scheduler.FinishRemoteKv(2, 8);
  plan = scheduler.Schedule();
  EXPECT_EQ(scheduler.num_running(), 2u);
  EXPECT_TRUE(plan.remote_kv_starts.empty());
  EXPECT_EQ(scheduler.num_waiting(), 1u);
  scheduler.Remove(1);
  plan = scheduler.Schedule();
  EXPECT_EQ(plan.remote_kv_starts.size(), 1u);
  EXPECT_EQ(scheduler.num_waiting(), 0u);
}

// slo.tpot_ms bounds each step's prefill while decodes run: with one
// decode (1.5 ms by the known model) and a 1.7 ms TPOT, a step takes at
// most 20 prefill tokens (1.5 + 0.01 x 20); the tokens out are unchanged.
TEST(SchedulerSloTest, TpotBoundKeepsStepsWithinTheSloWithSameTokens) {
  const StepModel model = KnownStepModel();
  SchedulerOptions options{64, 8, 64, true};
  options.slo_tpot_ms = 1.7;
  Harness h(256, options, &model);
  h.scheduler.Add(MakeSeq(1, Prompt(6, 1)));
  h.max_new[1] = 30;
  h.Step();  // seq 1 prefilled: it decodes from now on
  h.scheduler.Add(MakeSeq(2, Prompt(100, 2)));
  h.max_new[2] = 3;
  int bounded_steps = 0;
  for (int i = 0; i < 1000 && h.scheduler.HasWork(); ++i) {
    const StepPlan plan = h.Step();
    const StepShape shape = ShapeOf(plan);
    if (shape.decode_seqs > 0 && shape.prefill_tokens > 0) {
      EXPECT_LE(shape.prefill_tokens, 20);
      EXPECT_LE(model.PredictMs(shape), 1.7 + 1e-6);
      ++bounded_steps;
    }
  }
  EXPECT_GE(bounded_steps, 5);  // 99 prompt tokens in chunks of <= 20
  EXPECT_EQ(h.outputs[1], Alone(Prompt(6, 1), 30));
  EXPECT_EQ(h.outputs[2], Alone(Prompt(100, 2), 3));
  // Without the SLO the first chunk beside the decode takes the budget.
  options.slo_tpot_ms = 0;
  Harness free(256, options, &model);
  free.scheduler.Add(MakeSeq(1, Prompt(6, 1)));
  free.max_new[1] = 30;
  free.Step();
  free.scheduler.Add(MakeSeq(2, Prompt(100, 2)));
  EXPECT_EQ(ShapeOf(free.Step()).prefill_tokens, 63);
}

// Below the TPOT of the decodes alone, prefill still advances by the floor.
TEST(SchedulerSloTest, TpotFloorKeepsPrefillMoving) {
  const StepModel model = KnownStepModel();
  SchedulerOptions options{64, 8, 64, true};
  options.slo_tpot_ms = 1.0;  // one decode alone takes 1.5 ms
  Harness h(256, options, &model);
  h.scheduler.Add(MakeSeq(1, Prompt(6, 1)));
  h.max_new[1] = 30;
  h.Step();
  h.scheduler.Add(MakeSeq(2, Prompt(100, 2)));
  h.max_new[2] = 1;
  EXPECT_EQ(ShapeOf(h.Step()).prefill_tokens, kMinTpotChunkTokens);
  h.RunToCompletion();
  EXPECT_EQ(h.outputs[2], Alone(Prompt(100, 2), 1));
}

SeqState WithEstimate(SeqState s, double queue_ms, double prefill_ms) {
  s.remote_estimate = RemotePrefillEstimate{"prefill-0", queue_ms, prefill_ms};
  return s;
}

// placement slo decides at arrival from the known model: a 30-token prompt
// costs 1 + 0.3 = 1.3 ms here.
TEST(SchedulerSloTest, PlacementBySloAtArrival) {
  const StepModel model = KnownStepModel();
  SchedulerOptions options = RemoteOptions();
  options.placement = PlacementPolicy::kSlo;
  options.slo_ttft_ms = 2000;
  Harness h(256, options, &model);
  // P needs 1 s: local.
  h.scheduler.Add(WithEstimate(MakeRouted(1, Prompt(30, 1), RouteChoice::kAuto), 0, 1000));
  // P needs 0.5 ms: remote.
  h.scheduler.Add(WithEstimate(MakeRouted(2, Prompt(30, 2), RouteChoice::kAuto), 0, 0.5));
  // No estimate: the threshold rule (30 > 8: remote at admission).
  h.scheduler.Add(MakeRouted(3, Prompt(30, 3), RouteChoice::kAuto));
  // At or under the threshold: local without a prediction.
  h.scheduler.Add(WithEstimate(MakeRouted(4, Prompt(6, 4), RouteChoice::kAuto), 0, 0.5));
  const SeqState* s1 = h.scheduler.Find(1);
  ASSERT_TRUE(s1->placement.has_value());
  EXPECT_FALSE(s1->placement->remote);
  EXPECT_EQ(s1->route, RouteChoice::kLocal);
  EXPECT_NEAR(s1->placement->ttft_local_ms, 1.3, 1e-3);
  EXPECT_NEAR(s1->placement->ttft_remote_ms, 1000, 1e-9);
  const SeqState* s2 = h.scheduler.Find(2);
  ASSERT_TRUE(s2->placement.has_value());
  EXPECT_TRUE(s2->placement->remote);
  EXPECT_EQ(s2->route, RouteChoice::kRemote);
  EXPECT_FALSE(h.scheduler.Find(3)->placement.has_value());
  EXPECT_FALSE(h.scheduler.Find(4)->placement.has_value());
  const StepPlan plan = h.scheduler.Schedule();
  std::vector<int64_t> remote;
  for (const RemoteKvStart& r : plan.remote_kv_starts) remote.push_back(r.id);
  EXPECT_EQ(remote, (std::vector<int64_t>{2, 3}));
}

// placement threshold ignores estimates and models: today's rule exactly.
TEST(SchedulerSloTest, ThresholdPlacementIgnoresEstimates) {
  const StepModel model = KnownStepModel();
  Harness h(256, RemoteOptions(), &model);
  h.scheduler.Add(WithEstimate(MakeRouted(1, Prompt(30, 1), RouteChoice::kAuto), 0, 1000));
  EXPECT_FALSE(h.scheduler.Find(1)->placement.has_value());
  EXPECT_EQ(h.scheduler.Schedule().remote_kv_starts.size(), 1u);
}

}  // namespace
}  // namespace tandem::scheduler
