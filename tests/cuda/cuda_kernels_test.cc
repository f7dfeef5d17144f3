// The row, elementwise, GEMM and sampling kernels of cuda_kernels.h
// against host references: the CPU engine's kernels (cpu_kernels.h) where
// the GPU follows the same formula, plain loops elsewhere. Tolerances are
// stated per test; "exact" means bit-identical. Every test that launches
// a kernel skips without a GPU; the argument checks run everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/model/cpu_kernels.h"
#include "tests/cuda/cuda_test_util.h"

namespace tandem::backend::cuda {
namespace {

using testing::Bits;
using testing::Decode;
using testing::DeviceArray;
using testing::Encode;
using testing::kAllDtypes;
using testing::RandomFloats;
using testing::RoundTo;
using testing::SyncOrFail;

// |got - want| <= rel * |want| + abs, element by element.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float rel,
                 float abs, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float tol = rel * std::fabs(want[i]) + abs;
    if (!(std::fabs(got[i] - want[i]) <= tol) && reported++ < 5) {
      ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << ", want " << want[i]
                    << " (tolerance " << tol << ")";
    }
  }
}

void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (Bits(got[i]) != Bits(want[i]) && reported++ < 5) {
      ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << ", want " << want[i]
                    << " (bits differ)";
    }
  }
}

// The `dtype` bytes of a device output of n elements, decoded.
std::vector<float> DownloadAs(const DeviceArray<uint8_t>& out, Dtype dtype) {
  return Decode(out.Download(), dtype);
}

TEST(CudaElementwiseTest, AddAndConvertAreExact) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(1);
  const size_t n = 100003;
  std::vector<float> x = RandomFloats(rng, n, -100, 100), y = RandomFloats(rng, n, -100, 100);
  DeviceArray<float> dx(x), dy(y);
  ASSERT_EQ(LaunchAdd(dx.get(), dy.get(), n, nullptr), cudaSuccess);
  SyncOrFail();
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = x[i] + y[i];
  ExpectSameBits(dx.Download(), want, "add");
  for (Dtype dtype : kAllDtypes) {
    DeviceArray<uint8_t> out(n * kv::KvDtypeBytes(dtype));
    ASSERT_EQ(LaunchConvertF32(dy.get(), n, out.get(), dtype, nullptr), cudaSuccess);
    SyncOrFail();
    ExpectSameBits(DownloadAs(out, dtype), RoundTo(y, dtype), kv::KvDtypeName(dtype));
  }
}

TEST(CudaEmbeddingTest, GathersRowsOfEveryDtypeExactly) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(2);
  const int32_t vocab = 50, n_embd = 300;
  const std::vector<float> table = RandomFloats(rng, vocab * n_embd);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
  DeviceArray<int32_t> d_ids(ids);
  for (Dtype dtype : kAllDtypes) {
    DeviceArray<uint8_t> d_table(Encode(table, dtype));
    DeviceArray<float> x(ids.size() * n_embd);
    ASSERT_EQ(LaunchEmbedding(d_ids.get(), static_cast<int32_t>(ids.size()), d_table.get(),
                              dtype, n_embd, x.get(), nullptr),
              cudaSuccess);
    SyncOrFail();
    const std::vector<float> rounded = RoundTo(table, dtype);
    std::vector<float> want;
    for (int32_t id : ids) {
      want.insert(want.end(), rounded.begin() + id * n_embd, rounded.begin() + (id + 1) * n_embd);
    }
    ExpectSameBits(x.Download(), want, kv::KvDtypeName(dtype));
  }
}

// Rows of very different scales, so that the norm's scale matters.
std::vector<float> ScaledRows(std::mt19937& rng, int32_t rows, int32_t n) {
  std::vector<float> x = RandomFloats(rng, static_cast<size_t>(rows) * n);
  for (int32_t r = 0; r < rows; ++r) {
    const float scale = std::pow(10.0f, static_cast<float>(r % 5 - 2));
    for (int32_t i = 0; i < n; ++i) x[static_cast<size_t>(r) * n + i] *= scale;
  }
  return x;
}

