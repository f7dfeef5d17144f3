// 16-bit KV caches (engine.kv_cache_dtype f16 / bf16 on the CPU) against
// llama.cpp's goldens:
//  - stories260K with F16 KV: llama.cpp's main fields were made with an F16
//    KV cache (../shared/goldens/stories260K_greedy.json, runtime_settings),
//    so the greedy ids equal generated_token_ids up to strict_prefix_len
//    and the top-5 logits of the first token (first_token_top5) are within
//    1e-2, those of every step of the strict prefix (steps[].top5) within
//    2e-2. (llama.cpp also rounds q and the softmax weights to
//    F16 in its F16-KV attention, where Tandem keeps them in F32; 1e-2
//    bounds that.)
//  - every other (model, dtype) pair, where no golden of that KV dtype
//    exists (BF16 everywhere; F16 on the BPE models): teacher-forced on the
//    F32-KV golden ids (each step is fed the golden's previous ids, so one
//    divergence does not hide the rest), the argmax equals the golden id at
//    every step whose golden top1 - top2 margin exceeds 0.1 (issue #19).
//    Exception, measured: BF16 KV on the random-weight BPE models. BF16
//    keeps 8 significant bits (rounding error 2^-9, 4x F16's), and these
//    models' logits (up to ~50, flat attention over large random
//    activations) move by up to 1.4 (qwen2) and 5.7 (llama3) anywhere in
//    the vocabulary against an F32 cache (F16: 0.24 and 0.43), which flips
//    2 of 176 (qwen2) and 7 of 182 (llama3) steps with margins up to 0.135
//    and 0.438. Those two are checked above a 0.5 margin instead; stories260K
//    (trained weights) holds the 0.1 rule with BF16.
// And batch invariance with each 16-bit dtype: alone vs batched, chunked,
// 1 or 2 threads, bit for bit.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "engine/model/llama_model.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem::model {
namespace {

using testing::Argmax;
using testing::GreedyDecode;
using testing::LoadedModel;
using testing::LoadGoldens;
using testing::LoadSharedModel;

constexpr double kF16KvLogitTolerance = 1e-2;
constexpr double kTeacherForcedMargin = 0.1;
constexpr int32_t kBlockSize = 16;

// A KV cache of `dtype` big enough for `tokens` tokens, and its table.
struct Cache {
  Cache(const LlamaModel& model, int32_t tokens, kv::KvDtype dtype)
      : blocks(kv::BlocksForTokens(tokens, kBlockSize)),
        kv(model.kv_shape(kBlockSize), blocks, dtype) {
    for (int32_t b = 0; b < blocks; ++b) table.push_back(b);
  }
  int32_t blocks;
  kv::CpuKvStorage kv;
  std::vector<int32_t> table;
};

// Logits after the prompt and after each of golden[0, n - 1): the logits
// that choose golden[i] when every earlier id is the golden's.
std::vector<std::vector<float>> TeacherForced(const LlamaModel& model, kv::KvDtype dtype,
                                              const std::vector<int32_t>& prompt,
                                              const std::vector<int32_t>& golden) {
  Cache cache(model, static_cast<int32_t>(prompt.size() + golden.size()), dtype);
  std::vector<std::vector<float>> out;
  std::vector<float> logits;
  SequenceBatch entry;
  entry.tokens = prompt;
  entry.start_pos = 0;
  entry.block_table = &cache.table;
  model.Forward(std::span<const SequenceBatch>(&entry, 1), cache.kv, &logits);
  out.push_back(logits);
  for (size_t i = 0; i + 1 < golden.size(); ++i) {
    entry.tokens = std::span<const int32_t>(&golden[i], 1);
    entry.start_pos = static_cast<int32_t>(prompt.size() + i);
    model.Forward(std::span<const SequenceBatch>(&entry, 1), cache.kv, &logits);
    out.push_back(logits);
  }
  return out;
}

// Expects argmax == golden[i] wherever margins[i] > min_margin; returns
// how many steps were checked.
size_t ExpectTeacherForced(const LlamaModel& model, kv::KvDtype dtype,
                           const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& golden,
                           const std::vector<double>& margins,
                           double min_margin = kTeacherForcedMargin) {
  const std::vector<std::vector<float>> logits = TeacherForced(model, dtype, prompt, golden);
  size_t checked = 0;
  for (size_t i = 0; i < golden.size() && i < margins.size(); ++i) {
    if (margins[i] <= min_margin) continue;
    EXPECT_EQ(Argmax(logits[i]), golden[i]) << "step " << i << " margin " << margins[i];
    ++checked;
  }
  return checked;
}

TEST(Kv16GoldenTest, StoriesF16KvMatchesLlamaCppF16KvGoldens) {
  for (int32_t threads : {1, 2}) {
    LoadedModel m = LoadSharedModel("stories260K.gguf", threads);
    ASSERT_NE(m.model, nullptr);
    const nlohmann::json goldens = testing::LoadStoriesGoldens();
    ASSERT_EQ(goldens["runtime_settings"]["kv_cache_type_k"], "f16");
    ASSERT_EQ(goldens["cases"].size(), 6u);
    for (const nlohmann::json& c : goldens["cases"]) {
      SCOPED_TRACE(c["name"].get<std::string>() + ", threads " + std::to_string(threads));
      const auto prompt = c["prompt_token_ids_with_bos"].get<std::vector<int32_t>>();
      const auto expected = c["generated_token_ids"].get<std::vector<int32_t>>();
      const size_t strict = c["strict_prefix_len"].get<size_t>();
      ASSERT_LE(strict, expected.size());
      Cache cache(*m.model, static_cast<int32_t>(prompt.size() + expected.size()),
                  kv::KvDtype::kF16);
      std::vector<std::vector<float>> logits;
      const std::vector<int32_t> got = GreedyDecode(*m.model, cache.kv, cache.table, prompt,
                                                    static_cast<int>(expected.size()), &logits);
      EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + strict),
                std::vector<int32_t>(expected.begin(), expected.begin() + strict));
      for (const nlohmann::json& top : c["first_token_top5"]) {
        const size_t id = top["id"].get<size_t>();
        ASSERT_LT(id, logits[0].size());
        EXPECT_NEAR(logits[0][id], top["logit"].get<double>(), kF16KvLogitTolerance)
            << "token " << id;
      }
      // And every step of the strict prefix (same inputs as llama.cpp's),
      // within twice that: llama.cpp's F16 rounding of q and of the softmax
      // weights adds up over the steps (observed: at most 0.0105).
      for (size_t step = 0; step < strict && step < c["steps"].size(); ++step) {
        for (const nlohmann::json& pair : c["steps"][step]["top5"]) {
          const size_t id = pair[0].get<size_t>();
          ASSERT_LT(id, logits[step].size());
          EXPECT_NEAR(logits[step][id], pair[1].get<double>(), 2 * kF16KvLogitTolerance)
              << "step " << step << " token " << id;
        }
      }
    }
  }
}

