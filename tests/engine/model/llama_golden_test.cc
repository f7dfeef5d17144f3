// stories260K against llama.cpp's greedy goldens (F32 KV cache variant):
// ../shared/goldens/stories260K_greedy.json, with 1 and 2 threads.
#include <algorithm>
#include <cmath>
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

using testing::GreedyDecode;
using testing::LoadedModel;
using testing::LoadSharedModel;

constexpr double kLogitTolerance = 1e-3;

// Checks one golden case's F32-KV ids and first-token top-5 logits, decoding
// through `table` of blocks in `kv`.
void CheckCase(const LlamaModel& model, kv::CpuKvStorage& kv,
               const std::vector<int32_t>& table, const nlohmann::json& c) {
  SCOPED_TRACE(c["name"].get<std::string>());
  const auto prompt = c["prompt_token_ids_with_bos"].get<std::vector<int32_t>>();
  const auto expected = c["generated_token_ids_f32kv"].get<std::vector<int32_t>>();
  const size_t strict = c["strict_prefix_len_f32kv"].get<size_t>();
  ASSERT_LE(strict, expected.size());

  std::vector<std::vector<float>> logits;
  const std::vector<int32_t> got =
      GreedyDecode(model, kv, table, prompt, static_cast<int>(expected.size()), &logits);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + strict),
            std::vector<int32_t>(expected.begin(), expected.begin() + strict));
  for (const nlohmann::json& top : c["first_token_top5_f32kv"]) {
    const int32_t id = top["id"].get<int32_t>();
    ASSERT_LT(static_cast<size_t>(id), logits[0].size());
    EXPECT_NEAR(logits[0][static_cast<size_t>(id)], top["logit"].get<double>(),
                kLogitTolerance)
        << "token " << id;
  }
  // Every step whose inputs match llama.cpp's (the strict prefix) has the
  // same top-5 logits too.
  for (size_t step = 0; step < strict && step < c["steps"].size(); ++step) {
    for (const nlohmann::json& pair : c["steps"][step]["top5_f32kv"]) {
      const size_t id = pair[0].get<size_t>();
      ASSERT_LT(id, logits[step].size());
      EXPECT_NEAR(logits[step][id], pair[1].get<double>(), kLogitTolerance)
          << "step " << step << " token " << id;
    }
  }
}

// Parameter: the model's thread count (the goldens hold for any).
class StoriesGoldenTest : public ::testing::TestWithParam<int32_t> {
 protected:
  void SetUp() override {
    loaded_ = LoadSharedModel("stories260K.gguf", GetParam());
    ASSERT_NE(loaded_.model, nullptr);
    goldens_ = testing::LoadStoriesGoldens();
    ASSERT_TRUE(goldens_.contains("cases"));
  }
  const LlamaModel& model() const { return *loaded_.model; }

  LoadedModel loaded_;
  nlohmann::json goldens_;
};

TEST_P(StoriesGoldenTest, GreedyIdsAndFirstLogitsMatchLlamaCpp) {
  ASSERT_EQ(goldens_["cases"].size(), 6u);
  for (const nlohmann::json& c : goldens_["cases"]) {
    const size_t tokens = c["prompt_token_ids_with_bos"].size() +
                          c["generated_token_ids_f32kv"].size();
    kv::CpuKvStorage kv(model().kv_shape(16), 32);
    kv::BlockPool blocks(32);
    auto table = blocks.Allocate(kv::BlocksForTokens(static_cast<int32_t>(tokens), 16));
    ASSERT_TRUE(table.has_value());
    CheckCase(model(), kv, *table, c);
  }
}

// The 313-token case greedily produces BOS (id 1) first; it is an ordinary
// token and generation continues after it.
TEST_P(StoriesGoldenTest, LongPromptGeneratesBosFirstAndContinues) {
  for (const nlohmann::json& c : goldens_["cases"]) {
    if (c["name"] != "long_repeated_313tok") continue;
    ASSERT_EQ(c["prompt_token_ids_with_bos"].size(), 313u);
    ASSERT_EQ(c["generated_token_ids_f32kv"][0], 1);
    kv::CpuKvStorage kv(model().kv_shape(16), 22);
    kv::BlockPool blocks(22);
    auto table = blocks.Allocate(22);
    ASSERT_TRUE(table.has_value());
    CheckCase(model(), kv, *table, c);
    return;
  }
  FAIL() << "case long_repeated_313tok not in goldens";
}

// A fragmented pool hands out a non-monotonic block table; the paged
// attention must still read every token from the right block.
TEST_P(StoriesGoldenTest, FragmentedBlockTableGivesGoldenIds) {
  const int32_t kBlockSize = 4;
  const int32_t kBlocks = 128;
  kv::CpuKvStorage kv(model().kv_shape(kBlockSize), kBlocks);
  kv::BlockPool blocks(kBlocks);
  auto all = blocks.Allocate(kBlocks);
  ASSERT_TRUE(all.has_value());
  // Free all blocks in a scrambled order (stride 37), so FIFO allocation
  // hands out tables like [7, 44, 81, 118, 27, ...].
  std::vector<int32_t> order;
  for (int32_t i = 0; i < kBlocks; ++i) order.push_back((i * 37 + 7) % kBlocks);
  blocks.Free(order);

  for (const nlohmann::json& c : goldens_["cases"]) {
    const int32_t tokens = static_cast<int32_t>(c["prompt_token_ids_with_bos"].size() +
                                                c["generated_token_ids_f32kv"].size());
    auto table = blocks.Allocate(kv::BlocksForTokens(tokens, kBlockSize));
    ASSERT_TRUE(table.has_value());
    ASSERT_FALSE(std::is_sorted(table->begin(), table->end()));
    CheckCase(model(), kv, *table, c);
    blocks.Free(*table);
  }
}

INSTANTIATE_TEST_SUITE_P(Stories, StoriesGoldenTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int32_t>& info) {
                           return "Threads" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace tandem::model