// The CPU's RmsNorm sums squares in double in index order, the GPU in a
// fixed tree: the double sums differ in their last bits at most, so the
// float outputs agree to 2e-6 relative (F32); F16/BF16 outputs are within
// one rounding of the F32 reference (half an ulp: 2^-11 and 2^-8
// relative), checked at 1e-3 and 8e-3.
TEST(CudaRmsNormTest, MatchesCpuRmsNormForEveryOutputDtype) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(3);
  const int32_t rows = 6, n = 300;
  const float eps = 1e-5f;
  const std::vector<float> x = ScaledRows(rng, rows, n);
  const std::vector<float> weight = RandomFloats(rng, n, 0.5f, 1.5f);
  // Rows picked out of order and repeated (the logits rows).
  const std::vector<int32_t> pick = {4, 1, 1, 5};
  std::vector<float> want;
  for (int32_t r : pick) {
    std::vector<float> y(n);
    model::internal::RmsNorm(&x[static_cast<size_t>(r) * n], weight.data(), 1, n, eps, y.data());
    want.insert(want.end(), y.begin(), y.end());
  }
  DeviceArray<float> dx(x), dw(weight);
  DeviceArray<int32_t> d_pick(pick);
  for (Dtype dtype : kAllDtypes) {
    DeviceArray<uint8_t> out(pick.size() * n * kv::KvDtypeBytes(dtype));
    ASSERT_EQ(LaunchRmsNorm(dx.get(), d_pick.get(), static_cast<int32_t>(pick.size()), n,
                            dw.get(), eps, out.get(), dtype, nullptr),
              cudaSuccess);
    SyncOrFail();
    const float rel = dtype == Dtype::kF32 ? 2e-6f : dtype == Dtype::kF16 ? 1e-3f : 8e-3f;
    ExpectClose(DownloadAs(out, dtype), want, rel, 1e-30f, kv::KvDtypeName(dtype));
  }
  // rows == nullptr: row i is x's row i.
  DeviceArray<float> all(static_cast<size_t>(rows) * n);
  ASSERT_EQ(LaunchRmsNorm(dx.get(), nullptr, rows, n, dw.get(), eps, all.get(), Dtype::kF32,
                          nullptr),
            cudaSuccess);
  SyncOrFail();
  std::vector<float> want_all(static_cast<size_t>(rows) * n);
  model::internal::RmsNorm(x.data(), weight.data(), rows, n, eps, want_all.data());
  ExpectClose(all.Download(), want_all, 2e-6f, 1e-30f, "all rows");
}

// One block per row: a row's bits do not depend on how many rows run.
TEST(CudaRmsNormTest, RowBitsDoNotDependOnTheBatch) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(4);
  const int32_t rows = 17, n = 2048;
  const std::vector<float> x = ScaledRows(rng, rows, n);
  const std::vector<float> weight = RandomFloats(rng, n, 0.5f, 1.5f);
  DeviceArray<float> dx(x), dw(weight), all(static_cast<size_t>(rows) * n), one(n);
  ASSERT_EQ(LaunchRmsNorm(dx.get(), nullptr, rows, n, dw.get(), 1e-6f, all.get(), Dtype::kF32,
                          nullptr),
            cudaSuccess);
  SyncOrFail();
  const std::vector<float> batch = all.Download();
  for (int32_t r : {0, 7, 16}) {
    DeviceArray<int32_t> pick(std::vector<int32_t>{r});
    ASSERT_EQ(LaunchRmsNorm(dx.get(), pick.get(), 1, n, dw.get(), 1e-6f, one.get(), Dtype::kF32,
                            nullptr),
              cudaSuccess);
    SyncOrFail();
    ExpectSameBits(one.Download(),
                   std::vector<float>(batch.begin() + static_cast<size_t>(r) * n,
                                      batch.begin() + static_cast<size_t>(r + 1) * n),
                   "row " + std::to_string(r));
  }
}

struct RopeCase {
  model::RopeType type;
  int32_t n_head, n_head_kv, head_dim, rope_dim;
  float base;
  bool bias, freq_factors;
};

