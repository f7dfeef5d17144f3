// The engine core's generation controls with fake seams (fake_backend.h):
// n > 1 samples forked from one prefill (local, remote and prefill-only),
// their KV sharing, CancelSample, stop_token_ids, ignore_eos, min_tokens
// and the controls' Submit errors. The reference for sample s is always an
// n = 1 request drawn with seed SampleSeed(seed, s), run alone: sample s of
// an n > 1 request must be exactly that stream.
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "engine/core/engine_core.h"
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

using testing::kBlockSize;
constexpr uint64_t kSeed = 1234;

// The suites' options, with prefix caching off: sharing must not depend on it.
EngineCoreOptions SampleOptions() {
  EngineCoreOptions o = testing::Options();
  o.scheduler.enable_prefix_caching = false;
  return o;
}

struct Harness : testing::Harness {
  explicit Harness(int32_t num_blocks, std::unique_ptr<FakeLoader> fake_loader = nullptr)
      : testing::Harness(num_blocks, std::move(fake_loader), SampleOptions()) {}
};

// A request drawing at temperature 5 (the fake's logits are then spread
// enough for samples to differ).
EngineRequest Request(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens,
                      int32_t n, uint64_t seed, std::shared_ptr<RecordingSink> sink,
                      RouteChoice route = RouteChoice::kLocal) {
  EngineRequest r;
  r.request_id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.route = route;
  r.sampling.temperature = 5.0f;
  r.sampling.seed = seed;
  r.controls.n = n;
  r.output = std::move(sink);
  return r;
}

// Sample s's reference: an n = 1 request with seed SampleSeed(kSeed, s).
std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int32_t max_tokens,
                               uint32_t s) {
  Harness h(64);
  auto sink = std::make_shared<RecordingSink>();
  EXPECT_TRUE(h.core->Submit(Request("ref", prompt, max_tokens, 1,
                                     sampling::SampleSeed(kSeed, s), sink))
                  .ok());
  EXPECT_TRUE(sink->WaitFinish());
  return sink->token_ids();
}

TEST(EngineCoreSamplesTest, EachSampleIsTheStreamOfItsOwnSeed) {
  const std::vector<int32_t> prompt = FakePrompt(14, 3);  // 3 full blocks + 2 tokens
  Harness h(64);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(h.core->Submit(Request("n4", prompt, 12, 4, kSeed, sink)).ok());
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->finish()->status.ok()) << sink->finish()->status;
  std::vector<std::vector<int32_t>> streams;
  for (uint32_t s = 0; s < 4; ++s) {
    SCOPED_TRACE(s);
    streams.push_back(sink->sample_token_ids(s));
    EXPECT_EQ(streams.back(), Reference(prompt, 12, s));
    EXPECT_EQ(sink->sample_finish(s), FinishReason::kLength);
  }
  // Sample 0 is the n = 1 stream of the request's own seed, and the
  // samples really differ.
  EXPECT_EQ(sampling::SampleSeed(kSeed, 0), kSeed);
  EXPECT_NE(streams[0], streams[1]);
  EXPECT_NE(streams[1], streams[2]);
  ASSERT_TRUE(h.WaitIdle());
}

