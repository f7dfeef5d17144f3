// The engine core's state machine with fake seams (fake_backend.h): local
// generation, the WAITING_FOR_REMOTE_KV state (remote wait, cancel while
// waiting, failure, shutdown), preemption of a sequence that waited for
// remote KV, one prefix lookup per admission, prefill-only requests that
// export their KV, and Submit's errors. Expected tokens come from the fake
// model run alone (FakeGenerate), never from the core.
#include "engine/core/engine_core.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/engine/core/core_harness.h"
#include "tests/engine/core/fake_backend.h"
#include "tests/engine/core/recording_sink.h"

namespace tandem::core {
namespace {

using testing::FakeBackend;
using testing::FakeExport;
using testing::FakeGenerate;
using testing::FakeLoader;
using testing::FakePrompt;
using testing::RecordingSink;
using testing::SinkEvent;

using testing::Harness;
using testing::kBlockSize;
using testing::Options;

std::vector<uint32_t> Indices(uint32_t from, uint32_t to) {
  std::vector<uint32_t> v;
  for (uint32_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

std::vector<int32_t> Drop(std::vector<int32_t> v, size_t n) {
  v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(n, v.size())));
  return v;
}

void ExpectFinished(const RecordingSink& sink, const absl::Status& status, FinishReason reason) {
  std::optional<SinkEvent> f = sink.finish();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->status.code(), status.code()) << f->status;
  EXPECT_EQ(f->reason, reason);
  EXPECT_EQ(sink.finish_calls(), 1);
}

TEST(EngineCoreTest, LocalRequestsGenerateWhatTheModelGivesAlone) {
  Harness h(64);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int32_t i = 0; i < 5; ++i) {
    sinks.push_back(h.Submit(absl::StrCat("r", i), FakePrompt(5 + 7 * i, i), 12));
  }
  uint64_t prompt_tokens = 0;
  for (int32_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(sinks[i]->WaitFinish());
    EXPECT_EQ(sinks[i]->token_ids(), FakeGenerate(FakePrompt(5 + 7 * i, i), 12)) << i;
    EXPECT_EQ(sinks[i]->token_indices(), Indices(0, 12));
    ExpectFinished(*sinks[i], absl::OkStatus(), FinishReason::kLength);
    EXPECT_FALSE(sinks[i]->need_remote_prefill().has_value());
    prompt_tokens += static_cast<uint64_t>(5 + 7 * i);
  }
  ASSERT_TRUE(h.WaitIdle());
  const CoreStats s = h.core->GetStats();
  EXPECT_EQ(s.prefill_tokens_computed_total, prompt_tokens);
  EXPECT_EQ(s.decode_tokens_total, 5u * 11u);
  EXPECT_EQ(s.kv_blocks_total, 64u);
  EXPECT_EQ(s.transfers_in_flight, 0u);
}

TEST(EngineCoreTest, EosStopsGenerationAndIsStreamed) {
  const std::vector<int32_t> prompt = FakePrompt(6, 3);
  const std::vector<int32_t> ref = FakeGenerate(prompt, 8);
  EngineCoreOptions options = Options();
  options.eog_token_ids = {ref[5], ref[3]};  // a set, in any order
  Harness h(64, nullptr, options);
  auto sink = h.Submit("eos", prompt, 8);
  ASSERT_TRUE(sink->WaitFinish());
  // Generation stops at the first end-of-generation token, which is streamed.
  const size_t first_eos = static_cast<size_t>(
      std::find_if(ref.begin(), ref.end(), [&](int32_t t) { return t == ref[3] || t == ref[5]; }) -
      ref.begin());
  EXPECT_EQ(sink->token_ids(), std::vector<int32_t>(ref.begin(), ref.begin() + first_eos + 1));
  ExpectFinished(*sink, absl::OkStatus(), FinishReason::kStop);
  // kContext cannot be reached through Submit (prompt + max_tokens <= the
  // context length, and max_tokens is checked first): stop_checker_test
  // covers it.
}

