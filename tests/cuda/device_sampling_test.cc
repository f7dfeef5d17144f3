// The host half of the CUDA backend's sampling seam, on the CPU (no GPU
// needed): fed what LaunchRowStats / LaunchRowTopK return (computed here on
// the host, the log-sum in index order), BuildViewFromTopK builds exactly
// the view BuildSamplingView builds from the whole row, for every row the
// plan sends to the device; and the CUDA-graph buckets.
#include "engine/backend/cuda/device_sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::backend::cuda {
namespace {

float Key(float l) { return std::isnan(l) ? -std::numeric_limits<float>::infinity() : l; }

// What LaunchRowStats returns, with the log-sum in index order (as
// BuildSamplingView sums it), so the views compare bit for bit.
RowStats HostStats(const std::vector<float>& row) {
  RowStats s;
  size_t best = 0;
  for (size_t i = 1; i < row.size(); ++i) {
    if (Key(row[i]) > Key(row[best])) best = i;
  }
  s.argmax = static_cast<int32_t>(best);
  s.max = row[best];
  double sum = 0;
  for (float l : row) sum += std::exp(static_cast<double>(l) - static_cast<double>(s.max));
  s.log_sum = std::log(sum);
  return s;
}

// What LaunchRowTopK returns: the first k ids of the raw candidate order.
void HostTopK(const std::vector<float>& row, int32_t k, std::vector<int32_t>* ids,
              std::vector<float>* values) {
  std::vector<int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const float ka = Key(row[static_cast<size_t>(a)]), kb = Key(row[static_cast<size_t>(b)]);
    return ka > kb || (ka == kb && a < b);
  });
  ids->assign(order.begin(), order.begin() + k);
  values->clear();
  for (int32_t id : *ids) values->push_back(row[static_cast<size_t>(id)]);
}