TEST(Kv16GoldenTest, StoriesBf16KvTeacherForcedOnF32KvIds) {
  LoadedModel m = LoadSharedModel("stories260K.gguf", 1);
  ASSERT_NE(m.model, nullptr);
  const nlohmann::json goldens = testing::LoadStoriesGoldens();
  size_t checked = 0;
  for (const nlohmann::json& c : goldens["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<double> margins;
    for (const nlohmann::json& step : c["steps"]) {
      margins.push_back(step["top5_f32kv"][0][1].get<double>() -
                        step["top5_f32kv"][1][1].get<double>());
    }
    checked += ExpectTeacherForced(
        *m.model, kv::KvDtype::kBF16, c["prompt_token_ids_with_bos"].get<std::vector<int32_t>>(),
        c["generated_token_ids_f32kv"].get<std::vector<int32_t>>(), margins);
  }
  EXPECT_GT(checked, 100u);  // most of the 6 x 32 steps
}

// Parameter: (model, goldens) of a BPE model, the KV dtype and the golden
// margin above which the argmax must match (see the top comment).
struct BpeCase {
  const char* model;
  const char* goldens;
  kv::KvDtype dtype;
  double min_margin;
};

constexpr double kBf16RandomModelMargin = 0.5;

class Kv16BpeGoldenTest : public ::testing::TestWithParam<BpeCase> {};

TEST_P(Kv16BpeGoldenTest, TeacherForcedOnF32KvIds) {
  const BpeCase& p = GetParam();
  LoadedModel m = LoadSharedModel(p.model, 1);
  ASSERT_NE(m.model, nullptr);
  const nlohmann::json goldens = LoadGoldens(p.goldens);
  size_t checked = 0;
  for (const nlohmann::json& c : goldens["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<double> margins;
    for (const nlohmann::json& step : c["steps"]) {
      margins.push_back(step["top1_top2_logit_margin"].get<double>());
    }
    checked += ExpectTeacherForced(*m.model, p.dtype,
                                   c["prompt_token_ids"].get<std::vector<int32_t>>(),
                                   c["generated_token_ids"].get<std::vector<int32_t>>(), margins,
                                   p.min_margin);
  }
  EXPECT_GT(checked, 60u);
}

INSTANTIATE_TEST_SUITE_P(
    Models, Kv16BpeGoldenTest,
    ::testing::Values(
        BpeCase{"qwen2-tiny-synth.gguf", "qwen2-tiny-synth_greedy.json", kv::KvDtype::kF16,
                kTeacherForcedMargin},
        BpeCase{"qwen2-tiny-synth.gguf", "qwen2-tiny-synth_greedy.json", kv::KvDtype::kBF16,
                kBf16RandomModelMargin},
        BpeCase{"llama3-tiny-synth.gguf", "llama3-tiny-synth_greedy.json", kv::KvDtype::kF16,
                kTeacherForcedMargin},
        BpeCase{"llama3-tiny-synth.gguf", "llama3-tiny-synth_greedy.json", kv::KvDtype::kBF16,
                kBf16RandomModelMargin}),
    [](const ::testing::TestParamInfo<BpeCase>& info) {
      std::string name = info.param.model;
      name = name.substr(0, name.find('-')) + "_" + kv::KvDtypeName(info.param.dtype);
      return name;
    });

// Batch invariance holds for each 16-bit dtype as for F32: every golden
// prompt of stories260K and qwen2-tiny-synth, alone vs batched beside
// prefill chunks of 1 and 7, on 1 and 2 threads, gives the same logits bit
// for bit (memcmp).
TEST(Kv16GoldenTest, BatchInvariantWithEach16BitDtype) {
  std::vector<std::vector<int32_t>> stories, qwen2;
  const nlohmann::json stories_goldens = testing::LoadStoriesGoldens();
  const nlohmann::json qwen2_goldens = LoadGoldens("qwen2-tiny-synth_greedy.json");
  for (const nlohmann::json& c : stories_goldens["cases"]) {
    // ExpectBatchInvariant's single-sequence pool holds 256 tokens.
    if (c["prompt_token_ids_with_bos"].size() > 200) continue;
    stories.push_back(c["prompt_token_ids_with_bos"].get<std::vector<int32_t>>());
  }
  for (const nlohmann::json& c : qwen2_goldens["cases"]) {
    qwen2.push_back(c["prompt_token_ids"].get<std::vector<int32_t>>());
  }
  for (kv::KvDtype dtype : {kv::KvDtype::kF16, kv::KvDtype::kBF16}) {
    SCOPED_TRACE(kv::KvDtypeName(dtype));
    testing::ExpectBatchInvariant("stories260K.gguf", stories, dtype);
    testing::ExpectBatchInvariant("qwen2-tiny-synth.gguf", qwen2, dtype);
  }
}

}  // namespace
}  // namespace tandem::model
