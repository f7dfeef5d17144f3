#include "engine/sampling/sampler.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::sampling {
namespace {

constexpr int32_t kVocab = 100;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

SamplingOptions Random(float temperature, uint64_t seed) {
  SamplingOptions o;
  o.temperature = temperature;
  o.seed = seed;
  return o;
}

TEST(SamplerValidateTest, AcceptsDefaultsAndLimits) {
  EXPECT_TRUE(Validate(SamplingOptions{}, kVocab).ok());
  SamplingOptions o;
  o.temperature = 2.5f;
  o.top_p = 1.0f;
  o.top_k = -3;
  EXPECT_TRUE(Validate(o, kVocab).ok());
  o.top_p = 1e-6f;
  EXPECT_TRUE(Validate(o, kVocab).ok());
  o.top_logprobs = 20;
  EXPECT_TRUE(Validate(o, kVocab).ok());
}

TEST(SamplerValidateTest, RejectsBadTemperature) {
  SamplingOptions o;
  o.temperature = std::numeric_limits<float>::quiet_NaN();
  absl::Status s = Validate(o, kVocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "temperature: must be 0 (greedy) or in [1e-05, inf), got nan");
  o.temperature = -0.5f;
  EXPECT_EQ(Validate(o, kVocab).message(),
            "temperature: must be 0 (greedy) or in [1e-05, inf), got -0.5");
  o.temperature = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Validate(o, kVocab).message(),
            "temperature: must be 0 (greedy) or in [1e-05, inf), got inf");
  // Below vLLM's epsilon a positive logit / T overflows to +inf.
  o.temperature = 1e-38f;
  EXPECT_EQ(Validate(o, kVocab).message(),
            "temperature: must be 0 (greedy) or in [1e-05, inf), got 1e-38");
  o.temperature = 1e-5f;
  EXPECT_TRUE(Validate(o, kVocab).ok());
}

TEST(SamplerValidateTest, RejectsBadTopP) {
  SamplingOptions o;
  o.top_p = 1.5f;
  absl::Status s = Validate(o, kVocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "top_p: must be in (0, 1], got 1.5");
  o.top_p = 0.0f;
  EXPECT_EQ(Validate(o, kVocab).message(), "top_p: must be in (0, 1], got 0");
  o.top_p = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Validate(o, kVocab).message(), "top_p: must be in (0, 1], got nan");
}

TEST(SamplerValidateTest, RejectsBadTopLogprobs) {
  SamplingOptions o;
  o.top_logprobs = 21;
  absl::Status s = Validate(o, kVocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "logprobs: must be in [0, 20], got 21");
  o.top_logprobs = -1;
  EXPECT_EQ(Validate(o, kVocab).message(), "logprobs: must be in [0, 20], got -1");
}

TEST(SamplerValidateTest, AcceptsNewControlsAtTheirLimits) {
  SamplingOptions o;
  o.min_p = 1.0f;
  o.repetition_penalty = 0.01f;
  o.presence_penalty = -2.0f;
  o.frequency_penalty = 2.0f;
  o.logit_bias = {{0, -100.0f}, {5, 3.5f}, {kVocab - 1, 0.0f}};
  EXPECT_TRUE(Validate(o, kVocab).ok());
  o.min_p = 0.0f;
  o.repetition_penalty = 40.0f;
  o.presence_penalty = 2.0f;
  o.frequency_penalty = -2.0f;
  EXPECT_TRUE(Validate(o, kVocab).ok());
  // min_tokens and its ids are the engine core's to check.
  o.min_tokens = -5;
  o.min_tokens_masked_ids = {-1, kVocab + 7};
  EXPECT_TRUE(Validate(o, kVocab).ok());
}

TEST(SamplerValidateTest, RejectsBadMinP) {
  SamplingOptions o;
  o.min_p = 1.5f;
  absl::Status s = Validate(o, kVocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "min_p: must be in [0, 1], got 1.5");
  o.min_p = -0.25f;
  EXPECT_EQ(Validate(o, kVocab).message(), "min_p: must be in [0, 1], got -0.25");
  o.min_p = kNaN;
  EXPECT_EQ(Validate(o, kVocab).message(), "min_p: must be in [0, 1], got nan");
}

