#include "engine/sampling/sampler.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::sampling {
namespace {

SamplingOptions Random(float temperature, uint64_t seed) {
  SamplingOptions o;
  o.temperature = temperature;
  o.seed = seed;
  return o;
}

TEST(SamplerValidateTest, AcceptsDefaultsAndLimits) {
  EXPECT_TRUE(Validate(SamplingOptions{}).ok());
  SamplingOptions o;
  o.temperature = 2.5f;
  o.top_p = 1.0f;
  o.top_k = -3;
  EXPECT_TRUE(Validate(o).ok());
  o.top_p = 1e-6f;
  EXPECT_TRUE(Validate(o).ok());
  o.top_logprobs = 20;
  EXPECT_TRUE(Validate(o).ok());
}

TEST(SamplerValidateTest, RejectsBadTemperature) {
  SamplingOptions o;
  o.temperature = std::numeric_limits<float>::quiet_NaN();
  absl::Status s = Validate(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "temperature: must be >= 0 and finite, got nan");
  o.temperature = -0.5f;
  EXPECT_EQ(Validate(o).message(), "temperature: must be >= 0 and finite, got -0.5");
  o.temperature = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Validate(o).message(), "temperature: must be >= 0 and finite, got inf");
}

TEST(SamplerValidateTest, RejectsBadTopP) {
  SamplingOptions o;
  o.top_p = 1.5f;
  absl::Status s = Validate(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "top_p: must be in (0, 1], got 1.5");
  o.top_p = 0.0f;
  EXPECT_EQ(Validate(o).message(), "top_p: must be in (0, 1], got 0");
  o.top_p = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Validate(o).message(), "top_p: must be in (0, 1], got nan");
}

TEST(SamplerValidateTest, RejectsBadTopLogprobs) {
  SamplingOptions o;
  o.top_logprobs = 21;
  absl::Status s = Validate(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "top_logprobs: must be in [0, 20], got 21");
  o.top_logprobs = -1;
  EXPECT_EQ(Validate(o).message(), "top_logprobs: must be in [0, 20], got -1");
}

TEST(SamplerTest, GreedyTieGoesToLowestId) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f};
  SampledToken t = Sample(logits, SamplingOptions{}, 0);
  EXPECT_EQ(t.token_id, 1);
  // log softmax by hand: 3 - log(e^0.5 + 2e^3 + e^-1 + e^2).
  const double expected =
      3.0 - std::log(std::exp(0.5) + 2 * std::exp(3.0) + std::exp(-1.0) + std::exp(2.0));
  EXPECT_NEAR(t.logprob, expected, 1e-6);
}

TEST(SamplerTest, LogprobUsesRawLogitsNotTemperature) {
  const std::vector<float> logits = {1.0f, 2.0f};
  SamplingOptions o = Random(0.1f, 7);
  o.top_k = 1;  // forces id 1
  SampledToken t = Sample(logits, o, 3);
  EXPECT_EQ(t.token_id, 1);
  EXPECT_NEAR(t.logprob, 2.0 - std::log(std::exp(1.0) + std::exp(2.0)), 1e-6);
}

// Reference outputs of SplitMix64 (Vigna's splitmix64.c; Rosetta Code
// "Pseudo-random numbers/Splitmix64": seed 1234567 -> 6457827717110365317,
// 3203168211198807973, 9817491932198370423; seed 0 -> 0xe220a8397b1dcdaf).
TEST(SamplerTest, UniformDrawIsSplitMix64) {
  const auto to_unit = [](uint64_t z) { return static_cast<double>(z >> 11) * 0x1.0p-53; };
  EXPECT_EQ(UniformDraw(1234567, 0), to_unit(6457827717110365317ull));
  EXPECT_EQ(UniformDraw(1234567, 1), to_unit(3203168211198807973ull));
  EXPECT_EQ(UniformDraw(1234567, 2), to_unit(9817491932198370423ull));
  EXPECT_EQ(UniformDraw(0, 0), to_unit(0xe220a8397b1dcdafull));
  EXPECT_EQ(UniformDraw(0, 1), to_unit(0x6e789e6aa1b965f4ull));
}

std::vector<float> UniformLogits(int n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); }