TEST(EngineCoreTest, RemotePrefillWaitsForRemoteKvThenDecodesFromIndexOne) {
  Harness h(64, std::make_unique<FakeLoader>());
  const std::vector<int32_t> prompt = FakePrompt(40, 1);  // 40 > 32: remote
  const std::vector<int32_t> ref = FakeGenerate(prompt, 10);
  auto sink = h.Submit("remote", prompt, 10);
  ASSERT_TRUE(sink->WaitNeedRemotePrefill());
  ASSERT_TRUE(h.loader->WaitStarted("remote"));
  const FakeLoader::Load load = h.loader->load("remote");
  EXPECT_EQ(load.hit_tokens, 0);
  EXPECT_EQ(load.prompt_tokens, 40);
  // Blocks for L + 1 tokens: token 0's K/V is computed here.
  EXPECT_EQ(load.block_table.size(), 11u);
  const SinkEvent need = *sink->need_remote_prefill();
  EXPECT_EQ(need.kv_endpoint, "fake-receiver:1");
  EXPECT_EQ(need.hit_tokens, 0u);
  EXPECT_EQ(need.attempt, 1u);
  // Waiting: no token, the blocks are held, nothing computed.
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(sink->token_ids().empty());
  EXPECT_EQ(h.core->GetStats().kv_blocks_in_use, 11u);
  EXPECT_EQ(h.core->GetStats().transfers_in_flight, 1u);
  EXPECT_EQ(h.backend->forward_calls(), 0);

  h.loader->Complete("remote", prompt, ref[0]);
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_EQ(sink->token_indices(), Indices(1, 10));
  EXPECT_EQ(sink->token_ids(), Drop(ref, 1));
  for (const SinkEvent& e : sink->events()) {
    if (e.kind == SinkEvent::Kind::kToken) {
      EXPECT_EQ(e.prompt_tokens_computed, 0u);
    }
  }
  ExpectFinished(*sink, absl::OkStatus(), FinishReason::kLength);
  ASSERT_TRUE(h.WaitIdle());
  EXPECT_EQ(h.core->GetStats().prefill_tokens_computed_total, 0u);
  // The prompt's full blocks were published: a repeat goes local (hit 36).
  auto again = h.Submit("again", prompt, 3);
  ASSERT_TRUE(again->WaitFinish());
  EXPECT_FALSE(again->need_remote_prefill().has_value());
  EXPECT_EQ(again->token_ids(), FakeGenerate(prompt, 3));
  EXPECT_EQ(again->events().front().prompt_tokens_computed, 4u);
  EXPECT_EQ(h.loader->starts(), 1);
}

TEST(EngineCoreTest, RemoteFinishAtTokenZeroEndsWithoutDecoding) {
  Harness h(64, std::make_unique<FakeLoader>());
  const std::vector<int32_t> prompt = FakePrompt(12, 2);
  auto sink = h.Submit("one", prompt, 1, RouteChoice::kRemote);
  ASSERT_TRUE(h.loader->WaitStarted("one"));
  h.loader->Complete("one", prompt, FakeGenerate(prompt, 1)[0], FinishReason::kLength);
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->token_ids().empty());
  ExpectFinished(*sink, absl::OkStatus(), FinishReason::kLength);
  ASSERT_TRUE(h.WaitIdle());
  EXPECT_EQ(h.backend->forward_calls(), 0);
}

