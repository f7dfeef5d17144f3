#include "engine/sampling/logits_processor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::sampling {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(LogitsProcessorTest, GreedyLeavesRowUnchanged) {
  std::vector<float> l = {1.5f, -kInf, 0.1f, 3e38f};
  const std::vector<float> before = l;
  ApplyLogitsProcessors(SamplingOptions{}, l);
  EXPECT_EQ(std::memcmp(l.data(), before.data(), l.size() * sizeof(float)), 0);
}

TEST(LogitsProcessorTest, TemperatureDividesInFloat) {
  SamplingOptions o;
  o.temperature = 0.5f;
  std::vector<float> l = {1.0f, -3.0f, -kInf, 0.0f};
  ApplyLogitsProcessors(o, l);
  EXPECT_EQ(l, (std::vector<float>{2.0f, -6.0f, -kInf, 0.0f}));

  // One float division, not a multiplication by a rounded 1 / T:
  // 1.125f / 0.3f = 3.7499998f, while 1.125f * (1 / 0.3f) = 3.75f.
  o.temperature = 0.3f;
  l = {1.125f};
  ApplyLogitsProcessors(o, l);
  EXPECT_EQ(l[0], 3.749999761581421f);
}

TEST(LogitsProcessorTest, TemperatureOneIsIdentity) {
  SamplingOptions o;
  o.temperature = 1.0f;
  std::vector<float> l = {0.125f, -7.75f, 1e-30f, -kInf};
  const std::vector<float> before = l;
  ApplyLogitsProcessors(o, l);
  EXPECT_EQ(std::memcmp(l.data(), before.data(), l.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace tandem::sampling
