// The kq-tiny models in llama.cpp's 4-6-bit types (Q4_K_M, Q5_K_M, Q4_0 and
// the legacy Q4_1/Q5_0/Q5_1 mix) against ../shared/goldens/kq-tiny_greedy.json:
// llama.cpp's greedy ids and top-5 logits on the same weights dequantized
// exactly to F32 (F32 KV), i.e. what an engine that dequantizes exactly
// and computes in F32 must produce. Ids up to each case's
// strict_prefix_len exactly, top-5 logits within 1e-3 (the goldens' rule),
// on 1 and 2 threads; and batch invariance on the quantized weights.
#include <string>
#include <tuple>
#include <vector>

#include "engine/model/llama_model.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem::model {
namespace {

constexpr double kLogitTolerance = 1e-3;

const nlohmann::json& Goldens() {
  static const nlohmann::json goldens = testing::LoadGoldens("kq-tiny_greedy.json");
  return goldens;
}

std::string FileOf(const std::string& quant) {
  return Goldens()["model"]["files"][quant]["file"].get<std::string>();
}

class QuantGoldenTest : public ::testing::TestWithParam<std::tuple<std::string, int32_t>> {};

TEST_P(QuantGoldenTest, GreedyIdsAndTopLogitsMatchExactDequantization) {
  const auto& [quant, threads] = GetParam();
  testing::LoadedModel loaded = testing::LoadSharedModel(FileOf(quant), threads);
  ASSERT_NE(loaded.model, nullptr);
  const nlohmann::json& cases = Goldens()["cases"][quant];
  ASSERT_EQ(cases.size(), 3u);
  for (const nlohmann::json& c : cases) {
    testing::ExpectGreedyGoldenCase(*loaded.model, c, [](size_t) { return kLogitTolerance; });
  }
}

INSTANTIATE_TEST_SUITE_P(KqTiny, QuantGoldenTest,
                         ::testing::Combine(::testing::Values("q4_k_m", "q5_k_m", "q4_0",
                                                              "legacy"),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_Threads" +
                                  std::to_string(std::get<1>(info.param));
                         });

class QuantBatchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantBatchTest, LogitsIdenticalAloneBatchedChunkedAndThreaded) {
  std::vector<std::vector<int32_t>> prompts;
  for (const nlohmann::json& c : Goldens()["cases"][GetParam()]) {
    prompts.push_back(c["prompt_token_ids"].get<std::vector<int32_t>>());
  }
  testing::ExpectBatchInvariant(FileOf(GetParam()), prompts);
}

INSTANTIATE_TEST_SUITE_P(KqTiny, QuantBatchTest, ::testing::Values("q4_k_m", "legacy"));

}  // namespace
}  // namespace tandem::model
