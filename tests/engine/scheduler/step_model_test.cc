// StepModel: the online step-time fit converges on synthetic step times
// drawn from known coefficients, keeps every coefficient >= 0, follows a
// change of speed, keeps warm-up (anchor) knowledge of features unseen
// since, and averages KV link rates per peer.
#include "engine/scheduler/step_model.h"

#include <cmath>
#include <random>

#include "engine/scheduler/scheduler.h"
#include "gtest/gtest.h"

namespace tandem::scheduler {
namespace {

// The true step time of `shape` under `c` (the model's formula, written
// out: the reference the fit must recover).
double TrueMs(const StepCoefficients& c, const StepShape& shape) {
  return c.base_ms + c.prefill_ms_per_token * shape.prefill_tokens +
         c.prefill_ms_per_kilo_pair * shape.prefill_pairs / 1000.0 +
         c.decode_ms_per_seq * shape.decode_seqs +
         c.decode_ms_per_kilo_context * static_cast<double>(shape.decode_context) / 1000.0;
}

// A random step: up to 2 prefill chunks and up to 32 decodes.
StepShape RandomShape(std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> chunks(0, 2), count(2, 512), start(0, 2048),
      decodes(0, 32), context(1, 2048);
  StepShape shape;
  for (int i = chunks(rng); i > 0; --i) shape.AddChunk(start(rng), count(rng));
  for (int i = decodes(rng); i > 0; --i) shape.AddChunk(context(rng), 1);
  return shape;
}

constexpr StepCoefficients kTruth{1.5, 0.02, 0.004, 0.3, 0.05};

TEST(StepShapeTest, ChunksAndDecodes) {
  StepShape shape;
  shape.AddChunk(10, 4);   // pairs 4 x (10 + 2.5) = 50
  shape.AddChunk(99, 1);   // a decode attending to 100 tokens
  shape.AddChunk(0, 0);    // nothing
  EXPECT_EQ(shape.prefill_tokens, 4);
  EXPECT_DOUBLE_EQ(shape.prefill_pairs, 50.0);
  EXPECT_EQ(shape.decode_seqs, 1);
  EXPECT_EQ(shape.decode_context, 100);
  StepPlan plan;
  plan.chunks = {{1, 10, 4, true}, {2, 99, 1, true}};
  const StepShape of_plan = ShapeOf(plan);
  EXPECT_EQ(of_plan.prefill_tokens, 4);
  EXPECT_EQ(of_plan.decode_context, 100);
}

TEST(StepModelTest, NoSamplesPredictsZero) {
  StepModel model;
  EXPECT_FALSE(model.ready());
  StepShape shape;
  shape.AddChunk(0, 100);
  EXPECT_EQ(model.PredictMs(shape), 0.0);
}

TEST(StepModelTest, ConvergesOnSyntheticStepTimes) {
  std::mt19937 rng(7);
  StepModel model;
  for (int i = 0; i < 300; ++i) {
    const StepShape shape = RandomShape(rng);
    model.Observe(shape, TrueMs(kTruth, shape));
  }
  const StepCoefficients& c = model.coefficients();
  EXPECT_NEAR(c.base_ms, kTruth.base_ms, 0.01);
  EXPECT_NEAR(c.prefill_ms_per_token, kTruth.prefill_ms_per_token, 1e-4);
  EXPECT_NEAR(c.prefill_ms_per_kilo_pair, kTruth.prefill_ms_per_kilo_pair, 1e-5);
  EXPECT_NEAR(c.decode_ms_per_seq, kTruth.decode_ms_per_seq, 1e-3);
  EXPECT_NEAR(c.decode_ms_per_kilo_context, kTruth.decode_ms_per_kilo_context, 1e-3);
  for (int i = 0; i < 20; ++i) {
    const StepShape shape = RandomShape(rng);
    EXPECT_NEAR(model.PredictMs(shape), TrueMs(kTruth, shape), 0.01 * TrueMs(kTruth, shape));
  }
  EXPECT_LT(model.Snapshot(512).mean_abs_error_ms, 0.05);
}

TEST(StepModelTest, NoisyTimesStillConvergeAndCoefficientsStayNonNegative) {
  std::mt19937 rng(11);
  std::normal_distribution<double> noise(0.0, 0.2);
  // No per-context decode cost: noise must not make that coefficient negative.
  StepCoefficients truth = kTruth;
  truth.decode_ms_per_kilo_context = 0;
  StepModel model;
  for (int i = 0; i < 2000; ++i) {
    const StepShape shape = RandomShape(rng);
    model.Observe(shape, std::max(0.0, TrueMs(truth, shape) + noise(rng)));
    const StepCoefficients& c = model.coefficients();
    ASSERT_GE(c.base_ms, 0);
    ASSERT_GE(c.prefill_ms_per_token, 0);
    ASSERT_GE(c.prefill_ms_per_kilo_pair, 0);
    ASSERT_GE(c.decode_ms_per_seq, 0);
    ASSERT_GE(c.decode_ms_per_kilo_context, 0);
  }
  StepShape prefill;
  prefill.AddChunk(0, 512);
  EXPECT_NEAR(model.PredictMs(prefill), TrueMs(truth, prefill), 0.05 * TrueMs(truth, prefill));
}

TEST(StepModelTest, FollowsAChangeOfSpeed) {
  std::mt19937 rng(3);
  StepModel model;
  for (int i = 0; i < 300; ++i) {
    const StepShape shape = RandomShape(rng);
    model.Observe(shape, TrueMs(kTruth, shape));
  }
  // The machine becomes twice as slow (another tenant, a lower clock).
  StepCoefficients slow = kTruth;
  slow.base_ms *= 2, slow.prefill_ms_per_token *= 2, slow.prefill_ms_per_kilo_pair *= 2;
  slow.decode_ms_per_seq *= 2, slow.decode_ms_per_kilo_context *= 2;
  for (int i = 0; i < 500; ++i) {
    const StepShape shape = RandomShape(rng);
    model.Observe(shape, TrueMs(slow, shape));
  }
  StepShape probe;
  probe.AddChunk(0, 256);
  probe.AddChunk(300, 1);
  EXPECT_NEAR(model.PredictMs(probe), TrueMs(slow, probe), 0.05 * TrueMs(slow, probe));
}

TEST(StepModelTest, WarmUpAnchorsKeepUnseenFeatures) {
  std::mt19937 rng(5);
  StepModel model;
  for (int i = 0; i < 12; ++i) {  // a warm-up: prefills and decodes
    const StepShape shape = RandomShape(rng);
    model.Observe(shape, TrueMs(kTruth, shape), /*anchor=*/true);
  }
  // Then an hour of decode-only steps.
  for (int i = 0; i < 3000; ++i) {
    StepShape shape;
    for (int d = 1 + i % 16; d > 0; --d) shape.AddChunk(100 + 7 * d, 1);
    model.Observe(shape, TrueMs(kTruth, shape));
  }
  StepShape prefill;
  prefill.AddChunk(0, 512);
  EXPECT_NEAR(model.PredictMs(prefill), TrueMs(kTruth, prefill), 0.02 * TrueMs(kTruth, prefill));
}

TEST(StepModelTest, IgnoresBadTimes) {
  StepModel model;
  StepShape shape;
  shape.AddChunk(0, 8);
  model.Observe(shape, -1);
  model.Observe(shape, std::nan(""));
  EXPECT_EQ(model.samples(), 0u);
}

TEST(StepModelTest, SnapshotDerivesRates) {
  StepModel model;
  std::mt19937 rng(9);
  for (int i = 0; i < 200; ++i) {
    const StepShape shape = RandomShape(rng);
    model.Observe(shape, TrueMs(kTruth, shape), /*anchor=*/true);
  }
  const StepModelSnapshot s = model.Snapshot(512);
  EXPECT_EQ(s.samples, 200u);
  // 512 tokens from 0: 1.5 + 0.02 x 512 + 0.004 x 512 x 256.5 / 1000 ms.
  const double prefill_ms = 1.5 + 0.02 * 512 + 0.004 * 512 * 256.5 / 1000;
  EXPECT_NEAR(s.prefill_tokens_per_s, 512 * 1000.0 / prefill_ms, 0.01 * 512 * 1000.0 / prefill_ms);
  // One decode at 512 tokens of context: 1.5 + 0.3 + 0.05 x 0.512 ms.
  EXPECT_NEAR(s.decode_step_ms, 1.5 + 0.3 + 0.05 * 0.512, 0.01);
}

TEST(StepModelTest, LinkRatesPerPeer) {
  StepModel model;
  EXPECT_FALSE(model.LinkBytesPerSecond("p0").has_value());
  model.ObserveTransfer("p0", 1000, 0.001);  // 1e6 B/s
  model.ObserveTransfer("p1", 4000, 0.001);  // 4e6 B/s
  EXPECT_DOUBLE_EQ(*model.LinkBytesPerSecond("p0"), 1e6);
  EXPECT_DOUBLE_EQ(*model.LinkBytesPerSecond("unknown"), 2.5e6);  // the mean
  model.ObserveTransfer("p0", 2000, 0.001);  // EWMA 0.7 x 1e6 + 0.3 x 2e6
  EXPECT_DOUBLE_EQ(*model.LinkBytesPerSecond("p0"), 1.3e6);
  model.ObserveTransfer("p0", 0, 1);  // ignored
  model.ObserveTransfer("p0", 10, 0);
  EXPECT_DOUBLE_EQ(*model.LinkBytesPerSecond("p0"), 1.3e6);
  EXPECT_EQ(model.Snapshot(512).kv_link_bytes_per_s.size(), 2u);
}

}  // namespace
}  // namespace tandem::scheduler