TEST(SamplerValidateTest, RejectsBadRepetitionPenalty) {
  SamplingOptions o;
  o.repetition_penalty = 0.0f;
  absl::Status s = Validate(o, kVocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "repetition_penalty: must be in [0.01, 100], got 0");
  o.repetition_penalty = -1.5f;
  EXPECT_EQ(Validate(o, kVocab).message(), "repetition_penalty: must be in [0.01, 100], got -1.5");
  o.repetition_penalty = kInf;
  EXPECT_EQ(Validate(o, kVocab).message(), "repetition_penalty: must be in [0.01, 100], got inf");
  o.repetition_penalty = kNaN;
  EXPECT_EQ(Validate(o, kVocab).message(), "repetition_penalty: must be in [0.01, 100], got nan");
  // A positive logit / 1e-30 / 1e-5 overflows to +inf.
  o.repetition_penalty = 1e-30f;
  EXPECT_EQ(Validate(o, kVocab).message(),
            "repetition_penalty: must be in [0.01, 100], got 1e-30");
  o.repetition_penalty = 100.0f;
  EXPECT_TRUE(Validate(o, kVocab).ok());
}

TEST(SamplerValidateTest, RejectsBadPresenceAndFrequencyPenalty) {
  SamplingOptions o;
  o.presence_penalty = 2.5f;
  absl::Status s = Validate(o, kVocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "presence_penalty: must be in [-2, 2], got 2.5");
  o.presence_penalty = kNaN;
  EXPECT_EQ(Validate(o, kVocab).message(), "presence_penalty: must be in [-2, 2], got nan");
  o.presence_penalty = 0.0f;
  o.frequency_penalty = -2.125f;
  s = Validate(o, kVocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "frequency_penalty: must be in [-2, 2], got -2.125");
  o.frequency_penalty = -kInf;
  EXPECT_EQ(Validate(o, kVocab).message(), "frequency_penalty: must be in [-2, 2], got -inf");
}

TEST(SamplerValidateTest, RejectsBadLogitBias) {
  SamplingOptions o;
  o.logit_bias = {{3, 1.0f}, {kVocab, 2.0f}};
  absl::Status s = Validate(o, kVocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "logit_bias[100]: token id 100 is outside the vocabulary [0, 100)");
  o.logit_bias = {{-4, 1.0f}};
  EXPECT_EQ(Validate(o, kVocab).message(),
            "logit_bias[-4]: token id -4 is outside the vocabulary [0, 100)");
  o.logit_bias = {{3, 1.0f}, {7, kInf}};
  s = Validate(o, kVocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "logit_bias[7]: bias must be in [-100, 100], got inf");
  o.logit_bias = {{7, kNaN}};
  EXPECT_EQ(Validate(o, kVocab).message(), "logit_bias[7]: bias must be in [-100, 100], got nan");
  // OpenAI's range: a bias of 3.4e38 would overflow the logit to +inf.
  o.logit_bias = {{7, 3.4e38f}};
  EXPECT_EQ(Validate(o, kVocab).message(),
            "logit_bias[7]: bias must be in [-100, 100], got 3.4e+38");
  o.logit_bias = {{7, -100.0f}, {8, 100.0f}};
  EXPECT_TRUE(Validate(o, kVocab).ok());
  o.logit_bias = {{7, 1.0f}, {7, 2.0f}};
  EXPECT_EQ(Validate(o, kVocab).message(),
            "logit_bias: token ids must be sorted and unique, got 7 after 7");
  o.logit_bias = {{9, 1.0f}, {2, 2.0f}};
  EXPECT_EQ(Validate(o, kVocab).message(),
            "logit_bias: token ids must be sorted and unique, got 2 after 9");
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

// Probabilities 0.4, 0.2, 0.15, 0.1, 0.08, 0.07: over the most likely one's
// 1, 0.5, 0.375, 0.25, 0.2, 0.175. min_p 0.3 keeps exactly {0, 1, 2},
// min_p 0.22 exactly {0, 1, 2, 3}, renormalised.
TEST(SamplerTest, MinPKeepsExactlyTheIdsAboveTheThreshold) {
  const std::vector<float> logits = {std::log(0.4f),  std::log(0.2f),  std::log(0.15f),
                                     std::log(0.1f),  std::log(0.08f), std::log(0.07f)};
  for (const auto& [min_p, kept] : {std::pair{0.3f, 3}, std::pair{0.22f, 4}}) {
    std::vector<int> counts(logits.size(), 0);
    const int n = 6000;
    for (int i = 0; i < n; ++i) {
      SamplingOptions o = Random(1.0f, static_cast<uint64_t>(i));
      o.min_p = min_p;
      ++counts[static_cast<size_t>(Sample(logits, o, 3).token_id)];
    }
    double kept_mass = 0;
    for (int id = 0; id < kept; ++id) kept_mass += std::exp(static_cast<double>(logits[id]));
    for (int id = 0; id < static_cast<int>(logits.size()); ++id) {
      if (id >= kept) {
        EXPECT_EQ(counts[id], 0) << "min_p " << min_p << " id " << id;
        continue;
      }
      EXPECT_NEAR(counts[id] / static_cast<double>(n),
                  std::exp(static_cast<double>(logits[id])) / kept_mass, 0.025)
          << "min_p " << min_p << " id " << id;
    }
  }
}

// p_i == min_p exactly is kept: min_p 1 keeps the ties of the maximum
// (p = exp(0) = 1) and nothing else.
TEST(SamplerTest, MinPOneKeepsTheTiesOfTheMaximum) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.999f, -kInf};
  int counts[5] = {0, 0, 0, 0, 0};
  for (uint64_t seed = 0; seed < 400; ++seed) {
    SamplingOptions o = Random(0.7f, seed);
    o.min_p = 1.0f;
    ++counts[Sample(logits, o, 0).token_id];
  }
  EXPECT_EQ(counts[0] + counts[3] + counts[4], 0);
  EXPECT_GT(counts[1], 150);
  EXPECT_GT(counts[2], 150);
}