// Migration of an n > 1 request (issue #32): every unfinished sample goes
// on from its own tokens at its own output index, one that had no token
// yet draws token 0 as the fork would have, and an ended one stays ended.
// Each stream equals the undisturbed sample's (its n = 1 reference).
TEST(EngineCoreSamplesTest, MigratedSamplesEachContinueFromTheirOwnTokens) {
  const std::vector<int32_t> prompt = FakePrompt(14, 5);
  std::vector<std::vector<int32_t>> ref;
  for (uint32_t s = 0; s < 3; ++s) ref.push_back(Reference(prompt, 10, s));
  ASSERT_GT(ref[0].size(), 4u);  // sample 0 goes on after its 4 tokens
  ASSERT_GE(ref[1].size(), 2u);
  Harness h(64);
  auto sink = std::make_shared<RecordingSink>();
  EngineRequest r = Request("mig", prompt, 10, 3, kSeed, sink);
  r.migrated_samples.resize(3);
  r.migrated_samples[0].generated.assign(ref[0].begin(), ref[0].begin() + 4);
  r.migrated_samples[1].generated.assign(ref[1].begin(), ref[1].begin() + 2);
  r.migrated_samples[1].finished = true;  // e.g. a stop string ended it
  // Sample 2 had streamed nothing when its decode worker died.
  ASSERT_TRUE(h.core->Submit(std::move(r)).ok());
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->finish()->status.ok()) << sink->finish()->status;
  EXPECT_EQ(sink->sample_token_ids(0), std::vector<int32_t>(ref[0].begin() + 4, ref[0].end()));
  EXPECT_TRUE(sink->sample_token_ids(1).empty());
  EXPECT_FALSE(sink->sample_finish(1).has_value());
  EXPECT_EQ(sink->sample_token_ids(2), ref[2]);
  std::vector<uint32_t> indices0, indices2;
  for (const SinkEvent& e : sink->events()) {
    if (e.kind != SinkEvent::Kind::kToken) continue;
    (e.sample_index == 0 ? indices0 : indices2).push_back(e.index);
  }
  // Indices from k on; each sample ends as its reference did (at
  // max_tokens, or on an end-of-generation id drawn before it).
  auto expected_indices = [](uint32_t from, size_t to) {
    std::vector<uint32_t> v;
    for (uint32_t i = from; i < to; ++i) v.push_back(i);
    return v;
  };
  auto expected_finish = [](const std::vector<int32_t>& r) {
    return r.size() == 10 ? FinishReason::kLength : FinishReason::kStop;
  };
  EXPECT_EQ(indices0, expected_indices(4, ref[0].size()));
  EXPECT_EQ(indices2, expected_indices(0, ref[2].size()));
  EXPECT_EQ(sink->sample_finish(0), expected_finish(ref[0]));
  EXPECT_EQ(sink->sample_finish(2), expected_finish(ref[2]));
  ASSERT_TRUE(h.WaitIdle());
}

TEST(EngineCoreSamplesTest, MigratedSamplesThatCannotContinueAreRefused) {
  Harness h(64);
  auto submit = [&](std::vector<EngineRequest::MigratedSample> samples, int64_t n,
                    std::vector<int32_t> generated = {}) {
    EngineRequest r = Request("bad", FakePrompt(8, 9), 4, static_cast<int32_t>(n), kSeed,
                              std::make_shared<RecordingSink>());
    r.migrated_samples = std::move(samples);
    r.generated = std::move(generated);
    return h.core->Submit(std::move(r));
  };
  using M = EngineRequest::MigratedSample;
  EXPECT_EQ(submit({M{{5}, false}}, 2).message(),
            "migrated_samples: 1 entries for n = 2 (one per sample, in sample order)");
  EXPECT_EQ(submit({M{{5}, true}, M{{}, true}}, 2).message(),
            "migrated_samples: every sample is finished");
  EXPECT_EQ(submit({M{{5}, false}, M{{1, 2, 3, 4}, false}}, 2).message(),
            "migrated_samples[1].generated_token_ids: 4 tokens leave nothing to generate "
            "under max_tokens 4 (a sample at its limit is finished)");
  EXPECT_EQ(submit({M{{5, 64}, false}, M{{}, false}}, 2).message(),
            "migrated_samples[0].generated_token_ids[1]: 64 is outside the vocabulary [0, 64)");
  EXPECT_EQ(submit({M{{5}, false}, M{{}, false}}, 2, {5}).message(),
            "generated_token_ids: must be empty when migrated_samples is set (one list per "
            "sample)");
  EXPECT_EQ(h.core->GetStats().running_requests, 0u);
}

