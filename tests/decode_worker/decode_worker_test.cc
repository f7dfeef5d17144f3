// The decode worker's engine (the engine core with the KV receiver as its
// remote KV loader, as decode_worker/main.cc builds it) against
// stories260K's greedy goldens: local prefill, AUTO routing, remote prefill
// with the test (or a real prefill worker engine) as P, continuous
// batching, cancel, timeouts, admission and validation.

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "engine/backend/cpu_backend.h"
#include "engine/core/engine_core.h"
#include "kvtransfer/kv_transfer.h"
#include "tests/decode_worker/worker_test_util.h"
#include "tests/engine/core/recording_sink.h"

namespace tandem::decode {
namespace {

using core::CoreStats;
using core::EngineRequest;
using core::FinishReason;
using core::RouteChoice;
using core::testing::RecordingSink;
using core::testing::SinkEvent;
using worker_testing::TestDecodeWorker;
using worker_testing::WorkerOptions;
using worker_testing::Golden;
using worker_testing::GoldenCase;
using worker_testing::Prefix;
using worker_testing::StoriesKvBytes;

constexpr char kFingerprint[] = "stories260K-test-fingerprint";

class DecodeWorkerTest : public worker_testing::StoriesTest {
 protected:
  static WorkerOptions Options() {
    WorkerOptions o;
    o.block_size = 16;
    o.num_kv_blocks = 256;
    o.max_local_prefill_tokens = 32;
    o.handshake_timeout_ms = 2000;
    o.transfer_timeout_ms = 2000;
    o.fingerprint = kFingerprint;
    return o;
  }

  std::unique_ptr<TestDecodeWorker> MakeEngine(const WorkerOptions& options) {
    return TestDecodeWorker::Create(options, &model());
  }

  static EngineRequest Request(const std::string& id, const GoldenCase& c, int32_t max_tokens,
                               RouteChoice route) {
    EngineRequest r;
    r.request_id = id;
    r.prompt = c.prompt;
    r.max_tokens = max_tokens;
    r.route = route;
    return r;  // sampling: greedy by default
  }

