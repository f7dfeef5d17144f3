#include "engine/sampling/logits_processor.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/sampling/sampler.h"
#include "gtest/gtest.h"

namespace tandem::sampling {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(LogitsProcessorTest, GreedyLeavesRowUnchanged) {
  std::vector<float> l = {1.5f, -kInf, 0.1f, 3e38f};
  const std::vector<float> before = l;
  ApplyLogitsProcessors(SamplingOptions{}, TokenHistory{}, l);
  EXPECT_EQ(std::memcmp(l.data(), before.data(), l.size() * sizeof(float)), 0);
}

TEST(LogitsProcessorTest, TemperatureDividesInFloat) {
  SamplingOptions o;
  o.temperature = 0.5f;
  std::vector<float> l = {1.0f, -3.0f, -kInf, 0.0f};
  ApplyLogitsProcessors(o, TokenHistory{}, l);
  EXPECT_EQ(l, (std::vector<float>{2.0f, -6.0f, -kInf, 0.0f}));

  // One float division, not a multiplication by a rounded 1 / T:
  // 1.125f / 0.3f = 3.7499998f, while 1.125f * (1 / 0.3f) = 3.75f.
  o.temperature = 0.3f;
  l = {1.125f};
  ApplyLogitsProcessors(o, TokenHistory{}, l);
  EXPECT_EQ(l[0], 3.749999761581421f);
}

TEST(LogitsProcessorTest, TemperatureOneIsIdentity) {
  SamplingOptions o;
  o.temperature = 1.0f;
  std::vector<float> l = {0.125f, -7.75f, 1e-30f, -kInf};
  const std::vector<float> before = l;
  ApplyLogitsProcessors(o, TokenHistory{}, l);
  EXPECT_EQ(std::memcmp(l.data(), before.data(), l.size() * sizeof(float)), 0);
}

// The processors of `o` over `row` with this history.
std::vector<float> Processed(const SamplingOptions& o, std::vector<float> row,
                             std::vector<int32_t> prompt, std::vector<int32_t> generated) {
  ApplyLogitsProcessors(o, TokenHistory{prompt, generated}, row);
  return row;
}

TEST(LogitsProcessorTest, RepetitionPenaltyDividesPositiveAndMultipliesOthers) {
  SamplingOptions o;
  o.repetition_penalty = 2.0f;
  // Ids 0 and 1 seen: 2 / 2 = 1, -1 * 2 = -2; id 2 untouched.
  EXPECT_EQ(Processed(o, {2.0f, -1.0f, 0.5f}, {0, 1}, {}),
            (std::vector<float>{1.0f, -2.0f, 0.5f}));
  // Each distinct id once, whether seen in the prompt, the output or both,
  // and however often; 0 is multiplied (stays 0).
  EXPECT_EQ(Processed(o, {2.0f, -1.0f, 0.5f, 0.0f}, {0, 0, 1}, {1, 0, 3, 3}),
            (std::vector<float>{1.0f, -2.0f, 0.5f, 0.0f}));
  // A penalty below 1 rewards: 3 / 0.5 = 6, -3 * 0.5 = -1.5.
  o.repetition_penalty = 0.5f;
  EXPECT_EQ(Processed(o, {3.0f, -3.0f}, {}, {0, 1}), (std::vector<float>{6.0f, -1.5f}));
  // -inf stays -inf.
  o.repetition_penalty = 1.25f;
  EXPECT_EQ(Processed(o, {-kInf, 5.0f}, {0, 1}, {}), (std::vector<float>{-kInf, 4.0f}));
}

TEST(LogitsProcessorTest, FrequencyAndPresencePenaltiesCountGeneratedTokens) {
  SamplingOptions o;
  o.frequency_penalty = 0.5f;
  o.presence_penalty = 0.25f;
  // Generated: id 2 three times (1 - 0.5 * 3 - 0.25 = -0.75), id 0 once
  // (1 - 0.5 - 0.25 = 0.25); id 1 only in the prompt and id 3 never: 1.
  EXPECT_EQ(Processed(o, {1.0f, 1.0f, 1.0f, 1.0f}, {1, 1}, {2, 0, 2, 2}),
            (std::vector<float>{0.25f, 1.0f, -0.75f, 1.0f}));
  // Negative penalties reward: 1 + 2 * 2 + 2 = 7 after two generations.
  o.frequency_penalty = -2.0f;
  o.presence_penalty = -2.0f;
  EXPECT_EQ(Processed(o, {1.0f, 0.0f}, {}, {0, 0}), (std::vector<float>{7.0f, 0.0f}));
  // frequency * float(c) is rounded to float before the subtraction:
  // 0.1f * 3 = 0.300000011920928955078125f, and 1 - it = 0.7f.
  o.frequency_penalty = 0.1f;
  o.presence_penalty = 0.0f;
  EXPECT_EQ(Processed(o, {1.0f}, {}, {0, 0, 0}), (std::vector<float>{0.699999988079071044921875f}));
}

TEST(LogitsProcessorTest, LogitBiasAddsToListedIds) {
  SamplingOptions o;
  o.logit_bias = {{0, 0.5f}, {2, -100.0f}};
  EXPECT_EQ(Processed(o, {1.0f, 2.0f, 3.0f}, {}, {}), (std::vector<float>{1.5f, 2.0f, -97.0f}));
}

TEST(LogitsProcessorTest, MinTokensMasksUntilExactlyMinTokensGenerated) {
  SamplingOptions o;
  o.temperature = 1.0f;
  o.min_tokens = 2;
  o.min_tokens_masked_ids = {1, 3};
  const std::vector<float> row = {0.5f, 4.0f, -1.0f, 2.0f};
  const std::vector<float> masked = {0.5f, -kInf, -1.0f, -kInf};
  EXPECT_EQ(Processed(o, row, {0}, {}), masked);
  EXPECT_FALSE(LogitsProcessorsAreIdentity(o, TokenHistory{{}, {}}));
  const std::vector<int32_t> one = {0};
  EXPECT_EQ(Processed(o, row, {0}, one), masked);
  EXPECT_FALSE(LogitsProcessorsAreIdentity(o, TokenHistory{{}, one}));
  const std::vector<int32_t> two = {0, 2};
  EXPECT_EQ(Processed(o, row, {0}, two), row);
  EXPECT_TRUE(LogitsProcessorsAreIdentity(o, TokenHistory{{}, two}));
  EXPECT_EQ(Processed(o, row, {0}, {0, 2, 2}), row);
}

TEST(LogitsProcessorTest, ProcessorsRunInVllmOrder) {
  SamplingOptions o;
  // Bias before the repetition penalty: -1 + 2 = 1, then 1 / 2 = 0.5
  // (the other way round: -1 * 2 + 2 = 0).
  o.logit_bias = {{0, 2.0f}};
  o.repetition_penalty = 2.0f;
  EXPECT_EQ(Processed(o, {-1.0f, 3.0f}, {0}, {}), (std::vector<float>{0.5f, 3.0f}));
  // The min_tokens mask before the bias: -inf + 5 stays -inf.
  o = SamplingOptions{};
  o.min_tokens = 1;
  o.min_tokens_masked_ids = {1};
  o.logit_bias = {{1, 5.0f}};
  EXPECT_EQ(Processed(o, {0.0f, 1.0f}, {}, {}), (std::vector<float>{0.0f, -kInf}));
  // Repetition before frequency: 1 / 2 - 1 = -0.5 (the other way round:
  // (1 - 1) * 2 = 0).
  o = SamplingOptions{};
  o.repetition_penalty = 2.0f;
  o.frequency_penalty = 1.0f;
  EXPECT_EQ(Processed(o, {1.0f}, {}, {0}), (std::vector<float>{-0.5f}));
  // Penalties before temperature: (1 - 0.5) / 0.25 = 2 (the other way
  // round: 1 / 0.25 - 0.5 = 3.5).
  o = SamplingOptions{};
  o.frequency_penalty = 0.5f;
  o.temperature = 0.25f;
  EXPECT_EQ(Processed(o, {1.0f, 1.0f}, {}, {0}), (std::vector<float>{2.0f, 4.0f}));
}

TEST(LogitsProcessorTest, IdentityOnlyWhenNothingApplies) {
  const std::vector<int32_t> prompt = {1, 2};
  const std::vector<int32_t> generated = {2};
  const TokenHistory history{prompt, generated};
  const TokenHistory empty;
  SamplingOptions o;
  EXPECT_TRUE(LogitsProcessorsAreIdentity(o, history));
  o.temperature = 0.7f;
  EXPECT_FALSE(LogitsProcessorsAreIdentity(o, empty));
  o.temperature = 1.0f;
  EXPECT_TRUE(LogitsProcessorsAreIdentity(o, history));

  SamplingOptions r = o;
  r.repetition_penalty = 1.1f;
  EXPECT_FALSE(LogitsProcessorsAreIdentity(r, history));
  EXPECT_FALSE(LogitsProcessorsAreIdentity(r, TokenHistory{prompt, {}}));
  EXPECT_TRUE(LogitsProcessorsAreIdentity(r, empty));

  SamplingOptions f = o;
  f.presence_penalty = 0.5f;
  EXPECT_FALSE(LogitsProcessorsAreIdentity(f, history));
  EXPECT_TRUE(LogitsProcessorsAreIdentity(f, TokenHistory{prompt, {}}));  // prompt only
  f.presence_penalty = 0.0f;
  f.frequency_penalty = -0.5f;
  EXPECT_FALSE(LogitsProcessorsAreIdentity(f, history));

  SamplingOptions b = o;
  b.logit_bias = {{0, 1.0f}};
  EXPECT_FALSE(LogitsProcessorsAreIdentity(b, empty));

  SamplingOptions m = o;
  m.min_tokens = 3;
  EXPECT_TRUE(LogitsProcessorsAreIdentity(m, empty));  // nothing to mask
  m.min_tokens_masked_ids = {0};
  EXPECT_FALSE(LogitsProcessorsAreIdentity(m, empty));
}

// Greedy takes the argmax of the processed row; the logprob stays raw.
TEST(LogitsProcessorTest, GreedyAppliesPenaltiesButReportsRawLogprob) {
  const std::vector<float> logits = {3.0f, 2.5f, 0.0f};
  SamplingOptions o;
  o.repetition_penalty = 2.0f;  // id 0: 3 / 2 = 1.5 < 2.5
  const std::vector<int32_t> prompt = {0};
  const SampledToken t = Sample(logits, o, TokenHistory{prompt, {}});
  EXPECT_EQ(t.token_id, 1);
  EXPECT_NEAR(t.logprob, 2.5 - std::log(std::exp(3.0) + std::exp(2.5) + 1.0), 1e-6);
  // Without the history nothing is penalised.
  EXPECT_EQ(Sample(logits, o, 0).token_id, 0);
  // A bias of -100 bans the argmax.
  o.repetition_penalty = 1.0f;
  o.logit_bias = {{0, -100.0f}};
  EXPECT_EQ(Sample(logits, o, 0).token_id, 1);
}

}  // namespace
}  // namespace tandem::sampling