// min_p comes before top_k and top_p: top_p 0.5 is then a share of the
// survivors' mass. Probabilities 0.4, 0.3, 0.2, 0.1; min_p 0.6 keeps
// {0, 1} (0.2 is 0.5 of 0.4); top_p 0.5 of their 0.7 = 0.35 is then
// reached by 0.4 alone, so id 0 always. Without min_p, top_p 0.5 of 1
// keeps {0, 1}.
TEST(SamplerTest, MinPComesBeforeTopP) {
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f),
                                     std::log(0.1f)};
  int ones_with = 0, ones_without = 0;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    SamplingOptions o = Random(1.0f, seed);
    o.top_p = 0.5f;
    ones_without += Sample(logits, o, 0).token_id == 1;
    o.min_p = 0.6f;
    ones_with += Sample(logits, o, 0).token_id == 1;
  }
  EXPECT_EQ(ones_with, 0);
  EXPECT_GT(ones_without, 100);
}

TEST(SamplerTest, GreedyIgnoresMinP) {
  SamplingOptions o;
  o.min_p = 1.0f;
  EXPECT_EQ(Sample(std::vector<float>{0.5f, 2.0f, 1.0f}, o, 0).token_id, 1);
}

// SplitMix64's output function, written again from Vigna's splitmix64.c.
uint64_t Mix13(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

TEST(SampleSeedTest, SampleZeroKeepsTheSeedAndOthersAreMixed) {
  for (uint64_t seed : {0ull, 1ull, 42ull, 0xFFFFFFFFFFFFFFFFull, 0x123456789ABCDEFull}) {
    EXPECT_EQ(SampleSeed(seed, 0), seed);
    EXPECT_EQ(SampleSeed(seed, 1), Mix13(seed + 0xD1B54A32D192ED03ull));
    EXPECT_EQ(SampleSeed(seed, 2), Mix13(seed + 2 * 0xD1B54A32D192ED03ull));
    EXPECT_NE(SampleSeed(seed, 1), seed);
    EXPECT_NE(SampleSeed(seed, 2), seed);
    EXPECT_NE(SampleSeed(seed, 1), SampleSeed(seed, 2));
  }
}

// Samples 0, 1, 2 of one request draw unrelated streams: over 2000 output
// indices, equal uniforms (to 53 bits) never occur, and over a uniform
// 1000-token vocabulary the tokens agree about once in 1000.
TEST(SampleSeedTest, SamplesDrawDistinctStreams) {
  const std::vector<float> logits = UniformLogits(1000);
  for (uint64_t seed : {7ull, 1234567ull}) {
    const uint64_t s0 = SampleSeed(seed, 0), s1 = SampleSeed(seed, 1), s2 = SampleSeed(seed, 2);
    int same_uniform = 0, same_token = 0;
    for (uint32_t i = 0; i < 2000; ++i) {
      const double u0 = UniformDraw(s0, i), u1 = UniformDraw(s1, i), u2 = UniformDraw(s2, i);
      same_uniform += (u0 == u1) + (u0 == u2) + (u1 == u2);
      // Shifted streams would agree at a lag: compare with the next index.
      same_uniform += (UniformDraw(s0, i + 1) == u1) + (UniformDraw(s1, i + 1) == u2);
      if (i < 300) {
        const int32_t t0 = Sample(logits, Random(1.0f, s0), i).token_id;
        const int32_t t1 = Sample(logits, Random(1.0f, s1), i).token_id;
        const int32_t t2 = Sample(logits, Random(1.0f, s2), i).token_id;
        same_token += (t0 == t1) + (t0 == t2) + (t1 == t2);
      }
    }
    EXPECT_EQ(same_uniform, 0) << seed;
    EXPECT_LE(same_token, 5) << seed;
  }
}

}  // namespace
}  // namespace tandem::sampling