  // Plays P for `c`: computes the prompt's K/V with a plain forward, sends
  // every layer of [0, L) and FINAL{token0, finish_reason}.
  void SendRemotePrefill(const SinkEvent& need, const std::string& id, const GoldenCase& c,
                         int32_t token0, FinishReason reason) {
    const int32_t len = static_cast<int32_t>(c.prompt.size());
    worker_testing::PromptKv kv = worker_testing::ComputePromptKv(model(), c.prompt, 16);
    auto sender = kvtransfer::KvSender::Connect(
        need.kv_endpoint, id, need.attempt, worker_testing::StoriesLayout(model(), kFingerprint), backend::CpuBitExactClass(model(), kv::KvDtype::kF32),
        2000);
    ASSERT_TRUE(sender.ok()) << sender.status();
    ASSERT_TRUE(worker_testing::SendPromptKv(**sender, kv, model().config().n_layers, 0, len)
                    .ok());
    kvtransfer::FinalSample sample;
    sample.token = token0;
    sample.finish_reason = static_cast<uint32_t>(reason);
    ASSERT_TRUE((*sender)->SendFinal({sample}).ok());
  }
};

// Indices 0..n-1 in order.
std::vector<uint32_t> Indices(uint32_t from, uint32_t to) {
  std::vector<uint32_t> v;
  for (uint32_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

void ExpectFinishedOk(const RecordingSink& sink, FinishReason reason) {
  std::optional<SinkEvent> f = sink.finish();
  ASSERT_TRUE(f.has_value());
  EXPECT_TRUE(f->status.ok()) << f->status;
  EXPECT_EQ(f->reason, reason);
  EXPECT_EQ(sink.finish_calls(), 1);
}

TEST_F(DecodeWorkerTest, LocalPrefillStreamsGoldenIds) {
  auto engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  uint64_t prompt_tokens = 0;
  for (const GoldenCase& c : worker_testing::GoldenCases()) {
    SCOPED_TRACE(c.name);
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_TRUE(engine->Submit(Request(c.name, c, 32, RouteChoice::kLocal), sink).ok());
    ASSERT_TRUE(sink->WaitFinish());
    EXPECT_FALSE(sink->need_remote_prefill().has_value());
    EXPECT_EQ(sink->token_indices(), Indices(0, 32));
    EXPECT_EQ(Prefix(sink->token_ids(), c.strict), Prefix(c.generated, c.strict));
    ExpectFinishedOk(*sink, FinishReason::kLength);
    // Only the first token reports the prompt tokens D computed.
    for (const SinkEvent& e : sink->events()) {
      if (e.kind != SinkEvent::Kind::kToken) continue;
      EXPECT_EQ(e.prompt_tokens_computed, e.index == 0 ? c.prompt.size() : 0u);
    }
    prompt_tokens += c.prompt.size();
    CoreStats stats = engine->GetStats();
    EXPECT_EQ(stats.kv_blocks_in_use, 0u);
    EXPECT_EQ(stats.running_requests, 0u);
    EXPECT_EQ(stats.prefill_tokens_computed_total, prompt_tokens);
  }
  EXPECT_EQ(engine->GetStats().kv_blocks_total, 256u);
}

// Regression: FinishSequence told the sink before it freed the request's
// id and published the freed blocks, so a caller reacting to Finish saw
// stale stats and got ALREADY_EXISTS when it reused the id.
TEST_F(DecodeWorkerTest, StatsAndIdReleasedBeforeFinishIsDelivered) {
  auto engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  const GoldenCase c = Golden("once_upon_a_time");
  auto first = std::make_shared<RecordingSink>();
  auto second = std::make_shared<RecordingSink>();
  CoreStats at_finish;
  absl::Status resubmit = absl::UnknownError("not called");
  first->RunAtFinish([&] {
    at_finish = engine->GetStats();
    resubmit = engine->Submit(Request("same-id", c, 2, RouteChoice::kLocal), second);
  });
  ASSERT_TRUE(engine->Submit(Request("same-id", c, 4, RouteChoice::kLocal), first).ok());
  ASSERT_TRUE(first->WaitFinish());
  EXPECT_EQ(at_finish.kv_blocks_in_use, 0u);
  EXPECT_EQ(at_finish.running_requests, 0u);
  EXPECT_TRUE(resubmit.ok()) << resubmit;
  if (resubmit.ok()) {
    ASSERT_TRUE(second->WaitFinish());
    EXPECT_EQ(second->token_ids(), Prefix(c.generated, 2));
  }
}

TEST_F(DecodeWorkerTest, AutoRoutingAtThresholdThenRealPrefillEngine) {
  auto engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);

  // L = 32 <= max_local_prefill_tokens: local.
  const GoldenCase local = Golden("boundary_32tok");
  ASSERT_EQ(local.prompt.size(), 32u);
  auto local_sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Request("b32", local, 32, RouteChoice::kAuto), local_sink).ok());
  ASSERT_TRUE(local_sink->WaitFinish());
  EXPECT_FALSE(local_sink->need_remote_prefill().has_value());
  EXPECT_EQ(local_sink->token_indices(), Indices(0, 32));
  EXPECT_EQ(Prefix(local_sink->token_ids(), local.strict),
            Prefix(local.generated, local.strict));
  ExpectFinishedOk(*local_sink, FinishReason::kLength);

  // L = 33: NeedRemotePrefill comes first.
  const GoldenCase remote = Golden("boundary_33tok");
  ASSERT_EQ(remote.prompt.size(), 33u);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Request("b33", remote, 32, RouteChoice::kAuto), sink).ok());
  ASSERT_TRUE(sink->WaitNeedRemotePrefill());
  const SinkEvent need = *sink->need_remote_prefill();
  EXPECT_EQ(sink->events().front().kind, SinkEvent::Kind::kNeedRemotePrefill);
  EXPECT_EQ(need.kv_endpoint, engine->kv_endpoint());
  EXPECT_EQ(need.hit_tokens, 0u);
  EXPECT_EQ(need.attempt, 1u);

  // A real prefill worker engine in this process plays P.
  worker_testing::TestPrefillWorker p(Options(), &model());
  prefill::PrefillRequest pr;
  pr.request_id = "b33";
  pr.prompt = remote.prompt;
  pr.max_tokens = 32;
  pr.kv_target.endpoint = need.kv_endpoint;
  pr.kv_target.attempt = need.attempt;
  pr.kv_target.hit_tokens = need.hit_tokens;
  worker_testing::PrefillDoneRecorder p_done;
  p.Submit(pr, p_done.Callback());
  auto p_result = p_done.Wait();
  ASSERT_TRUE(p_result.has_value());
  ASSERT_TRUE(p_result->ok()) << p_result->status();
  EXPECT_EQ((*p_result)->samples.at(0).token.token_id, remote.generated[0]);
  EXPECT_EQ((*p_result)->samples.at(0).finish_reason, FinishReason::kNone);

  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_EQ(sink->token_indices(), Indices(1, 32));
  std::vector<int32_t> ids = sink->token_ids();
  ids.insert(ids.begin(), (*p_result)->samples.at(0).token.token_id);
  EXPECT_EQ(Prefix(ids, remote.strict), Prefix(remote.generated, remote.strict));
  ExpectFinishedOk(*sink, FinishReason::kLength);
  CoreStats stats = engine->GetStats();
  EXPECT_EQ(stats.kv_bytes_received_total, StoriesKvBytes(33));
  EXPECT_EQ(stats.prefill_tokens_computed_total, 32u);  // b32 only
  EXPECT_EQ(stats.kv_blocks_in_use, 0u);
}