TEST(EngineCoreTest, CancelWhileWaitingFreesBlocksOnlyOnceTheLoadQuiesced) {
  Harness h(64, std::make_unique<FakeLoader>());
  auto sink = h.Submit("c", FakePrompt(40, 4), 8);
  ASSERT_TRUE(h.loader->WaitStarted("c"));
  h.core->Cancel("c");
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (!h.loader->cancel_requested("c") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(h.loader->cancel_requested("c"));
  // ABORTING: the transfer may still write, so the blocks stay held.
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(sink->finish().has_value());
  EXPECT_EQ(h.core->GetStats().kv_blocks_in_use, 11u);
  h.loader->Fail("c", absl::CancelledError("quiesced"));
  ASSERT_TRUE(sink->WaitFinish());
  ExpectFinished(*sink, absl::CancelledError(""), FinishReason::kNone);
  ASSERT_TRUE(h.WaitIdle());
  // The id is free again.
  auto again = h.Submit("c", FakePrompt(6, 4), 2);
  ASSERT_TRUE(again->WaitFinish());
  EXPECT_EQ(again->token_ids(), FakeGenerate(FakePrompt(6, 4), 2));
}

TEST(EngineCoreTest, FailedLoadIsUnavailableAndStartErrorEndsTheRequest) {
  Harness h(64, std::make_unique<FakeLoader>());
  auto sink = h.Submit("f", FakePrompt(40, 5), 8);
  ASSERT_TRUE(h.loader->WaitStarted("f"));
  h.loader->Fail("f", absl::DeadlineExceededError("stalled"));
  ASSERT_TRUE(sink->WaitFinish());
  ExpectFinished(*sink, absl::UnavailableError(""), FinishReason::kNone);
  EXPECT_NE(sink->finish()->status.message().find("stalled"), std::string::npos);
  ASSERT_TRUE(h.WaitIdle());

  FakeLoader::Options refuse;
  refuse.start_error = absl::AlreadyExistsError("busy");
  Harness h2(64, std::make_unique<FakeLoader>(refuse));
  auto refused = h2.Submit("g", FakePrompt(40, 6), 8);
  ASSERT_TRUE(refused->WaitFinish());
  ExpectFinished(*refused, absl::AlreadyExistsError(""), FinishReason::kNone);
  EXPECT_FALSE(refused->need_remote_prefill().has_value());
  ASSERT_TRUE(h2.WaitIdle());
}

TEST(EngineCoreTest, ShutdownWhileWaitingEndsUnavailableAfterTheLoadQuiesces) {
  FakeLoader::Options options;
  options.quiesce_on_cancel = true;
  Harness h(64, std::make_unique<FakeLoader>(options));
  auto sink = h.Submit("s", FakePrompt(40, 7), 8);
  ASSERT_TRUE(h.loader->WaitStarted("s"));
  h.core.reset();  // Shutdown, waits for the cancelled load's done
  ExpectFinished(*sink, absl::UnavailableError(""), FinishReason::kNone);
}

// A sequence whose prompt came by remote prefill, preempted later, must
// recompute prompt + generated tokens here (never a second remote
// prefill) and continue with the same tokens.
TEST(EngineCoreTest, PreemptedAfterRemotePrefillRecomputesLocally) {
  const std::vector<int32_t> a_prompt = FakePrompt(4, 8);
  const std::vector<int32_t> b_prompt = FakePrompt(36, 9);
  FakeLoader::Options options;
  options.complete_with["b"] = b_prompt;  // the load completes at once
  // 18 blocks of 4 = 72 slots: a (4 + 30) and b (37 + 19) cannot both stay.
  Harness h(18, std::make_unique<FakeLoader>(options));
  auto a = std::make_shared<RecordingSink>();
  a->GateAtToken(0);  // b arrives while a runs: a is older
  EngineRequest ra;
  ra.request_id = "a";
  ra.prompt = a_prompt;
  ra.max_tokens = 30;
  ra.route = RouteChoice::kLocal;
  ra.output = a;
  ASSERT_TRUE(h.core->Submit(std::move(ra)).ok());
  ASSERT_TRUE(a->WaitGated());
  auto b = h.Submit("b", b_prompt, 20);
  a->Release();
  ASSERT_TRUE(a->WaitFinish());
  ASSERT_TRUE(b->WaitFinish());
  EXPECT_EQ(a->token_ids(), FakeGenerate(a_prompt, 30));
  ExpectFinished(*a, absl::OkStatus(), FinishReason::kLength);
  ASSERT_TRUE(b->need_remote_prefill().has_value());
  EXPECT_EQ(b->token_indices(), Indices(1, 20));
  EXPECT_EQ(b->token_ids(), Drop(FakeGenerate(b_prompt, 20), 1));
  ExpectFinished(*b, absl::OkStatus(), FinishReason::kLength);
  EXPECT_EQ(h.loader->starts(), 1);
  ASSERT_TRUE(h.WaitIdle());
  EXPECT_GE(h.core->GetStats().preemptions_total, 1u);
}

TEST(EngineCoreTest, OnePrefixLookupPerAdmission) {
  Harness h(64, std::make_unique<FakeLoader>());
  const std::vector<int32_t> prompt = FakePrompt(40, 10);  // 10 full blocks
  auto warm = h.Submit("warm", prompt, 2, RouteChoice::kLocal);
  ASSERT_TRUE(warm->WaitFinish());
  uint64_t lookups = h.core->GetStats().prefix_cache.lookups;
  EXPECT_EQ(lookups, 1u);

  // AUTO with 36 cached tokens: 4 left to compute -> local, one lookup.
  auto local = h.Submit("local", prompt, 2);
  ASSERT_TRUE(local->WaitFinish());
  EXPECT_FALSE(local->need_remote_prefill().has_value());
  EXPECT_EQ(local->events().front().prompt_tokens_computed, 4u);
  EXPECT_EQ(h.core->GetStats().prefix_cache.lookups, ++lookups);

  // REMOTE: the hit covers every full block of L (a zero-byte transfer).
  auto remote = h.Submit("remote", prompt, 3, RouteChoice::kRemote);
  ASSERT_TRUE(h.loader->WaitStarted("remote"));
  EXPECT_EQ(h.loader->load("remote").hit_tokens, 40);
  EXPECT_EQ(h.core->GetStats().prefix_cache.lookups, ++lookups);
  h.loader->Complete("remote", prompt, FakeGenerate(prompt, 1)[0]);
  ASSERT_TRUE(remote->WaitFinish());
  EXPECT_EQ(remote->need_remote_prefill()->hit_tokens, 40u);
  EXPECT_EQ(remote->token_ids(), Drop(FakeGenerate(prompt, 3), 1));

  // A new long prompt under AUTO: remote, one lookup.
  auto fresh = h.Submit("fresh", FakePrompt(50, 11), 2);
  ASSERT_TRUE(h.loader->WaitStarted("fresh"));
  EXPECT_EQ(h.core->GetStats().prefix_cache.lookups, ++lookups);
  h.loader->Complete("fresh", FakePrompt(50, 11), FakeGenerate(FakePrompt(50, 11), 1)[0]);
  ASSERT_TRUE(fresh->WaitFinish());
  ASSERT_TRUE(h.WaitIdle());
  EXPECT_EQ(h.core->GetStats().prefix_cache.lookups, lookups);
}

// The counters behind WorkerStatus fields 30-39 (a worker's /metrics):
// prompt, cached, generated tokens, prefix-cache tokens queried and hit,
// steps (one step_observer call each) and remote KV loads.
TEST(EngineCoreTest, MetricCountersCountRequestsTokensStepsAndLoads) {
  absl::Mutex mu;
  std::vector<double> steps;
  EngineCoreOptions options = Options();
  options.step_observer = [&](double seconds) {
    absl::MutexLock lock(&mu);
    steps.push_back(seconds);
  };
  Harness h(64, std::make_unique<FakeLoader>(), options);
  const std::vector<int32_t> prompt = FakePrompt(40, 10);  // 10 full blocks
  // Local, nothing cached: lookup capped at 36 (the last token is computed).
  ASSERT_TRUE(h.Submit("warm", prompt, 2, RouteChoice::kLocal)->WaitFinish());
  // AUTO: lookup capped at 40 (a remote hit may cover L), hit 40; local
  // keeps 36 of it.
  ASSERT_TRUE(h.Submit("local", prompt, 2)->WaitFinish());
  // REMOTE: hit 40, token 0 from the prefill worker, 2 tokens drawn here.
  auto remote = h.Submit("remote", prompt, 3, RouteChoice::kRemote);
  ASSERT_TRUE(h.loader->WaitStarted("remote"));
  h.loader->Complete("remote", prompt, FakeGenerate(prompt, 1)[0]);
  ASSERT_TRUE(remote->WaitFinish());
  ASSERT_TRUE(h.WaitIdle());
  const CoreStats s = h.core->GetStats();
  EXPECT_EQ(s.prompt_tokens_total, 120u);
  EXPECT_EQ(s.prompt_tokens_cached_total, 36u + 40u);
  EXPECT_EQ(s.generation_tokens_total, 2u + 2u + 2u);
  EXPECT_EQ(s.prefix_cache.queried_tokens, 36u + 40u + 40u);
  EXPECT_EQ(s.prefix_cache.hit_tokens, 40u + 40u);
  EXPECT_EQ(s.kv_transfers_received_total, 1u);
  EXPECT_GE(s.kv_transfer_seconds_received_total, 0.0);
  EXPECT_EQ(s.kv_transfers_sent_total, 0u);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(s.engine_steps_total, steps.size());
  EXPECT_EQ(s.engine_steps_total, static_cast<uint64_t>(h.backend->forward_calls()));
  for (double seconds : steps) EXPECT_GE(seconds, 0.0);
}

// A prefill-only request counts one sent transfer, its prompt and the
// token 0 of each of its samples.
TEST(EngineCoreTest, MetricCountersCountAnExportAsOneSentTransfer) {
  Harness h(64);
  auto kv_export = std::make_shared<FakeExport>(0);
  auto sink = std::make_shared<RecordingSink>();
  EngineRequest r;
  r.request_id = "p";
  r.prompt = FakePrompt(30, 12);
  r.max_tokens = 5;
  r.output = sink;
  r.kv_export = kv_export;
  ASSERT_TRUE(h.core->Submit(std::move(r)).ok());
  ASSERT_TRUE(sink->WaitFinish());
  ASSERT_TRUE(h.WaitIdle());
  const CoreStats s = h.core->GetStats();
  EXPECT_EQ(s.kv_transfers_sent_total, 1u);
  EXPECT_GE(s.kv_transfer_seconds_sent_total, 0.0);
  EXPECT_EQ(s.kv_transfers_received_total, 0u);
  EXPECT_EQ(s.prompt_tokens_total, 30u);
  EXPECT_EQ(s.prompt_tokens_cached_total, 0u);
  EXPECT_EQ(s.generation_tokens_total, 1u);
  EXPECT_EQ(s.engine_steps_total, static_cast<uint64_t>(h.backend->forward_calls()));
}

// A prefill-only request: every layer of [first_token_to_send, L) goes out
// once, in order, cached rows first; it ends after token 0.
TEST(EngineCoreTest, PrefillOnlyRequestExportsItsKvAndEndsAfterTokenZero) {
  Harness h(64);
  const std::vector<int32_t> prompt = FakePrompt(30, 12);
  // Warm the prefix cache with the first 16 tokens (4 blocks).
  auto warm = h.Submit("warm", std::vector<int32_t>(prompt.begin(), prompt.begin() + 17), 1);
  ASSERT_TRUE(warm->WaitFinish());

  constexpr int32_t kFirst = 8;  // the receiver holds [0, 8)
  auto kv_export = std::make_shared<FakeExport>(kFirst);
  auto sink = std::make_shared<RecordingSink>();
  EngineRequest r;
  r.request_id = "p";
  r.prompt = prompt;
  r.max_tokens = 5;
  r.output = sink;
  r.kv_export = kv_export;
  ASSERT_TRUE(h.core->Submit(std::move(r)).ok());
  ASSERT_TRUE(sink->WaitFinish());
  ExpectFinished(*sink, absl::OkStatus(), FinishReason::kNone);
  const std::vector<int32_t> ref = FakeGenerate(prompt, 1);
  EXPECT_EQ(sink->token_ids(), ref);
  EXPECT_EQ(sink->token_indices(), Indices(0, 1));
  EXPECT_EQ(sink->events().front().prompt_tokens_computed, 30u - 16u);
  EXPECT_EQ(kv_export->opens(), 1);
  EXPECT_EQ(kv_export->finishes(), 1);
  EXPECT_EQ(kv_export->closes(), 1);
  EXPECT_EQ(kv_export->finished_token().token_id, ref[0]);
  EXPECT_EQ(kv_export->finished_reason(), FinishReason::kNone);

  // Per layer: contiguous ranges from kFirst to L, each row the fake's.
  std::vector<int32_t> next(testing::kFakeLayers, kFirst);
  for (const FakeExport::Sent& s : kv_export->sent()) {
    ASSERT_LT(s.layer, testing::kFakeLayers);
    EXPECT_EQ(s.start, next[static_cast<size_t>(s.layer)]) << "layer " << s.layer;
    for (int32_t i = 0; i < s.count; ++i) {
      float row[2];
      FakeBackend::KvRow(prompt[static_cast<size_t>(s.start + i)], s.start + i, row);
      EXPECT_EQ(s.k[static_cast<size_t>(2 * i)], row[0]);
      EXPECT_EQ(s.k[static_cast<size_t>(2 * i + 1)], row[1]);
      EXPECT_EQ(s.v[static_cast<size_t>(2 * i)], row[0]);
    }
    next[static_cast<size_t>(s.layer)] = s.start + s.count;
  }
  for (int32_t end : next) EXPECT_EQ(end, 30);
  // The first frames are the cached rows [8, 16), one per layer.
  ASSERT_GE(kv_export->sent().size(), 2u);
  EXPECT_EQ(kv_export->sent()[0].start, 8);
  EXPECT_EQ(kv_export->sent()[0].count, 8);
  ASSERT_TRUE(h.WaitIdle());
  const CoreStats stats = h.core->GetStats();
  EXPECT_EQ(stats.kv_bytes_sent_total, kv_export->bytes_sent());
  EXPECT_EQ(stats.kv_bytes_sent_total, 2u * 22u * 2u * 2u * 4u);  // layers x tokens x K,V x dim x f32
  EXPECT_EQ(stats.transfers_in_flight, 0u);
}

TEST(EngineCoreTest, ExportFailuresEndTheRequestWithTheirError) {
  Harness h(64);
  {
    auto kv_export = std::make_shared<FakeExport>(0, absl::OkStatus(), /*fail_send_at=*/3);
    auto sink = std::make_shared<RecordingSink>();
    EngineRequest r;
    r.request_id = "send-fails";
    r.prompt = FakePrompt(40, 13);  // chunks of 16: the failure hits chunk 2
    r.max_tokens = 4;
    r.output = sink;
    r.kv_export = kv_export;
    ASSERT_TRUE(h.core->Submit(std::move(r)).ok());
    ASSERT_TRUE(sink->WaitFinish());
    ExpectFinished(*sink, absl::UnavailableError(""), FinishReason::kNone);
    EXPECT_TRUE(sink->token_ids().empty());
    EXPECT_EQ(kv_export->finishes(), 0);
    EXPECT_EQ(kv_export->closes(), 1);
  }
  {
    auto kv_export =
        std::make_shared<FakeExport>(0, absl::FailedPreconditionError("layout mismatch"));
    auto sink = std::make_shared<RecordingSink>();
    EngineRequest r;
    r.request_id = "open-fails";
    r.prompt = FakePrompt(10, 14);
    r.output = sink;
    r.kv_export = kv_export;
    // Open runs in Submit (the transfer opens on receipt): its error is
    // Submit's, and nothing is queued.
    const absl::Status submitted = h.core->Submit(std::move(r));
    EXPECT_EQ(submitted.code(), absl::StatusCode::kFailedPrecondition) << submitted;
    EXPECT_EQ(submitted.message(), "layout mismatch");
    EXPECT_FALSE(sink->finish().has_value());
    EXPECT_TRUE(kv_export->sent().empty());
    EXPECT_EQ(h.core->GetStats().running_requests, 0u);
  }
  ASSERT_TRUE(h.WaitIdle());
  EXPECT_EQ(h.backend->forward_calls(), 2);  // the failing request's two chunks
}

// Waits (bounded) until pred() holds.
template <typename Pred>
bool WaitFor(Pred pred) {
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (!pred()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// An export whose receiver has no room waits, before its first chunk and
// between chunks, while other requests run; room again and it completes.
TEST(EngineCoreTest, ExportWithoutRoomWaitsWhileOthersRun) {
  Harness h(64);
  auto not_started = std::make_shared<FakeExport>(0);
  not_started->SetRoom(false);
  auto mid = std::make_shared<FakeExport>(0);
  mid->FullAfterSends(2);  // chunk 1 of 16 tokens, both layers, then full
  std::vector<std::shared_ptr<RecordingSink>> held;
  // Distinct prompts: no prefix-cache hit between them.
  const std::vector<std::vector<int32_t>> prompts = {FakePrompt(40, 15), FakePrompt(40, 18)};
  for (size_t i = 0; i < 2; ++i) {
    auto sink = std::make_shared<RecordingSink>();
    EngineRequest r;
    r.request_id = i == 0 ? "not-started" : "mid";
    r.prompt = prompts[i];  // chunks 16, 16, 8
    r.max_tokens = 4;
    r.output = sink;
    r.kv_export = i == 0 ? not_started : mid;
    ASSERT_TRUE(h.core->Submit(std::move(r)).ok());
    held.push_back(sink);
  }
  auto other = h.Submit("other", FakePrompt(10, 16), 3);
  ASSERT_TRUE(other->WaitFinish());
  ExpectFinished(*other, absl::OkStatus(), FinishReason::kLength);
  EXPECT_EQ(other->token_ids(), FakeGenerate(FakePrompt(10, 16), 3));
  // Both still wait: one never ran, the other sent exactly chunk 1.
  ASSERT_TRUE(WaitFor([&] { return mid->sent().size() == 2u; }));
  EXPECT_TRUE(not_started->sent().empty());
  EXPECT_EQ(mid->sent()[0].start, 0);
  EXPECT_EQ(mid->sent()[0].count, 16);
  EXPECT_FALSE(held[0]->WaitFinish(absl::Milliseconds(20)));
  EXPECT_FALSE(held[1]->WaitFinish(absl::Milliseconds(1)));
  EXPECT_EQ(mid->finishes(), 0);
  EXPECT_GE(not_started->ready_calls(), 1);
  // "not-started" waits outside the scheduler with its 40 prompt tokens;
  // "mid" runs with 40 - 16 left to prefill.
  ASSERT_TRUE(WaitFor([&] { return h.core->GetStats().queued_prefill_tokens == 64u; }));
  EXPECT_EQ(h.core->GetStats().waiting_requests, 1u);

  not_started->SetRoom(true);
  mid->SetRoom(true);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(held[i]->WaitFinish());
    ExpectFinished(*held[i], absl::OkStatus(), FinishReason::kNone);
    EXPECT_EQ(held[i]->token_ids(), FakeGenerate(prompts[i], 1));
  }
  for (const auto& e : {not_started, mid}) {
    ASSERT_EQ(e->sent().size(), 6u);  // 3 chunks x 2 layers
    EXPECT_EQ(e->sent().back().start + e->sent().back().count, 40);
  }
  ASSERT_TRUE(h.WaitIdle());
}

// The queue gauges the router scores with: a request waiting for the only
// sequence slot counts as waiting with its whole prompt queued; one
// waiting for remote KV holds the slot but queues nothing here.
TEST(EngineCoreTest, StatsCountWaitingRequestsAndTheirQueuedPromptTokens) {
  EngineCoreOptions options = Options();
  options.scheduler.max_num_seqs = 1;
  Harness h(64, std::make_unique<FakeLoader>(), options);
  auto remote = h.Submit("remote", FakePrompt(40, 2), 4);  // 40 > 32: remote
  ASSERT_TRUE(h.loader->WaitStarted("remote"));
  auto local = h.Submit("local", FakePrompt(10, 3), 2, RouteChoice::kLocal);
  ASSERT_TRUE(WaitFor([&] { return h.core->GetStats().waiting_requests == 1; }));
  CoreStats stats = h.core->GetStats();
  EXPECT_EQ(stats.running_requests, 2u);  // waiting ones included
  EXPECT_EQ(stats.waiting_requests, 1u);
  EXPECT_EQ(stats.queued_prefill_tokens, 10u);  // "local" whole; "remote" is not computed here
  h.loader->Complete("remote", FakePrompt(40, 2), FakeGenerate(FakePrompt(40, 2), 1)[0]);
  ASSERT_TRUE(remote->WaitFinish());
  ASSERT_TRUE(local->WaitFinish());
  ASSERT_TRUE(h.WaitIdle());
  stats = h.core->GetStats();
  EXPECT_EQ(stats.waiting_requests, 0u);
  EXPECT_EQ(stats.queued_prefill_tokens, 0u);
}

// After token 0 the request keeps its KV blocks until the export's result:
// OK ends it OK, an error ends it with that error, a cancel with CANCELLED.
TEST(EngineCoreTest, BlocksStayPinnedUntilTheTransferResult) {
  struct Case {
    const char* id;
    absl::Status result;  // what the transfer ends with; CANCELLED: cancel it
  };
  for (const Case& c : {Case{"ok", absl::OkStatus()},
                        Case{"late-fail", absl::DeadlineExceededError("receiver stalled")},
                        Case{"cancel", absl::CancelledError("")}}) {
    SCOPED_TRACE(c.id);
    Harness h(64);
    auto kv_export = std::make_shared<FakeExport>(0);
    kv_export->HoldResult();
    auto sink = std::make_shared<RecordingSink>();
    EngineRequest r;
    r.request_id = c.id;
    r.prompt = FakePrompt(30, 17);  // 8 blocks of 4
    r.max_tokens = 4;
    r.output = sink;
    r.kv_export = kv_export;
    ASSERT_TRUE(h.core->Submit(std::move(r)).ok());
    ASSERT_TRUE(WaitFor([&] { return kv_export->finishes() == 1; }));
    EXPECT_FALSE(sink->WaitFinish(absl::Milliseconds(20)));
    CoreStats stats = h.core->GetStats();
    EXPECT_EQ(stats.kv_blocks_in_use, 8u);
    EXPECT_EQ(stats.running_requests, 1u);
    EXPECT_EQ(stats.transfers_in_flight, 1u);
    EXPECT_EQ(kv_export->closes(), 0);
    if (absl::IsCancelled(c.result)) {
      h.core->Cancel(c.id);
    } else {
      kv_export->ReleaseResult(c.result);
    }
    ASSERT_TRUE(sink->WaitFinish());
    ExpectFinished(*sink, c.result, FinishReason::kNone);
    EXPECT_EQ(kv_export->closes(), 1);
    stats = h.core->GetStats();
    EXPECT_EQ(stats.kv_blocks_in_use, 0u);
    EXPECT_EQ(stats.running_requests, 0u);
    EXPECT_EQ(stats.transfers_in_flight, 0u);
  }
}

TEST(EngineCoreTest, SubmitRefusesWhatCanNeverRun) {
  Harness h(8);  // 32 token slots
  auto submit = [&](const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens,
                    RouteChoice route, std::shared_ptr<KvExport> kv_export = nullptr) {
    EngineRequest r;
    r.request_id = id;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.route = route;
    r.output = std::make_shared<RecordingSink>();
    r.kv_export = std::move(kv_export);
    return h.core->Submit(std::move(r));
  };
  EXPECT_EQ(submit("x", {}, 4, RouteChoice::kLocal).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(submit("x", {2, 3}, 0, RouteChoice::kLocal).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(submit("x", {2, testing::kFakeVocab}, 2, RouteChoice::kLocal).code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status remote = submit("x", {2, 3}, 2, RouteChoice::kRemote);
  EXPECT_EQ(remote.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(remote.message().find("test worker"), std::string::npos) << remote;
  // 20 + 13 - 1 = 32 tokens fit 8 blocks of 4; one more does not.
  EXPECT_TRUE(submit("fits", FakePrompt(20, 1), 13, RouteChoice::kLocal).ok());
  absl::Status big = submit("big", FakePrompt(20, 1), 14, RouteChoice::kLocal);
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.message().find("9 KV blocks (33 tokens)"), std::string::npos) << big;
  EXPECT_NE(big.message().find("has only 8"), std::string::npos) << big;
  // A prefill-only request holds only its prompt.
  EXPECT_TRUE(submit("p32", FakePrompt(32, 2), 100 - 32, RouteChoice::kLocal,
                     std::make_shared<FakeExport>(0))
                  .ok());
  ASSERT_TRUE(h.WaitIdle());
  // A live id is refused (the loop is held inside the first one's token).
  auto gated = std::make_shared<RecordingSink>();
  gated->GateAtToken(0);
  EngineRequest live;
  live.request_id = "dup";
  live.prompt = FakePrompt(4, 1);
  live.max_tokens = 2;
  live.output = gated;
  ASSERT_TRUE(h.core->Submit(std::move(live)).ok());
  ASSERT_TRUE(gated->WaitGated());
  EXPECT_EQ(submit("dup", FakePrompt(4, 1), 2, RouteChoice::kLocal).code(),
            absl::StatusCode::kAlreadyExists);
  gated->Release();
  ASSERT_TRUE(gated->WaitFinish());
  ASSERT_TRUE(h.WaitIdle());
  h.core->Shutdown();
  EXPECT_EQ(submit("late", FakePrompt(4, 1), 2, RouteChoice::kLocal).code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::core

namespace tandem::core {
namespace {

// Collects what the core hands to kv_event_sink (loop thread).
struct EventLog {
  absl::Mutex mu;
  std::vector<kv::KvCacheEvent> events;
  int batches = 0;
  std::function<void(std::vector<kv::KvCacheEvent>)> Sink() {
    return [this](std::vector<kv::KvCacheEvent> batch) {
      absl::MutexLock lock(&mu);
      EXPECT_FALSE(batch.empty());
      ++batches;
      events.insert(events.end(), batch.begin(), batch.end());
    };
  }
  std::vector<kv::KvCacheEvent> Take() {
    absl::MutexLock lock(&mu);
    return events;
  }
};

TEST(EngineCoreTest, KvEventSinkGetsEveryPublishedBlockAfterTheStep) {
  EventLog log;
  EngineCoreOptions options = Options();
  options.kv_event_sink = log.Sink();
  Harness h(64, nullptr, options);
  const std::vector<int32_t> prompt = FakePrompt(18, 4);  // 4 full blocks + 2
  auto sink = h.Submit("a", prompt, 1, RouteChoice::kLocal);
  ASSERT_TRUE(sink->WaitFinish());
  ASSERT_TRUE(h.WaitIdle());
  // max_tokens 1: no decode step, so exactly the prompt's full blocks.
  const std::vector<kv::BlockHash> want = kv::HashFullBlocks(prompt, kBlockSize, "fake-model");
  std::vector<kv::KvCacheEvent> expected;
  for (const kv::BlockHash& hash : want) {
    expected.push_back({kv::KvCacheEvent::Kind::kStored, hash});
  }
  // Published after the step that finished the request: poll (bounded).
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (log.Take().size() < expected.size() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(log.Take(), expected);
}

TEST(EngineCoreTest, KvEventSinkGetsNothingWithoutPrefixCaching) {
  EventLog log;
  EngineCoreOptions options = Options();
  options.scheduler.enable_prefix_caching = false;
  options.kv_event_sink = log.Sink();
  Harness h(64, nullptr, options);
  auto sink = h.Submit("a", FakePrompt(18, 4), 3, RouteChoice::kLocal);
  ASSERT_TRUE(sink->WaitFinish());
  ASSERT_TRUE(h.WaitIdle());
  EXPECT_TRUE(log.Take().empty());
  EXPECT_EQ(log.batches, 0);
}

}  // namespace
}  // namespace tandem::core