// The CPU engine's bias + RoPE (AddBias, RopeAngles, RopeApply /
// RopeApplyNeox) on rows of width q_dim + 2 kv_dim. Angles are computed in
// double on both sides; cos/sin may differ by a double ulp, so outputs
// agree to 1e-6 relative + 1e-6 (values of order 1); the V part and the
// dims past rope_dim only get the bias and are exact.
TEST(CudaBiasRopeTest, MatchesCpuRopeInBothPairings) {
  TANDEM_REQUIRE_GPU();
  const RopeCase cases[] = {
      {model::RopeType::kNorm, 8, 4, 8, 8, 10000.0f, false, false},     // stories260K
      {model::RopeType::kNeox, 4, 2, 16, 16, 1e6f, true, false},        // qwen2-tiny
      {model::RopeType::kNorm, 4, 2, 16, 16, 5e5f, false, true},        // llama3-tiny
      {model::RopeType::kNorm, 4, 1, 64, 32, 10000.0f, true, true},     // partial rotation
      {model::RopeType::kNeox, 4, 2, 128, 96, 1e6f, true, false},       // partial NEOX
      {model::RopeType::kNorm, 32, 8, 64, 64, 5e5f, false, true},       // llama3.2-1b
  };
  const std::vector<int32_t> positions = {0, 1, 17, 255, 256, 4095, 8191, 131071};
  std::mt19937 rng(5);
  for (const RopeCase& c : cases) {
    const int32_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
    const int32_t width = q_dim + 2 * kv_dim;
    const int32_t n_tokens = static_cast<int32_t>(positions.size());
    const std::vector<float> qkv = RandomFloats(rng, static_cast<size_t>(n_tokens) * width);
    const std::vector<float> bias = RandomFloats(rng, width);
    const std::vector<float> factors = RandomFloats(rng, c.rope_dim / 2, 1.0f, 8.0f);
    std::vector<float> want = qkv;
    for (int32_t t = 0; t < n_tokens; ++t) {
      float* row = &want[static_cast<size_t>(t) * width];
      if (c.bias) model::internal::AddBias(row, bias.data(), 1, width);
      std::vector<float> cs(c.rope_dim);
      model::internal::RopeAngles(positions[t], c.rope_dim, c.base,
                                  c.freq_factors ? factors.data() : nullptr, cs.data());
      const bool neox = c.type == model::RopeType::kNeox;
      auto apply = neox ? model::internal::RopeApplyNeox : model::internal::RopeApply;
      apply(row, c.n_head, c.head_dim, c.rope_dim, cs.data());
      apply(row + q_dim, c.n_head_kv, c.head_dim, c.rope_dim, cs.data());
    }
    DeviceArray<float> d_qkv(qkv), d_bias(bias), d_factors(factors);
    DeviceArray<int32_t> d_pos(positions);
    ASSERT_EQ(LaunchBiasRope(d_qkv.get(), n_tokens, d_pos.get(), c.bias ? d_bias.get() : nullptr,
                             c.n_head, c.n_head_kv, c.head_dim, c.rope_dim, c.type, c.base,
                             c.freq_factors ? d_factors.get() : nullptr, nullptr),
              cudaSuccess);
    SyncOrFail();
    const std::vector<float> got = d_qkv.Download();
    const std::string what = "head_dim " + std::to_string(c.head_dim) + " rope_dim " +
                             std::to_string(c.rope_dim);
    ExpectClose(got, want, 1e-6f, 1e-6f, what);
    // V and the unrotated tail: exact.
    for (int32_t t = 0; t < n_tokens; ++t) {
      for (int32_t e = 0; e < width; ++e) {
        const bool rotated = e < q_dim + kv_dim && e % c.head_dim < c.rope_dim;
        const size_t i = static_cast<size_t>(t) * width + e;
        if (!rotated) {
          ASSERT_EQ(Bits(got[i]), Bits(want[i])) << what << " element " << e;
        }
      }
    }
  }
}

// silu via expf (<= 2 ulp) against std::exp: 1e-6 relative (F32 output);
// F16/BF16 outputs within 1e-3 / 8e-3 relative as for RMSNorm.
TEST(CudaSwiGluTest, MatchesCpuSwiGlu) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(6);
  const int32_t n_tokens = 5, n_ff = 700;
  const std::vector<float> gate_up = RandomFloats(rng, static_cast<size_t>(n_tokens) * 2 * n_ff, -8, 8);
  std::vector<float> want;
  for (int32_t t = 0; t < n_tokens; ++t) {
    std::vector<float> a(gate_up.begin() + static_cast<size_t>(t) * 2 * n_ff,
                         gate_up.begin() + static_cast<size_t>(t) * 2 * n_ff + n_ff);
    model::internal::SwiGlu(a.data(), &gate_up[static_cast<size_t>(t) * 2 * n_ff + n_ff], n_ff);
    want.insert(want.end(), a.begin(), a.end());
  }
  DeviceArray<float> d_in(gate_up);
  for (Dtype dtype : kAllDtypes) {
    DeviceArray<uint8_t> out(want.size() * kv::KvDtypeBytes(dtype));
    ASSERT_EQ(LaunchSwiGlu(d_in.get(), n_tokens, n_ff, out.get(), dtype, nullptr), cudaSuccess);
    SyncOrFail();
    const float rel = dtype == Dtype::kF32 ? 1e-6f : dtype == Dtype::kF16 ? 1e-3f : 8e-3f;
    ExpectClose(DownloadAs(out, dtype), want, rel, 1e-6f, kv::KvDtypeName(dtype));
  }
}