TEST_F(DecodeWorkerTest, RemotePrefillFromTestSenderStreamsFromIndexOne) {
  auto engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  const GoldenCase c = Golden("long_repeated_313tok");
  const int32_t len = static_cast<int32_t>(c.prompt.size());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Request("long", c, 32, RouteChoice::kAuto), sink).ok());
  ASSERT_TRUE(sink->WaitNeedRemotePrefill());
  const SinkEvent need = *sink->need_remote_prefill();
  EXPECT_EQ(need.kv_endpoint, engine->kv_endpoint());
  EXPECT_EQ(need.hit_tokens, 0u);
  EXPECT_EQ(need.attempt, 1u);
  SendRemotePrefill(need, "long", c, c.generated[0], FinishReason::kNone);

  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_EQ(sink->token_indices(), Indices(1, 32));
  std::vector<int32_t> expected(c.generated.begin() + 1, c.generated.begin() + c.strict);
  EXPECT_EQ(Prefix(sink->token_ids(), c.strict - 1), expected);
  for (const SinkEvent& e : sink->events()) {
    if (e.kind == SinkEvent::Kind::kToken) {
      EXPECT_EQ(e.prompt_tokens_computed, 0u);
    }
  }
  ExpectFinishedOk(*sink, FinishReason::kLength);
  CoreStats stats = engine->GetStats();
  EXPECT_EQ(stats.kv_bytes_received_total, StoriesKvBytes(len));
  EXPECT_EQ(stats.prefill_tokens_computed_total, 0u);
  EXPECT_EQ(stats.kv_blocks_in_use, 0u);
  EXPECT_EQ(stats.transfers_in_flight, 0u);
  EXPECT_EQ(stats.running_requests, 0u);
}

TEST_F(DecodeWorkerTest, RemoteFinalWithLengthFinishesWithoutTokens) {
  auto engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  const GoldenCase c = Golden("once_upon_a_time");
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Request("one", c, 1, RouteChoice::kRemote), sink).ok());
  ASSERT_TRUE(sink->WaitNeedRemotePrefill());
  SendRemotePrefill(*sink->need_remote_prefill(), "one", c, c.generated[0],
                    FinishReason::kLength);
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->token_ids().empty());
  ExpectFinishedOk(*sink, FinishReason::kLength);
  EXPECT_EQ(engine->GetStats().kv_blocks_in_use, 0u);
}

TEST_F(DecodeWorkerTest, FinalWithTokenOutsideVocabularyIsDataLoss) {
  auto engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  const GoldenCase c = Golden("once_upon_a_time");
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Request("bad-final", c, 8, RouteChoice::kRemote), sink).ok());
  ASSERT_TRUE(sink->WaitNeedRemotePrefill());
  SendRemotePrefill(*sink->need_remote_prefill(), "bad-final", c, worker_testing::kStoriesVocab,
                    FinishReason::kNone);
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->token_ids().empty());
  EXPECT_EQ(sink->finish()->status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(engine->GetStats().kv_blocks_in_use, 0u);
}