TEST(EngineCoreSamplesTest, SamplesShareTheFullPromptBlocks) {
  // 42 tokens: 10 full blocks of 4 shared, 2 tokens recomputed per sample.
  const std::vector<int32_t> prompt = FakePrompt(42, 5);
  auto blocks_at_index_3 = [&](int32_t n) {
    Harness h(64);
    auto sink = std::make_shared<RecordingSink>();
    sink->GateAtToken(3);
    EXPECT_TRUE(h.core->Submit(Request("r", prompt, 8, n, kSeed, sink)).ok());
    EXPECT_TRUE(sink->WaitGated());
    const uint32_t in_use = h.core->GetStats().kv_blocks_in_use;
    sink->Release();
    EXPECT_TRUE(sink->WaitFinish());
    EXPECT_TRUE(h.WaitIdle());
    return in_use;
  };
  // When output index 3 is drawn every sequence holds 42 + 3 = 45 tokens:
  // 12 blocks alone; n = 3 shares 10 of them.
  const uint32_t single = blocks_at_index_3(1);
  EXPECT_EQ(single, 12u);
  const uint32_t three = blocks_at_index_3(3);
  EXPECT_EQ(three, 10u + 3u * 2u);
  EXPECT_LT(three, 3 * single);
}

TEST(EngineCoreSamplesTest, RemotePrefillForksFromTheTransferredPrompt) {
  const std::vector<int32_t> prompt = FakePrompt(40, 7);  // > 32: remote
  // Token 0 of each sample as a prefill worker draws them: a local run's.
  Harness local(64);
  auto local_sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(local.core->Submit(Request("l", prompt, 9, 3, kSeed, local_sink)).ok());
  ASSERT_TRUE(local_sink->WaitFinish());

  Harness h(64, std::make_unique<FakeLoader>());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(h.core->Submit(Request("r", prompt, 9, 3, kSeed, sink, RouteChoice::kAuto)).ok());
  ASSERT_TRUE(h.loader->WaitStarted("r"));
  std::vector<SampleStart> starts(3);
  for (uint32_t s = 0; s < 3; ++s) starts[s].token.token_id = local_sink->sample_token_ids(s)[0];
  h.loader->CompleteSamples("r", prompt, starts);
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->finish()->status.ok()) << sink->finish()->status;
  for (uint32_t s = 0; s < 3; ++s) {
    SCOPED_TRACE(s);
    std::vector<int32_t> expected = local_sink->sample_token_ids(s);
    expected.erase(expected.begin());  // token 0 came from the prefill worker
    EXPECT_EQ(sink->sample_token_ids(s), expected);
    EXPECT_EQ(sink->sample_finish(s), FinishReason::kLength);
  }
  ASSERT_TRUE(h.WaitIdle());
}

TEST(EngineCoreSamplesTest, RemoteSampleEndingAtTokenZeroIsNotForked) {
  const std::vector<int32_t> prompt = FakePrompt(40, 8);
  Harness h(64, std::make_unique<FakeLoader>());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(h.core->Submit(Request("r", prompt, 4, 2, kSeed, sink, RouteChoice::kAuto)).ok());
  ASSERT_TRUE(h.loader->WaitStarted("r"));
  std::vector<SampleStart> starts(2);
  starts[0].token.token_id = 5;
  starts[1].token.token_id = 6;
  starts[1].finish_reason = FinishReason::kStop;  // P saw it end
  h.loader->CompleteSamples("r", prompt, starts);
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_EQ(sink->sample_finish(1), FinishReason::kStop);
  EXPECT_TRUE(sink->sample_token_ids(1).empty());
  EXPECT_EQ(sink->sample_token_ids(0).size(), 3u);  // indices 1..3
  EXPECT_EQ(sink->sample_finish(0), FinishReason::kLength);
  ASSERT_TRUE(h.WaitIdle());
}