// The F32 fixed-tile GEMM's documented order: acc = fma(a, w, acc) for k
// ascending, then + d. The host computes the same chain with std::fma, so
// the result is exact, for every m, and edges of every tile.
std::vector<float> FmaChainGemm(const std::vector<float>& a, const std::vector<float>& w,
                                int32_t m, int32_t n, int32_t k, const std::vector<float>* d0) {
  std::vector<float> d(static_cast<size_t>(m) * n);
  for (int32_t i = 0; i < m; ++i) {
    for (int32_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int32_t l = 0; l < k; ++l) {
        acc = std::fma(a[static_cast<size_t>(i) * k + l], w[static_cast<size_t>(j) * k + l], acc);
      }
      const size_t o = static_cast<size_t>(i) * n + j;
      d[o] = d0 != nullptr ? acc + (*d0)[o] : acc;
    }
  }
  return d;
}

// Runs LaunchFixedTileGemm on host matrices (rounded to dtype on upload);
// `d0` (m x n) is the accumulator when not null.
std::vector<float> RunFixedTileGemm(const std::vector<float>& a, const std::vector<float>& w,
                                    Dtype dtype, int32_t m, int32_t n, int32_t k,
                                    const std::vector<float>* d0) {
  DeviceArray<uint8_t> da(Encode(a, dtype)), dw(Encode(w, dtype));
  DeviceArray<float> d(static_cast<size_t>(m) * n);
  if (d0 != nullptr) d.Upload(*d0);
  EXPECT_EQ(LaunchFixedTileGemm(da.get(), dw.get(), dtype, m, n, k, d.get(), d0 != nullptr,
                                nullptr),
            cudaSuccess);
  SyncOrFail();
  return d.Download();
}

TEST(CudaFixedTileGemmTest, F32EqualsTheFmaChainExactly) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(7);
  const int32_t n = 130, k = 100;
  const std::vector<float> w = RandomFloats(rng, static_cast<size_t>(n) * k);
  for (int32_t m : {1, 3, 64, 70, 257}) {
    const std::vector<float> a = RandomFloats(rng, static_cast<size_t>(m) * k);
    const std::vector<float> d0 = RandomFloats(rng, static_cast<size_t>(m) * n);
    const std::string what = "m " + std::to_string(m);
    ExpectSameBits(RunFixedTileGemm(a, w, Dtype::kF32, m, n, k, nullptr),
                   FmaChainGemm(a, w, m, n, k, nullptr), what);
    ExpectSameBits(RunFixedTileGemm(a, w, Dtype::kF32, m, n, k, &d0),
                   FmaChainGemm(a, w, m, n, k, &d0), what + " accumulate");
  }
}

// F16/BF16 run on tensor cores, whose F32 accumulation is not a chain of
// IEEE operations: within 1e-4 of sum_k |a w| (about k ulps) of the
// double product of the rounded inputs. K = 100 takes the element-wise
// panel loads and a padded tail, K = 96 the 16-byte loads.
TEST(CudaFixedTileGemmTest, HalfTypesMatchTheDoubleProduct) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(15);
  const int32_t n = 130;
  for (Dtype dtype : {Dtype::kF16, Dtype::kBF16}) {
    for (int32_t k : {100, 96}) {
      const std::vector<float> w = RandomFloats(rng, static_cast<size_t>(n) * k);
      const std::vector<float> wr = RoundTo(w, dtype);
      for (int32_t m : {1, 3, 70, 257}) {
        const std::vector<float> a = RandomFloats(rng, static_cast<size_t>(m) * k);
        const std::vector<float> ar = RoundTo(a, dtype);
        const std::vector<float> d0 = RandomFloats(rng, static_cast<size_t>(m) * n);
        for (bool accumulate : {false, true}) {
          const std::vector<float> got =
              RunFixedTileGemm(a, w, dtype, m, n, k, accumulate ? &d0 : nullptr);
          int failures = 0;
          for (int32_t i = 0; i < m && failures < 5; ++i) {
            for (int32_t j = 0; j < n && failures < 5; ++j) {
              double want = 0.0, magnitude = 0.0;
              for (int32_t l = 0; l < k; ++l) {
                const double p = static_cast<double>(ar[static_cast<size_t>(i) * k + l]) *
                                 wr[static_cast<size_t>(j) * k + l];
                want += p;
                magnitude += std::fabs(p);
              }
              const size_t o = static_cast<size_t>(i) * n + j;
              if (accumulate) want += d0[o];
              if (!(std::fabs(got[o] - want) <= 1e-4 * magnitude + 1e-6)) {
                ++failures;
                ADD_FAILURE() << kv::KvDtypeName(dtype) << " k " << k << " m " << m
                              << (accumulate ? " accumulate" : "") << " [" << i << "][" << j
                              << "]: got " << got[o] << ", want " << want;
              }
            }
          }
        }
      }
    }
  }
}