TEST_F(DecodeWorkerTest, SenderVanishingMidTransferIsUnavailable) {
  auto engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  const GoldenCase c = Golden("lily_and_ben");
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Request("vanish", c, 8, RouteChoice::kRemote), sink).ok());
  ASSERT_TRUE(sink->WaitNeedRemotePrefill());
  const SinkEvent need = *sink->need_remote_prefill();
  {
    worker_testing::PromptKv kv = worker_testing::ComputePromptKv(model(), c.prompt, 16);
    auto sender = kvtransfer::KvSender::Connect(
        need.kv_endpoint, "vanish", need.attempt,
        worker_testing::StoriesLayout(model(), kFingerprint), backend::CpuBitExactClass(model(), kv::KvDtype::kF32), 2000);
    ASSERT_TRUE(sender.ok()) << sender.status();
    // Two of five layers, then the connection closes.
    ASSERT_TRUE(worker_testing::SendPromptKv(**sender, kv, 2, 0,
                                             static_cast<int32_t>(c.prompt.size()))
                    .ok());
  }
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->token_ids().empty());
  EXPECT_EQ(sink->finish()->status.code(), absl::StatusCode::kUnavailable);
  CoreStats stats = engine->GetStats();
  EXPECT_EQ(stats.kv_blocks_in_use, 0u);
  EXPECT_EQ(stats.transfers_in_flight, 0u);
}

TEST_F(DecodeWorkerTest, ConcurrentLocalRequestsAreBatched) {
  auto engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  // Hold the loop inside a Token call so all four requests arrive together.
  auto gate = std::make_shared<RecordingSink>();
  gate->GateAtToken(0);
  ASSERT_TRUE(engine
                  ->Submit(Request("gate", Golden("once_upon_a_time"), 1, RouteChoice::kLocal),
                           gate)
                  .ok());
  ASSERT_TRUE(gate->WaitGated());
  const std::vector<std::string> names = {"once_upon_a_time", "lily_and_ben", "the_little_dog",
                                          "long_repeated_313tok"};
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const std::string& name : names) {
    sinks.push_back(std::make_shared<RecordingSink>());
    ASSERT_TRUE(
        engine->Submit(Request(name, Golden(name), 32, RouteChoice::kLocal), sinks.back()).ok());
  }
  gate->Release();
  ASSERT_TRUE(gate->WaitFinish());
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(names[i]);
    const GoldenCase c = Golden(names[i]);
    ASSERT_TRUE(sinks[i]->WaitFinish());
    EXPECT_EQ(sinks[i]->token_indices(), Indices(0, 32));
    EXPECT_EQ(Prefix(sinks[i]->token_ids(), c.strict), Prefix(c.generated, c.strict));
    ExpectFinishedOk(*sinks[i], FinishReason::kLength);
  }
  CoreStats stats = engine->GetStats();
  // All four were prefilled in one step and decoded together: 31 decode
  // steps of 4 sequences each.
  EXPECT_EQ(stats.max_decode_batch_size, 4u);
  EXPECT_EQ(stats.decode_tokens_total, 4u * 31u);
  EXPECT_EQ(stats.kv_blocks_in_use, 0u);
  EXPECT_EQ(stats.running_requests, 0u);
}

TEST_F(DecodeWorkerTest, CancelWhileDecodingFreesBlocks) {
  auto engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  const GoldenCase c = Golden("lily_and_ben");
  auto sink = std::make_shared<RecordingSink>();
  sink->GateAtToken(3);
  ASSERT_TRUE(engine->Submit(Request("cancel-me", c, 32, RouteChoice::kLocal), sink).ok());
  ASSERT_TRUE(sink->WaitGated());
  engine->Cancel("cancel-me");
  engine->Cancel("no-such-request");  // ignored
  sink->Release();
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_EQ(sink->token_indices(), Indices(0, 4));
  EXPECT_EQ(sink->token_ids(), Prefix(c.generated, 4));
  EXPECT_EQ(sink->finish()->status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sink->finish()->reason, FinishReason::kNone);  // an error carries no sample reason
  CoreStats stats = engine->GetStats();
  EXPECT_EQ(stats.kv_blocks_in_use, 0u);
  EXPECT_EQ(stats.running_requests, 0u);
}