bool Same(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

void ExpectSameView(const sampling::SamplingView& dev, const sampling::SamplingView& host) {
  ASSERT_EQ(dev.candidates.size(), host.candidates.size());
  for (size_t j = 0; j < host.candidates.size(); ++j) {
    ASSERT_EQ(dev.candidates[j].id, host.candidates[j].id) << "candidate " << j;
    ASSERT_TRUE(Same(dev.candidates[j].logit, host.candidates[j].logit)) << "candidate " << j;
    ASSERT_TRUE(Same(dev.candidates[j].raw_logit, host.candidates[j].raw_logit)) << j;
  }
  EXPECT_EQ(dev.complete, host.complete);
  // Bits (a NaN row has NaN sums on both sides).
  EXPECT_EQ(std::bit_cast<uint64_t>(dev.raw_max), std::bit_cast<uint64_t>(host.raw_max));
  EXPECT_EQ(std::bit_cast<uint64_t>(dev.raw_log_sum), std::bit_cast<uint64_t>(host.raw_log_sum));
  EXPECT_EQ(dev.normaliser, host.normaliser);
  ASSERT_EQ(dev.raw_top.size(), host.raw_top.size());
  for (size_t j = 0; j < host.raw_top.size(); ++j) {
    EXPECT_EQ(dev.raw_top[j].id, host.raw_top[j].id);
    EXPECT_TRUE(Same(dev.raw_top[j].logprob, host.raw_top[j].logprob));
  }
}

// Runs the backend's protocol for one row: the planned fetch, then the
// widest, then the host. Returns whether the device served it.
bool DeviceView(const std::vector<float>& row, const sampling::SamplingOptions& o,
                const sampling::TokenHistory& history, sampling::SamplingView* view) {
  const int32_t vocab = static_cast<int32_t>(row.size());
  const DeviceRowPlan plan = PlanDeviceRow(o, history, vocab);
  if (plan.mode == DeviceRowMode::kHost) return false;
  EXPECT_LE(plan.fetch, kMaxDeviceTopK);
  const RowStats stats = HostStats(row);
  std::vector<int32_t> ids;
  std::vector<float> values;
  for (int32_t fetch : {std::min(plan.fetch, vocab), std::min(kMaxDeviceTopK, vocab)}) {
    HostTopK(row, fetch, &ids, &values);
    if (BuildViewFromTopK(plan, o, stats, ids.data(), values.data(), fetch, vocab, view)) {
      return true;
    }
  }
  return false;
}

std::vector<sampling::SamplingOptions> OptionGrid() {
  std::vector<sampling::SamplingOptions> grid;
  for (float t : {0.0f, 1.0f, 0.7f, 3.0f, 1e-5f}) {
    for (int32_t top_k : {0, 1, 10, 64, 100, 700, 1024, 2000}) {
      for (float min_p : {0.0f, 0.01f, 0.3f}) {
        for (int64_t logprobs : {0, 20}) {
          sampling::SamplingOptions o;
          o.temperature = t;
          o.top_k = top_k;
          o.min_p = min_p;
          o.top_p = 0.9f;
          o.top_logprobs = logprobs;
          grid.push_back(o);
        }
      }
    }
  }
  return grid;
}

TEST(DeviceSamplingTest, DeviceViewsEqualBuildSamplingView) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int served = 0, host = 0;
  for (int32_t vocab : {1, 5, 512, 3000}) {
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<float> row(static_cast<size_t>(vocab));
      const float scale = variant == 3 ? 0.05f : 4.0f;  // flat rows widen min_p
      for (float& l : row) {
        l = normal(rng) * scale;
        if (variant == 1) l = std::round(l * 4.0f) / 4.0f;  // many raw ties
      }
      if (variant == 2 && vocab > 4) {
        row[3] = -std::numeric_limits<float>::infinity();
        row[1] = std::numeric_limits<float>::quiet_NaN();
      }
      for (const sampling::SamplingOptions& o : OptionGrid()) {
        SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " variant " << variant
                                          << " T " << o.temperature << " top_k " << o.top_k
                                          << " min_p " << o.min_p << " logprobs "
                                          << o.top_logprobs);
        sampling::SamplingView dev, ref;
        const sampling::TokenHistory history;
        sampling::BuildSamplingView(row, o, history, &ref);
        if (!DeviceView(row, o, history, &dev)) {
          ++host;
          continue;
        }
        ++served;
        ExpectSameView(dev, ref);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
  // Most of the grid is the device's: top_k and min_p rows at every
  // temperature, greedy; top_p alone, and top_k 2000 > kMaxDeviceTopK, are
  // not.
  EXPECT_GT(served, 1200);
  EXPECT_GT(host, 100);
}

// Temperature 3 maps raw logits 1.5 + i ulps onto fewer floats: the ties it
// makes are ordered by id, unlike the raw order (by descending id).
// BuildViewFromTopK sorts the fetched ids into that order and, fetching
// only K, cannot know an unfetched id does not tie with the K-th.
TEST(DeviceSamplingTest, TemperatureTiesFollowTheProcessedOrder) {
  std::vector<float> row(300);
  for (size_t i = 0; i < row.size(); ++i) {
    row[i] = 1.5f + static_cast<float>(i) * std::ldexp(1.0f, -23);
  }
  sampling::SamplingOptions o;
  o.temperature = 3.0f;
  for (int32_t top_k : {64, 128}) {
    o.top_k = top_k;
    sampling::SamplingView dev, ref;
    sampling::BuildSamplingView(row, o, {}, &ref);
    ASSERT_TRUE(DeviceView(row, o, {}, &dev));
    ExpectSameView(dev, ref);
    bool tie_reordered = false;
    for (size_t j = 1; j < dev.candidates.size(); ++j) {
      tie_reordered = tie_reordered || dev.candidates[j].id > dev.candidates[j - 1].id;
    }
    EXPECT_TRUE(tie_reordered) << "the row makes no tie";
  }
  o.top_k = 64;
  const DeviceRowPlan plan = PlanDeviceRow(o, {}, 300);
  EXPECT_EQ(plan.mode, DeviceRowMode::kTopK);
  EXPECT_FALSE(plan.identity);
  EXPECT_EQ(plan.fetch, 128);
  std::vector<int32_t> ids;
  std::vector<float> values;
  HostTopK(row, 64, &ids, &values);
  sampling::SamplingView view;
  EXPECT_FALSE(BuildViewFromTopK(plan, o, HostStats(row), ids.data(), values.data(), 64, 300,
                                 &view));
}

TEST(DeviceSamplingTest, RowsTheDeviceCannotServeGoToTheHost) {
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> generated = {4};
  const sampling::TokenHistory history{prompt, generated};
  sampling::SamplingOptions o;
  o.temperature = 1.0f;
  o.top_p = 0.9f;  // top_k and min_p off: the normaliser is the vocabulary's
  EXPECT_EQ(PlanDeviceRow(o, history, 1000).mode, DeviceRowMode::kHost);
  o.top_k = 5;
  EXPECT_EQ(PlanDeviceRow(o, history, 1000).mode, DeviceRowMode::kTopK);
  o.repetition_penalty = 1.2f;
  EXPECT_EQ(PlanDeviceRow(o, history, 1000).mode, DeviceRowMode::kHost);
  o.repetition_penalty = 1.0f;
  o.logit_bias = {{7, 1.0f}};
  EXPECT_EQ(PlanDeviceRow(o, history, 1000).mode, DeviceRowMode::kHost);
  o.logit_bias.clear();
  o.min_tokens = 3;
  o.min_tokens_masked_ids = {2};
  EXPECT_EQ(PlanDeviceRow(o, history, 1000).mode, DeviceRowMode::kHost);
  o.min_tokens = 1;  // reached: the mask no longer applies
  EXPECT_EQ(PlanDeviceRow(o, history, 1000).mode, DeviceRowMode::kTopK);
  o.top_k = kMaxDeviceTopK + 1;
  EXPECT_EQ(PlanDeviceRow(o, history, 5000).mode, DeviceRowMode::kHost);
  o.temperature = 0.0f;
  o.frequency_penalty = 0.5f;  // greedy after a penalty
  EXPECT_EQ(PlanDeviceRow(o, history, 5000).mode, DeviceRowMode::kHost);
  o.frequency_penalty = 0.0f;
  EXPECT_EQ(PlanDeviceRow(o, history, 5000).mode, DeviceRowMode::kGreedy);
}

TEST(DeviceSamplingTest, GraphBuckets) {
  EXPECT_EQ(GraphBucket(1, 64), 1);
  EXPECT_EQ(GraphBucket(2, 64), 2);
  EXPECT_EQ(GraphBucket(3, 64), 4);
  EXPECT_EQ(GraphBucket(5, 64), 8);
  EXPECT_EQ(GraphBucket(17, 64), 32);
  EXPECT_EQ(GraphBucket(32, 64), 32);
  EXPECT_EQ(GraphBucket(33, 64), 64);
  EXPECT_EQ(GraphBucket(65, 256), 96);
  EXPECT_EQ(GraphBucket(33, 48), 48);
  EXPECT_EQ(GraphBucket(3, 2), 2);
}

// The buckets CudaBackend::CaptureGraphs captures up front: every value
// GraphBucket takes on [1, cap], so no decode step meets an uncaptured one.
TEST(DeviceSamplingTest, GraphBucketListCoversEveryBatchSize) {
  EXPECT_EQ(GraphBuckets(1), (std::vector<int32_t>{1}));
  EXPECT_EQ(GraphBuckets(48), (std::vector<int32_t>{1, 2, 4, 8, 16, 32, 48}));
  EXPECT_EQ(GraphBuckets(128), (std::vector<int32_t>{1, 2, 4, 8, 16, 32, 64, 96, 128}));
  EXPECT_EQ(GraphBuckets(3), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(GraphBuckets(0).empty());
  const std::vector<int32_t> buckets = GraphBuckets(200);
  for (int32_t n = 1; n <= 200; ++n) {
    EXPECT_NE(std::find(buckets.begin(), buckets.end(), GraphBucket(n, 200)), buckets.end())
        << "batch of " << n;
  }
}

}  // namespace
}  // namespace tandem::backend::cuda