TEST(SamplerTest, SeededDrawsRepeatExactly) {
  const std::vector<float> logits = UniformLogits(1000);
  for (uint32_t index = 0; index < 50; ++index) {
    SampledToken a = Sample(logits, Random(1.0f, 42), index);
    SampledToken b = Sample(logits, Random(1.0f, 42), index);
    EXPECT_EQ(a.token_id, b.token_id);
    EXPECT_EQ(a.logprob, b.logprob);
  }
}

TEST(SamplerTest, DifferentIndicesAndSeedsGiveIndependentDraws) {
  // Over a uniform 1000-token vocab, a correlated generator would repeat
  // tokens across indices or seeds; independent draws collide rarely.
  const std::vector<float> logits = UniformLogits(1000);
  int same_across_index = 0, same_across_seed = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const int32_t t0 = Sample(logits, Random(1.0f, seed), 0).token_id;
    const int32_t t1 = Sample(logits, Random(1.0f, seed), 1).token_id;
    const int32_t u0 = Sample(logits, Random(1.0f, seed + 1), 0).token_id;
    same_across_index += (t0 == t1);
    same_across_seed += (t0 == u0);
  }
  EXPECT_LE(same_across_index, 3);
  EXPECT_LE(same_across_seed, 3);
}

TEST(SamplerTest, TopKOneEqualsGreedy) {
  const std::vector<float> logits = {0.1f, 2.0f, 2.0f, 1.9f, -4.0f};
  for (uint64_t seed = 0; seed < 100; ++seed) {
    SamplingOptions o = Random(1.5f, seed);
    o.top_k = 1;
    EXPECT_EQ(Sample(logits, o, static_cast<uint32_t>(seed)).token_id, 1);
  }
}

TEST(SamplerTest, TinyTopPEqualsGreedy) {
  const std::vector<float> logits = {0.1f, 1.0f, 2.0f, 1.9f, -4.0f};
  for (uint64_t seed = 0; seed < 100; ++seed) {
    SamplingOptions o = Random(1.0f, seed);
    o.top_p = 1e-6f;
    EXPECT_EQ(Sample(logits, o, static_cast<uint32_t>(seed)).token_id, 2);
  }
}

TEST(SamplerTest, TopKRestrictsToMostProbable) {
  const std::vector<float> logits = {0.0f, 1.0f, 3.0f, 2.0f, 0.5f};
  for (uint64_t seed = 0; seed < 300; ++seed) {
    SamplingOptions o = Random(5.0f, seed);
    o.top_k = 2;
    const int32_t id = Sample(logits, o, 0).token_id;
    EXPECT_TRUE(id == 2 || id == 3) << id;
  }
}

TEST(SamplerTest, TopPKeepsSmallestNucleus) {
  // p = 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps exactly {0, 1} (0.5 < 0.75
  // <= 0.8).
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  int count1 = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    SamplingOptions o = Random(1.0f, seed);
    o.top_p = 0.75f;
    const int32_t id = Sample(logits, o, 0).token_id;
    ASSERT_TRUE(id == 0 || id == 1) << id;
    count1 += (id == 1);
  }
  // Renormalized: P(1) = 0.3 / 0.8 = 0.375.
  EXPECT_NEAR(count1 / 2000.0, 0.375, 0.04);
}

TEST(SamplerTest, FrequenciesFollowSoftmax) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  int counts[3] = {0, 0, 0};
  const int n = 10000;
  for (int i = 0; i < n; ++i) {
    ++counts[Sample(logits, Random(1.0f, static_cast<uint64_t>(i) * 7919u), 5).token_id];
  }
  EXPECT_NEAR(counts[0] / static_cast<double>(n), 0.5, 0.02);
  EXPECT_NEAR(counts[1] / static_cast<double>(n), 0.3, 0.02);
  EXPECT_NEAR(counts[2] / static_cast<double>(n), 0.2, 0.02);
}

TEST(SamplerTest, TemperatureSharpensDistribution) {
  // T = 0.5 squares the probabilities: 0.25, 0.09, 0.04 -> 0.658, 0.237, 0.105.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  int count0 = 0;
  const int n = 10000;
  for (int i = 0; i < n; ++i) {
    count0 += Sample(logits, Random(0.5f, static_cast<uint64_t>(i)), 0).token_id == 0;
  }
  EXPECT_NEAR(count0 / static_cast<double>(n), 0.25 / 0.38, 0.02);
}

}  // namespace
}  // namespace tandem::sampling