TEST_F(DecodeWorkerTest, CancelWhileWaitingForKvFreesBlocks) {
  auto engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  const GoldenCase c = Golden("long_repeated_313tok");
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Request("waiting", c, 32, RouteChoice::kAuto), sink).ok());
  ASSERT_TRUE(sink->WaitNeedRemotePrefill());
  engine->Cancel("waiting");
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->token_ids().empty());
  EXPECT_EQ(sink->finish()->status.code(), absl::StatusCode::kCancelled);
  CoreStats stats = engine->GetStats();
  EXPECT_EQ(stats.kv_blocks_in_use, 0u);
  EXPECT_EQ(stats.transfers_in_flight, 0u);
  EXPECT_EQ(stats.running_requests, 0u);
  // A late P is turned away.
  auto late = kvtransfer::KvSender::Connect(sink->need_remote_prefill()->kv_endpoint, "waiting",
                                            1, worker_testing::StoriesLayout(model(), kFingerprint), backend::CpuBitExactClass(model(), kv::KvDtype::kF32),
                                            1000);
  EXPECT_FALSE(late.ok());
}

TEST_F(DecodeWorkerTest, HandshakeTimeoutEndsWithUnavailable) {
  WorkerOptions options = Options();
  options.handshake_timeout_ms = 300;
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine
                  ->Submit(Request("nobody", Golden("once_upon_a_time"), 8,
                                   RouteChoice::kRemote),
                           sink)
                  .ok());
  ASSERT_TRUE(sink->WaitNeedRemotePrefill());
  // Bounded well below the 2 s transfer timeout and the default handshake.
  ASSERT_TRUE(sink->WaitFinish(absl::Milliseconds(1500)));
  EXPECT_TRUE(sink->token_ids().empty());
  EXPECT_EQ(sink->finish()->status.code(), absl::StatusCode::kUnavailable);
  CoreStats stats = engine->GetStats();
  EXPECT_EQ(stats.kv_blocks_in_use, 0u);
  EXPECT_EQ(stats.transfers_in_flight, 0u);
  EXPECT_EQ(stats.running_requests, 0u);
}

TEST_F(DecodeWorkerTest, RequestLargerThanPoolIsResourceExhausted) {
  WorkerOptions options = Options();
  options.num_kv_blocks = 4;  // 64 token slots
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  const GoldenCase c = Golden("once_upon_a_time");  // L = 5
  auto too_big = std::make_shared<RecordingSink>();
  // 5 + 61 - 1 = 65 tokens -> 5 blocks.
  absl::Status s = engine->Submit(Request("big", c, 61, RouteChoice::kLocal), too_big);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // 5 + 60 - 1 = 64 tokens -> exactly the whole pool.
  auto fits = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Request("fits", c, 60, RouteChoice::kLocal), fits).ok());
  ASSERT_TRUE(fits->WaitFinish());
  EXPECT_EQ(fits->token_indices(), Indices(0, 60));
  EXPECT_EQ(Prefix(fits->token_ids(), c.strict), Prefix(c.generated, c.strict));
  ExpectFinishedOk(*fits, FinishReason::kLength);
  EXPECT_TRUE(too_big->events().empty());
  EXPECT_EQ(engine->GetStats().kv_blocks_in_use, 0u);
}

// Blocks are allocated as sequences grow; when the pool runs out the newest
// sequence is preempted (freed, recomputed later) and every request still
// ends with exactly the tokens it gives alone (issue #3: preemption).
TEST_F(DecodeWorkerTest, PreemptionUnderMemoryPressureKeepsGoldenIds) {
  WorkerOptions options = Options();
  options.num_kv_blocks = 4;
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  // a and b grow to 3 blocks each (5 + 32 - 1 = 36 tokens); c needs 1 block
  // (12 + 2 - 1 = 13 tokens): all three cannot stay resident at once.
  const GoldenCase a = Golden("once_upon_a_time");
  const GoldenCase b = Golden("the_little_dog");
  const GoldenCase c = Golden("lily_and_ben");
  auto sa = std::make_shared<RecordingSink>();
  auto sb = std::make_shared<RecordingSink>();
  auto sc = std::make_shared<RecordingSink>();
  // Hold the loop inside a's first token so b and c arrive while a runs.
  sa->GateAtToken(0);
  ASSERT_TRUE(engine->Submit(Request("a", a, 32, RouteChoice::kLocal), sa).ok());
  ASSERT_TRUE(sa->WaitGated());
  ASSERT_TRUE(engine->Submit(Request("b", b, 32, RouteChoice::kLocal), sb).ok());
  ASSERT_TRUE(engine->Submit(Request("c", c, 2, RouteChoice::kLocal), sc).ok());
  sa->Release();
  ASSERT_TRUE(sa->WaitFinish());
  ASSERT_TRUE(sb->WaitFinish());
  ASSERT_TRUE(sc->WaitFinish());
  EXPECT_EQ(sa->token_ids(), Prefix(a.generated, a.strict));
  EXPECT_EQ(sb->token_ids(), Prefix(b.generated, b.strict));
  EXPECT_EQ(sc->token_ids(), Prefix(c.generated, 2));
  ExpectFinishedOk(*sa, FinishReason::kLength);
  ExpectFinishedOk(*sb, FinishReason::kLength);
  ExpectFinishedOk(*sc, FinishReason::kLength);
  CoreStats stats = engine->GetStats();
  EXPECT_GT(stats.preemptions_total, 0u);
  EXPECT_EQ(stats.kv_blocks_in_use, 0u);
  EXPECT_EQ(stats.running_requests, 0u);
}