// The batch-invariance claim on a model-sized shape, for every dtype: the
// first rows of m = 2048 have the bits of the same rows computed at m = 1
// and 17 (edge tiles, element-wise loads) and m = 64 (one full tile).
TEST(CudaFixedTileGemmTest, RowBitsDoNotDependOnM) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(8);
  const int32_t n = 512, k = 2048, m_max = 2048;
  const std::vector<float> a = RandomFloats(rng, static_cast<size_t>(m_max) * k);
  const std::vector<float> w = RandomFloats(rng, static_cast<size_t>(n) * k);
  for (Dtype dtype : kAllDtypes) {
    const std::vector<float> all = RunFixedTileGemm(a, w, dtype, m_max, n, k, nullptr);
    for (int32_t m : {1, 17, 64}) {
      const std::vector<float> got = RunFixedTileGemm(
          std::vector<float>(a.begin(), a.begin() + static_cast<size_t>(m) * k), w, dtype, m, n,
          k, nullptr);
      ExpectSameBits(got,
                     std::vector<float>(all.begin(), all.begin() + static_cast<size_t>(m) * n),
                     std::string(kv::KvDtypeName(dtype)) + " m " + std::to_string(m));
    }
  }
}

// Rows that exercise the candidate order: random; ties at the top (the
// lower id wins); NaN first (ranks as -inf); few distinct values with
// -0/+0 and -inf; everything equal.
std::vector<float> SamplingRows(std::mt19937& rng, int32_t vocab) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> rows = RandomFloats(rng, static_cast<size_t>(vocab), -20.0f, 20.0f);
  // Ties at the top.
  std::vector<float> tied = RandomFloats(rng, static_cast<size_t>(vocab), -5.0f, 5.0f);
  tied[vocab - 1] = 9.0f;
  tied[vocab / 2] = 9.0f;
  if (vocab > 3) tied[3] = 9.0f;
  rows.insert(rows.end(), tied.begin(), tied.end());
  // NaN, -inf, -0/+0 among a handful of values.
  std::uniform_int_distribution<int> pick(0, 7);
  const float values[8] = {nan, -inf, -0.0f, 0.0f, 1.5f, -3.0f, 7.25f, 7.25f};
  for (int32_t i = 0; i < vocab; ++i) rows.push_back(values[pick(rng)]);
  rows[2 * static_cast<size_t>(vocab)] = nan;
  // All equal.
  rows.insert(rows.end(), static_cast<size_t>(vocab), -1.0f);
  return rows;
}

// The candidate order (sampling_view.h) on the host.
std::vector<int32_t> CandidateOrder(const float* row, int32_t vocab) {
  auto key = [&](int32_t i) { return std::isnan(row[i]) ? -INFINITY : row[i]; };
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return key(a) > key(b) || (key(a) == key(b) && a < b);
  });
  return ids;
}

// argmax and max exact; log_sum within 1e-12 relative (double sums in a
// different order than the host's index order).
TEST(CudaRowStatsTest, MatchesTheCandidateOrderAndTheDoubleLogSum) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(9);
  for (int32_t vocab : {1, 7, 1000, 32000, 151936}) {
    const std::vector<float> logits = SamplingRows(rng, vocab);
    const int32_t rows = static_cast<int32_t>(logits.size() / vocab);
    DeviceArray<float> d_logits(logits);
    DeviceArray<RowStats> d_stats(rows);
    ASSERT_EQ(LaunchRowStats(d_logits.get(), rows, vocab, d_stats.get(), nullptr), cudaSuccess);
    SyncOrFail();
    const std::vector<RowStats> stats = d_stats.Download();
    for (int32_t r = 0; r < rows; ++r) {
      const float* row = &logits[static_cast<size_t>(r) * vocab];
      const int32_t best = CandidateOrder(row, vocab)[0];
      double sum = 0.0;
      for (int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i]) - row[best]);
      const double log_sum = std::log(sum);
      const std::string what = "vocab " + std::to_string(vocab) + " row " + std::to_string(r);
      EXPECT_EQ(stats[r].argmax, best) << what;
      EXPECT_EQ(Bits(stats[r].max), Bits(row[best])) << what;
      if (std::isnan(log_sum)) {
        EXPECT_TRUE(std::isnan(stats[r].log_sum)) << what;
      } else {
        EXPECT_NEAR(stats[r].log_sum, log_sum, 1e-12 * std::max(1.0, std::fabs(log_sum))) << what;
      }
    }
  }
}

