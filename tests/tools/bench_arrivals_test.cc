// Tests for tools/bench/arrivals: vLLM's gamma arrival process. The
// statistical checks draw a fixed seed, so they are deterministic; their
// bounds are several standard errors wide (for 20000 gaps the mean of an
// exponential has a relative standard error of 1/sqrt(20000) = 0.7%).
#include "tools/bench/arrivals.h"

#include <cmath>
#include <limits>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::bench {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int32_t kDraws = 20000;

std::vector<double> Gaps(const std::vector<double>& times) {
  std::vector<double> gaps;
  for (size_t i = 1; i < times.size(); ++i) gaps.push_back(times[i] - times[i - 1]);
  return gaps;
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

// Coefficient of variation (std / mean); a gamma of shape k has 1/sqrt(k).
double Cv(const std::vector<double>& v) {
  const double mean = Mean(v);
  double sq = 0;
  for (double x : v) sq += (x - mean) * (x - mean);
  return std::sqrt(sq / static_cast<double>(v.size())) / mean;
}

std::vector<double> Times(int32_t n, double rate, double burstiness, uint64_t seed) {
  absl::StatusOr<std::vector<double>> times = ArrivalTimes(n, rate, burstiness, seed);
  EXPECT_TRUE(times.ok()) << times.status();
  return times.ok() ? *times : std::vector<double>{};
}

TEST(BenchArrivalsTest, InfiniteRateSendsEverythingAtZero) {
  std::vector<double> times = Times(50, kInf, 1, 7);
  EXPECT_EQ(times.size(), 50u);
  EXPECT_THAT(times, Each(0.0));
  EXPECT_TRUE(Times(0, 10, 1, 7).empty());
}

TEST(BenchArrivalsTest, NonDecreasingAndTheLastSendIsAtNOverRate) {
  for (int32_t n : {1, 16, 1000}) {
    std::vector<double> times = Times(n, 20, 0.5, 3);
    ASSERT_EQ(times.size(), static_cast<size_t>(n));
    EXPECT_GT(times[0], 0.0) << n;  // request 0 waits for its own gap
    for (size_t i = 1; i < times.size(); ++i) EXPECT_GE(times[i], times[i - 1]) << i;
    EXPECT_DOUBLE_EQ(times.back(), n / 20.0) << n;  // 16 requests at 20/s: 0.8 s
  }
}

TEST(BenchArrivalsTest, SameSeedSameTimesOtherSeedOtherTimes) {
  EXPECT_EQ(Times(200, 5, 1, 42), Times(200, 5, 1, 42));
  EXPECT_NE(Times(200, 5, 1, 42), Times(200, 5, 1, 43));
}

TEST(BenchArrivalsTest, GapsAreTheSeededGammaDrawsScaledToNOverRate) {
  // The header's promise: the running sums of the draws of
  // gamma_distribution(shape burstiness, scale 1/(rate*burstiness)) on
  // mt19937_64(seed), scaled so the last is n / rate.
  std::mt19937_64 rng(9);
  std::gamma_distribution<double> gamma(2.0, 1.0 / (8.0 * 2.0));
  std::vector<double> sums;
  double sum = 0;
  for (int i = 0; i < 6; ++i) sums.push_back(sum += gamma(rng));
  std::vector<double> times = Times(6, 8, 2, 9);
  ASSERT_EQ(times.size(), 6u);
  for (size_t i = 0; i < times.size(); ++i) {
    EXPECT_DOUBLE_EQ(times[i], sums[i] * (6 / 8.0) / sums.back()) << i;
  }
}

TEST(BenchArrivalsTest, MeanGapIsOneOverRate) {
  for (double burstiness : {1.0, 4.0}) {
    const double rate = 12.5;  // mean gap 80 ms
    std::vector<double> gaps = Gaps(Times(kDraws + 1, rate, burstiness, 1234));
    ASSERT_EQ(gaps.size(), static_cast<size_t>(kDraws));
    EXPECT_NEAR(Mean(gaps), 1 / rate, 0.03 / rate) << "burstiness " << burstiness;
  }
}

TEST(BenchArrivalsTest, BurstinessSetsTheSpreadOfGaps) {
  // CV = 1/sqrt(k): 2 for k = 0.25, 1 for k = 1 (Poisson), 0.5 for k = 4.
  const double bursty = Cv(Gaps(Times(kDraws + 1, 10, 0.25, 5)));
  const double poisson = Cv(Gaps(Times(kDraws + 1, 10, 1, 5)));
  const double regular = Cv(Gaps(Times(kDraws + 1, 10, 4, 5)));
  EXPECT_NEAR(bursty, 2.0, 0.2);
  EXPECT_NEAR(poisson, 1.0, 0.1);
  EXPECT_NEAR(regular, 0.5, 0.05);
  EXPECT_GT(bursty, poisson);
  EXPECT_GT(poisson, regular);
}

TEST(BenchArrivalsTest, BadValuesNameTheFlag) {
  struct Case {
    int32_t n;
    double rate;
    double burstiness;
    std::string flag;
  };
  const double nan = std::nan("");
  const Case cases[] = {
      {10, 0, 1, "--request-rate"},          {10, -2, 1, "--request-rate"},
      {10, nan, 1, "--request-rate"},        {10, -kInf, 1, "--request-rate"},
      {10, 5, 0, "--burstiness"},            {10, 5, -1, "--burstiness"},
      {10, 5, kInf, "--burstiness"},         {10, 5, nan, "--burstiness"},
      {-1, 5, 1, "--num-prompts"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<double>> times = ArrivalTimes(c.n, c.rate, c.burstiness, 1);
    ASSERT_FALSE(times.ok()) << c.flag << " " << c.rate << " " << c.burstiness;
    EXPECT_EQ(times.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(times.status().message()), HasSubstr(c.flag + ": "));
  }
}

TEST(BenchArrivalsTest, ExtremeRatesStayFinite) {
  // rate * burstiness overflows: gaps below any clock, all at 0.
  EXPECT_THAT(Times(5, 1e308, 10, 1), Each(0.0));
  // A run planned past kMaxSendTimeS (1e8 s) is refused, naming the rate.
  absl::StatusOr<std::vector<double>> slow = ArrivalTimes(2, 1e-9, 1, 1);
  ASSERT_FALSE(slow.ok());
  EXPECT_THAT(std::string(slow.status().message()), HasSubstr("--request-rate: "));
  // A denormal rate gives an infinite mean gap or run: refused, not inf times.
  absl::StatusOr<std::vector<double>> times = ArrivalTimes(5, 1e-320, 0.5, 1);
  ASSERT_FALSE(times.ok());
  EXPECT_THAT(std::string(times.status().message()), HasSubstr("--request-rate: "));
}

}  // namespace
}  // namespace tandem::bench