// Regression: cancelling a request queued behind another left its id in
// the FCFS queue; a resubmitted request with that id was then admitted
// twice (once per queue entry), leaking the first block table.
TEST_F(DecodeWorkerTest, ResubmitAfterCancelWhileQueuedDoesNotLeakBlocks) {
  // holder: a remote request (313 prompt tokens, 1 new) waiting for KV that
  // nobody sends reserves prompt + 1 = 314 tokens, i.e. all 20 blocks,
  // until cancelled. So head
  // cannot be admitted (no block is free) and x stays queued behind it,
  // whatever the timing of the engine loop.
  WorkerOptions options = Options();
  options.num_kv_blocks = 20;
  auto engine = MakeEngine(options);
  ASSERT_NE(engine, nullptr);
  auto holder = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine
                  ->Submit(Request("holder", Golden("long_repeated_313tok"), 1,
                                   RouteChoice::kRemote),
                           holder)
                  .ok());
  ASSERT_TRUE(holder->WaitNeedRemotePrefill());
  // Stats are published at the end of the engine step that sent
  // NeedRemotePrefill: wait (bounded) for that step to end.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (engine->GetStats().kv_blocks_in_use != 20u && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(engine->GetStats().kv_blocks_in_use, 20u);
  // head: queued (no free block). x: 1 block (12 + 2 - 1 = 13 tokens),
  // queued behind head.
  const GoldenCase x = Golden("lily_and_ben");
  auto head = std::make_shared<RecordingSink>();
  auto x1 = std::make_shared<RecordingSink>();
  ASSERT_TRUE(
      engine->Submit(Request("head", Golden("the_little_dog"), 32, RouteChoice::kLocal), head)
          .ok());
  ASSERT_TRUE(engine->Submit(Request("x", x, 2, RouteChoice::kLocal), x1).ok());
  engine->Cancel("x");
  ASSERT_TRUE(x1->WaitFinish());
  EXPECT_EQ(x1->finish()->status.code(), absl::StatusCode::kCancelled);
  auto x2 = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Request("x", x, 2, RouteChoice::kLocal), x2).ok());
  engine->Cancel("holder");
  ASSERT_TRUE(holder->WaitFinish());
  ASSERT_TRUE(head->WaitFinish());
  ASSERT_TRUE(x2->WaitFinish());
  EXPECT_EQ(x2->token_indices(), Indices(0, 2));
  EXPECT_EQ(x2->token_ids(), Prefix(x.generated, 2));
  ExpectFinishedOk(*x2, FinishReason::kLength);
  ExpectFinishedOk(*head, FinishReason::kLength);
  CoreStats stats = engine->GetStats();
  EXPECT_EQ(stats.kv_blocks_in_use, 0u);
  EXPECT_EQ(stats.running_requests, 0u);
}