// Ids and values exact against a host sort in the candidate order.
TEST(CudaRowTopKTest, FirstKIdsInTheCandidateOrder) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(10);
  for (int32_t vocab : {1, 7, 1000, 32000, 151936, 262144}) {
    const std::vector<float> logits = SamplingRows(rng, vocab);
    const int32_t rows = static_cast<int32_t>(logits.size() / vocab);
    DeviceArray<float> d_logits(logits);
    DeviceArray<uint8_t> workspace(RowTopKWorkspaceBytes(rows, vocab));
    std::vector<std::vector<int32_t>> orders;
    for (int32_t r = 0; r < rows; ++r) {
      orders.push_back(CandidateOrder(&logits[static_cast<size_t>(r) * vocab], vocab));
    }
    for (int32_t k : {1, 5, 64, 1000, kMaxDeviceTopK}) {
      if (k > vocab) continue;
      DeviceArray<int32_t> d_ids(static_cast<size_t>(rows) * k);
      DeviceArray<float> d_values(static_cast<size_t>(rows) * k);
      ASSERT_EQ(LaunchRowTopK(d_logits.get(), rows, vocab, k, workspace.get(), d_ids.get(),
                              d_values.get(), nullptr),
                cudaSuccess);
      SyncOrFail();
      const std::vector<int32_t> ids = d_ids.Download();
      const std::vector<float> values = d_values.Download();
      for (int32_t r = 0; r < rows; ++r) {
        const float* row = &logits[static_cast<size_t>(r) * vocab];
        const std::vector<int32_t>& order = orders[r];
        const std::string what = "vocab " + std::to_string(vocab) + " k " + std::to_string(k) +
                                 " row " + std::to_string(r);
        for (int32_t i = 0; i < k; ++i) {
          const size_t o = static_cast<size_t>(r) * k + i;
          ASSERT_EQ(ids[o], order[i]) << what << " rank " << i;
          ASSERT_EQ(Bits(values[o]), Bits(row[order[i]])) << what << " rank " << i;
        }
      }
    }
  }
}

// Argument checks return cudaErrorInvalidValue before touching the
// device, and empty work launches nothing: these run without a GPU.
TEST(CudaKernelArgsTest, BadArgumentsAreRefusedAndEmptyWorkIsANoOp) {
  EXPECT_EQ(LaunchRowTopK(nullptr, 1, 100, kMaxDeviceTopK + 1, nullptr, nullptr, nullptr,
                          nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchRowTopK(nullptr, 1, 10, 11, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchRowTopK(nullptr, 1, 10, 0, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchRowStats(nullptr, 1, 0, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchBiasRope(nullptr, 1, nullptr, nullptr, 4, 2, 16, 32, model::RopeType::kNorm,
                           10000.0f, nullptr, nullptr),
            cudaErrorInvalidValue);  // rope_dim > head_dim
  EXPECT_EQ(LaunchFixedTileGemm(nullptr, nullptr, Dtype::kF32, -1, 4, 4, nullptr, false,
                                nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchConvertF32(nullptr, 4, nullptr, static_cast<Dtype>(7), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchRmsNorm(nullptr, nullptr, 0, 64, nullptr, 1e-5f, nullptr, Dtype::kF32,
                          nullptr),
            cudaSuccess);
  EXPECT_EQ(LaunchSwiGlu(nullptr, 0, 64, nullptr, Dtype::kBF16, nullptr), cudaSuccess);
  EXPECT_EQ(LaunchFixedTileGemm(nullptr, nullptr, Dtype::kBF16, 0, 64, 64, nullptr, false,
                                nullptr),
            cudaSuccess);
  EXPECT_EQ(RowTopKWorkspaceBytes(128, 262144), 0u);
}

}  // namespace
}  // namespace tandem::backend::cuda