TEST(EngineCoreSamplesTest, RemoteResultWithTheWrongSampleCountIsDataLoss) {
  const std::vector<int32_t> prompt = FakePrompt(40, 9);
  Harness h(64, std::make_unique<FakeLoader>());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(h.core->Submit(Request("r", prompt, 4, 3, kSeed, sink, RouteChoice::kAuto)).ok());
  ASSERT_TRUE(h.loader->WaitStarted("r"));
  h.loader->Complete("r", prompt, 5);  // one token for n = 3
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_EQ(sink->finish()->status.code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(h.WaitIdle());
}

TEST(EngineCoreSamplesTest, PrefillOnlyRequestDrawsEverySamplesFirstToken) {
  const std::vector<int32_t> prompt = FakePrompt(20, 10);
  Harness h(64);
  auto kv_export = std::make_shared<FakeExport>(0);
  auto sink = std::make_shared<RecordingSink>();
  EngineRequest r = Request("p", prompt, 5, 3, kSeed, sink);
  r.kv_export = kv_export;
  ASSERT_TRUE(h.core->Submit(std::move(r)).ok());
  ASSERT_TRUE(sink->WaitFinish());
  const std::vector<SampleStart> sent = kv_export->finished_samples();
  ASSERT_EQ(sent.size(), 3u);
  for (uint32_t s = 0; s < 3; ++s) {
    SCOPED_TRACE(s);
    EXPECT_EQ(sent[s].token.token_id, Reference(prompt, 1, s)[0]);
    EXPECT_EQ(sent[s].finish_reason, FinishReason::kNone);
    EXPECT_EQ(sink->sample_token_ids(s), std::vector<int32_t>{sent[s].token.token_id});
    EXPECT_EQ(sink->sample_finish(s), FinishReason::kNone);
  }
  ASSERT_TRUE(h.WaitIdle());
}

TEST(EngineCoreSamplesTest, CancelSampleEndsOnlyThatSample) {
  const std::vector<int32_t> prompt = FakePrompt(10, 11);
  Harness h(64);
  auto sink = std::make_shared<RecordingSink>();
  sink->GateAtToken(2);
  ASSERT_TRUE(h.core->Submit(Request("c", prompt, 10, 3, kSeed, sink)).ok());
  ASSERT_TRUE(sink->WaitGated());
  h.core->CancelSample("c", 1);
  h.core->CancelSample("c", 7);     // no such sample: ignored
  h.core->CancelSample("nope", 0);  // unknown request: ignored
  sink->Release();
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_TRUE(sink->finish()->status.ok());
  EXPECT_EQ(sink->sample_finish(1), FinishReason::kCancelled);
  EXPECT_LT(sink->sample_token_ids(1).size(), 10u);
  EXPECT_EQ(sink->sample_token_ids(0), Reference(prompt, 10, 0));
  EXPECT_EQ(sink->sample_token_ids(2), Reference(prompt, 10, 2));
  EXPECT_EQ(sink->sample_finish(0), FinishReason::kLength);
  ASSERT_TRUE(h.WaitIdle());
}

TEST(EngineCoreSamplesTest, StopTokenIdsAndIgnoreEos) {
  const std::vector<int32_t> prompt = FakePrompt(9, 12);
  const std::vector<int32_t> greedy = FakeGenerate(prompt, 8);
  Harness h(64);
  // A stop id ends the sample at its first occurrence (index k).
  const int32_t stop_id = greedy[3];
  size_t k = 0;
  while (greedy[k] != stop_id) ++k;
  auto sink = std::make_shared<RecordingSink>();
  EngineRequest r = Request("s", prompt, 8, 1, kSeed, sink);
  r.sampling.temperature = 0.0f;
  r.controls.stop_token_ids = {stop_id, 63, stop_id};
  ASSERT_TRUE(h.core->Submit(std::move(r)).ok());
  ASSERT_TRUE(sink->WaitFinish());
  EXPECT_EQ(sink->token_ids(), std::vector<int32_t>(greedy.begin(), greedy.begin() + k + 1));
  EXPECT_EQ(sink->finish()->reason, FinishReason::kStop);

  // The model's end-of-generation id (here greedy[1]) ends generation,
  // unless ignore_eos.
  EngineCoreOptions o = SampleOptions();
  o.eog_token_ids = {greedy[1]};
  size_t eog_at = 0;
  while (greedy[eog_at] != greedy[1]) ++eog_at;
  for (const bool ignore_eos : {false, true}) {
    SCOPED_TRACE(ignore_eos);
    EngineCore core(o, std::make_unique<FakeBackend>(kBlockSize, 64), nullptr);
    auto out = std::make_shared<RecordingSink>();
    EngineRequest e = Request("e", prompt, 8, 1, kSeed, out);
    e.sampling.temperature = 0.0f;
    e.controls.ignore_eos = ignore_eos;
    ASSERT_TRUE(core.Submit(std::move(e)).ok());
    ASSERT_TRUE(out->WaitFinish());
    if (ignore_eos) {
      EXPECT_EQ(out->token_ids(), greedy);
      EXPECT_EQ(out->finish()->reason, FinishReason::kLength);
    } else {
      EXPECT_EQ(out->token_ids(),
                std::vector<int32_t>(greedy.begin(), greedy.begin() + eog_at + 1));
      EXPECT_EQ(out->finish()->reason, FinishReason::kStop);
    }
  }
}

TEST(EngineCoreSamplesTest, MinTokensMasksTheStopIdsUntilReached) {
  const std::vector<int32_t> prompt = FakePrompt(9, 13);
  const std::vector<int32_t> greedy = FakeGenerate(prompt, 8);
  const int32_t stop_id = greedy[0];  // the greedy pick at index 0
  Harness h(64);
  auto sink = std::make_shared<RecordingSink>();
  EngineRequest r = Request("m", prompt, 8, 1, kSeed, sink);
  r.sampling.temperature = 0.0f;
  r.controls.stop_token_ids = {stop_id};
  r.controls.min_tokens = 3;
  ASSERT_TRUE(h.core->Submit(std::move(r)).ok());
  ASSERT_TRUE(sink->WaitFinish());
  const std::vector<int32_t> ids = sink->token_ids();
  ASSERT_GE(ids.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(ids[i], stop_id) << i;  // masked
  EXPECT_NE(ids[0], greedy[0]);  // so index 0 took the runner-up
  ASSERT_TRUE(h.WaitIdle());
}

TEST(EngineCoreSamplesTest, SubmitRefusesBadControls) {
  Harness h(16);  // 64 token slots
  auto submit = [&](int32_t n, int64_t min_tokens, std::vector<int32_t> stop_ids,
                    int32_t prompt_len = 8, int32_t max_tokens = 4) {
    EngineRequest r = Request("x", FakePrompt(prompt_len, 1), max_tokens, n, kSeed,
                              std::make_shared<RecordingSink>());
    r.controls.min_tokens = min_tokens;
    r.controls.stop_token_ids = std::move(stop_ids);
    return h.core->Submit(std::move(r));
  };
  EXPECT_EQ(submit(0, 0, {}).message(), "n: must be in [1, 16], got 0");
  EXPECT_EQ(submit(17, 0, {}).message(), "n: must be in [1, 16], got 17");
  EXPECT_EQ(submit(1, 5, {}).message(), "min_tokens: must be in [0, max_tokens = 4], got 5");
  EXPECT_EQ(submit(1, 0, {3, testing::kFakeVocab}).message(),
            "stop_token_ids[1]: token id 64 is outside the vocabulary [0, 64)");
  // 40 + 24 - 1 = 63 tokens fit 16 blocks alone; n = 2 needs the 10 full
  // prompt blocks once and 6 more per sample: 22.
  absl::Status big = submit(2, 0, {}, 40, 24);
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted) << big;
  EXPECT_NE(big.message().find("22 KV blocks"), std::string::npos) << big;
  EXPECT_TRUE(h.WaitIdle());
}

}  // namespace
}  // namespace tandem::core