TEST_F(DecodeWorkerTest, SubmitValidation) {
  auto engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  const GoldenCase c = Golden("once_upon_a_time");
  std::vector<std::shared_ptr<RecordingSink>> rejected;
  auto expect_invalid = [&](EngineRequest r, const std::string& what) {
    auto sink = std::make_shared<RecordingSink>();
    rejected.push_back(sink);
    absl::Status s = engine->Submit(std::move(r), sink);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what << ": " << s;
  };
  EngineRequest r = Request("v", c, 4, RouteChoice::kLocal);
  r.prompt.clear();
  expect_invalid(r, "empty prompt");
  r = Request("v", c, 0, RouteChoice::kLocal);
  expect_invalid(r, "max_tokens 0");
  r = Request("v", c, worker_testing::kStoriesContext - 5 + 1, RouteChoice::kLocal);
  expect_invalid(r, "prompt + max_tokens = 2049");
  r = Request("v", c, 4, RouteChoice::kLocal);
  r.prompt.push_back(worker_testing::kStoriesVocab);
  expect_invalid(r, "token id 512");
  r = Request("v", c, 4, RouteChoice::kLocal);
  r.prompt[1] = -1;
  expect_invalid(r, "token id -1");
  r = Request("v", c, 4, RouteChoice::kLocal);
  r.sampling.temperature = std::numeric_limits<float>::quiet_NaN();
  expect_invalid(r, "temperature NaN");

  // A live id is refused; the first request is untouched.
  auto live = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Request("dup", c, 4, RouteChoice::kRemote), live).ok());
  ASSERT_TRUE(live->WaitNeedRemotePrefill());
  auto dup = std::make_shared<RecordingSink>();
  rejected.push_back(dup);
  EXPECT_EQ(engine->Submit(Request("dup", c, 4, RouteChoice::kLocal), dup).code(),
            absl::StatusCode::kAlreadyExists);
  engine->Cancel("dup");
  ASSERT_TRUE(live->WaitFinish());
  EXPECT_EQ(live->finish()->status.code(), absl::StatusCode::kCancelled);

  // A good request after them: the loop has moved past any rejected one.
  auto ok = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Request("v", c, 2, RouteChoice::kLocal), ok).ok());
  ASSERT_TRUE(ok->WaitFinish());
  for (const auto& sink : rejected) EXPECT_TRUE(sink->events().empty());
  EXPECT_EQ(engine->GetStats().running_requests, 0u);
}

TEST_F(DecodeWorkerTest, ShutdownEndsRunningRequestsWithUnavailable) {
  auto engine = MakeEngine(Options());
  ASSERT_NE(engine, nullptr);
  const GoldenCase c = Golden("once_upon_a_time");
  auto remote = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Request("remote", c, 8, RouteChoice::kRemote), remote).ok());
  ASSERT_TRUE(remote->WaitNeedRemotePrefill());
  auto local = std::make_shared<RecordingSink>();
  local->GateAtToken(2);
  ASSERT_TRUE(engine->Submit(Request("local", c, 32, RouteChoice::kLocal), local).ok());
  ASSERT_TRUE(local->WaitGated());
  engine->Shutdown();
  local->Release();
  ASSERT_TRUE(local->WaitFinish());
  ASSERT_TRUE(remote->WaitFinish());
  EXPECT_EQ(local->token_indices(), Indices(0, 3));
  EXPECT_EQ(local->finish()->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(remote->finish()->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(remote->token_ids().empty());
  auto after = std::make_shared<RecordingSink>();
  EXPECT_EQ(engine->Submit(Request("after", c, 2, RouteChoice::kLocal), after).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(after->events().empty());
}

// The receiver's options come from kv_listen and kv.*, and its log lines
// (refused connections, failed transfers) reach the process log on stderr.
TEST(ReceiverKvLoaderOptionsTest, FromConfigMapsKeysAndLogsToStderr) {
  HostPort listen;
  listen.host = "10.1.2.3";
  listen.port = 7123;
  KvConfig kv;
  kv.handshake_timeout_ms = 1234;
  kv.transfer_timeout_ms = 567;
  const kvtransfer::KvReceiver::Options o = ReceiverKvLoader::OptionsFromConfig(listen, kv);
  EXPECT_EQ(o.host, "10.1.2.3");
  EXPECT_EQ(o.port, 7123);
  EXPECT_EQ(o.handshake_timeout_ms, 1234);
  EXPECT_EQ(o.transfer_timeout_ms, 567);
  ASSERT_TRUE(o.log);
  ::testing::internal::CaptureStderr();
  o.log("KV receiver: transfer for request r attempt 1 failed: CANCELLED: x");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(absl::EndsWith(
      err, "KV receiver: transfer for request r attempt 1 failed: CANCELLED: x\n"))
      << err;
}

}  // namespace
}  // namespace tandem::decode
