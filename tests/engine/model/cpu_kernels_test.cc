// Batch-invariant kernels (DESIGN.md, Engine): Dot and every MatMul ISA path
// follow their documented summation orders, a MatMul row is bit-identical
// whatever the batch size (M = 1, 3, 4, 17, 64) and however many threads
// split the columns, and the ISA paths agree within float rounding; RoPE's
// two pairings (NORM, NEOX) with and without frequency factors, and the bias
// add, on hand-computed values.
#include "engine/model/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include "engine/model/thread_pool.h"
#include "gtest/gtest.h"

namespace tandem::model::internal {
namespace {

std::vector<float> RandomFloats(size_t n, std::mt19937& rng) {
  // Mixed magnitudes, so a different summation order would show in the bits.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-6, 6);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(normal(rng), exponent(rng));
  return v;
}

// The order cpu_kernels.h documents for Dot, written out independently.
float DocumentedDot(const float* a, const float* b, size_t n) {
  float lane[8] = {};
  const size_t n8 = n / 8 * 8;
  for (size_t i = 0; i < n8; ++i) lane[i % 8] = lane[i % 8] + a[i] * b[i];
  float sum = ((lane[0] + lane[4]) + (lane[2] + lane[6])) +
              ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  for (size_t i = n8; i < n; ++i) sum = sum + a[i] * b[i];
  return sum;
}

// The per-element order cpu_kernels.h documents for `isa`, written out
// independently (std::fma rounds once, as the hardware's fused multiply-add).
float DocumentedIsaDot(KernelIsaKind isa, const float* a, const float* b, size_t n) {
  if (isa == KernelIsaKind::kGeneric) return DocumentedDot(a, b, n);
  const size_t lanes = isa == KernelIsaKind::kAvx512 ? 16 : 8;
  float lane[16] = {};
  const size_t nl = n / lanes * lanes;
  for (size_t i = 0; i < nl; ++i) lane[i % lanes] = std::fma(a[i], b[i], lane[i % lanes]);
  float l8[8];
  for (size_t j = 0; j < 8; ++j) l8[j] = lanes == 16 ? lane[j] + lane[j + 8] : lane[j];
  float sum = ((l8[0] + l8[4]) + (l8[2] + l8[6])) + ((l8[1] + l8[5]) + (l8[3] + l8[7]));
  for (size_t i = nl; i < n; ++i) sum = sum + a[i] * b[i];
  return sum;
}

// The ISAs this CPU runs (the generic one always).
std::vector<KernelIsaKind> SupportedIsas() {
  std::vector<KernelIsaKind> isas;
  for (KernelIsaKind isa :
       {KernelIsaKind::kGeneric, KernelIsaKind::kAvx2, KernelIsaKind::kAvx512}) {
    if (KernelIsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

TEST(CpuKernelsTest, DotSumsInTheDocumentedOrder) {
  std::mt19937 rng(7);
  for (size_t n : {0, 1, 7, 8, 9, 64, 67, 172, 1000}) {
    const std::vector<float> a = RandomFloats(n, rng), b = RandomFloats(n, rng);
    const float got = Dot(a.data(), b.data(), n);
    const float want = DocumentedDot(a.data(), b.data(), n);
    EXPECT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << "n " << n;
  }
}

// Row r of MatMul over M rows, for every M in {1, 3, 4, 17, 64} and with 1, 2
// and 3 threads (each kernel split however small), equals bit for bit row r
// computed alone (M = 1, calling thread only).
TEST(CpuKernelsTest, MatMulRowsIdenticalForAnyBatchSizeAndThreadCount) {
  struct Shape {
    size_t in, out;
  };
  // stories260K's (64 -> 64, 64 -> 172, 172 -> 64, 64 -> 512) and odd sizes
  // with a Dot tail and uneven column splits.
  const Shape shapes[] = {{64, 64}, {64, 172}, {172, 64}, {64, 512}, {67, 37}, {5, 3}};
  ThreadPool pool1(1), pool2(2), pool3(3);
  ThreadPool* const pools[] = {nullptr, &pool1, &pool2, &pool3};
  std::mt19937 rng(42);
  for (const Shape& s : shapes) {
    const std::vector<float> w = RandomFloats(s.out * s.in, rng);
    const std::vector<float> x = RandomFloats(64 * s.in, rng);
    // Each row alone: the reference.
    std::vector<float> alone(64 * s.out);
    for (size_t r = 0; r < 64; ++r) {
      MatMul(&x[r * s.in], w.data(), 1, s.in, s.out, &alone[r * s.out]);
    }
    for (size_t m : {1, 3, 4, 17, 64}) {
      for (ThreadPool* pool : pools) {
        for (size_t min_work : {size_t{0}, kMinParallelWork}) {
          SCOPED_TRACE(::testing::Message()
                       << "in " << s.in << " out " << s.out << " M " << m << " threads "
                       << (pool == nullptr ? 0 : pool->num_threads()) << " min_work "
                       << min_work);
          std::vector<float> y(m * s.out, -1.0f);
          MatMul(x.data(), w.data(), m, s.in, s.out, y.data(), pool, min_work);
          for (size_t r = 0; r < m; ++r) {
            EXPECT_EQ(std::memcmp(&y[r * s.out], &alone[r * s.out], s.out * sizeof(float)), 0)
                << "row " << r;
          }
        }
      }
    }
  }
}

TEST(CpuKernelsTest, MatMulColumnsWritesOnlyItsColumns) {
  std::mt19937 rng(3);
  const size_t rows = 3, in = 9, out = 5;
  const std::vector<float> x = RandomFloats(rows * in, rng), w = RandomFloats(out * in, rng);
  std::vector<float> y(rows * out, 7.0f);
  MatMulColumns(x.data(), w.data(), rows, in, out, 1, 3, y.data());
  for (size_t r = 0; r < rows; ++r) {
    for (size_t o = 0; o < out; ++o) {
      const float want = (o >= 1 && o < 3) ? DocumentedIsaDot(ActiveKernelIsa(), &w[o * in],
                                                              &x[r * in], in)
                                            : 7.0f;
      EXPECT_EQ(std::memcmp(&y[r * out + o], &want, sizeof(float)), 0) << r << "," << o;
    }
  }
}

TEST(CpuKernelsTest, KernelIsaNamesTheActiveIsa) {
  const std::string name = KernelIsa();
  EXPECT_EQ(name, KernelIsaName(ActiveKernelIsa()));
  EXPECT_TRUE(name == "generic" || name == "avx2" || name == "avx512") << name;
  EXPECT_TRUE(KernelIsaSupported(ActiveKernelIsa()));
  EXPECT_TRUE(KernelIsaSupported(KernelIsaKind::kGeneric));
}

// Every element of every ISA path, in full and edge tiles, equals the
// documented order of that ISA bit for bit.
TEST(CpuKernelsTest, EachIsaFollowsItsDocumentedOrder) {
  std::mt19937 rng(11);
  const size_t rows = 7, out = 9;
  for (KernelIsaKind isa : SupportedIsas()) {
    for (size_t in : {1, 7, 8, 9, 15, 16, 17, 64, 67, 172}) {
      SCOPED_TRACE(::testing::Message() << KernelIsaName(isa) << " in " << in);
      const std::vector<float> x = RandomFloats(rows * in, rng);
      const std::vector<float> w = RandomFloats(out * in, rng);
      std::vector<float> y(rows * out, -1.0f);
      MatMulColumnsWithIsa(isa, x.data(), w.data(), rows, in, out, 0, out, y.data());
      for (size_t r = 0; r < rows; ++r) {
        for (size_t o = 0; o < out; ++o) {
          const float want = DocumentedIsaDot(isa, &w[o * in], &x[r * in], in);
          EXPECT_EQ(std::memcmp(&y[r * out + o], &want, sizeof(float)), 0) << r << "," << o;
        }
      }
    }
  }
}

// For each ISA: row r over M rows, with the columns cut into ranges of any
// width, equals bit for bit row r computed alone over all columns.
TEST(CpuKernelsTest, EachIsaRowsIdenticalForAnyBatchSizeAndColumnSplit) {
  std::mt19937 rng(5);
  const size_t in = 67, out = 37;
  const std::vector<float> w = RandomFloats(out * in, rng);
  const std::vector<float> x = RandomFloats(64 * in, rng);
  for (KernelIsaKind isa : SupportedIsas()) {
    std::vector<float> alone(64 * out);
    for (size_t r = 0; r < 64; ++r) {
      MatMulColumnsWithIsa(isa, &x[r * in], w.data(), 1, in, out, 0, out, &alone[r * out]);
    }
    for (size_t m : {1, 3, 4, 5, 17, 64}) {
      for (size_t width : {1, 3, 5, 37}) {
        SCOPED_TRACE(::testing::Message()
                     << KernelIsaName(isa) << " M " << m << " width " << width);
        std::vector<float> y(m * out, -1.0f);
        for (size_t o = 0; o < out; o += width) {
          MatMulColumnsWithIsa(isa, x.data(), w.data(), m, in, out, o,
                               std::min(out, o + width), y.data());
        }
        for (size_t r = 0; r < m; ++r) {
          EXPECT_EQ(std::memcmp(&y[r * out], &alone[r * out], out * sizeof(float)), 0)
              << "row " << r;
        }
      }
    }
  }
}

// The ISA paths differ only by rounding: each is within the float dot-product
// error bound n * 2^-24 * sum |w_i x_i| (Higham, Accuracy and Stability of
// Numerical Algorithms, 3.1) of the sum in double.
TEST(CpuKernelsTest, IsaPathsAgreeWithinRounding) {
  std::mt19937 rng(9);
  const size_t rows = 5, out = 13;
  for (size_t in : {9, 64, 172, 1000}) {
    const std::vector<float> x = RandomFloats(rows * in, rng);
    const std::vector<float> w = RandomFloats(out * in, rng);
    for (KernelIsaKind isa : SupportedIsas()) {
      SCOPED_TRACE(::testing::Message() << KernelIsaName(isa) << " in " << in);
      std::vector<float> y(rows * out);
      MatMulColumnsWithIsa(isa, x.data(), w.data(), rows, in, out, 0, out, y.data());
      for (size_t r = 0; r < rows; ++r) {
        for (size_t o = 0; o < out; ++o) {
          double exact = 0.0, magnitude = 0.0;
          for (size_t i = 0; i < in; ++i) {
            const double p = static_cast<double>(w[o * in + i]) * x[r * in + i];
            exact += p;
            magnitude += std::fabs(p);
          }
          const double bound = static_cast<double>(in) * std::ldexp(1.0, -24) * magnitude;
          EXPECT_NEAR(y[r * out + o], exact, bound) << r << "," << o;
        }
      }
    }
  }
}

// Angles of 90 and 180 degrees make every product exact: the expected
// values follow from the pairings in cpu_kernels.h by hand.
TEST(RopeTest, NormRotatesConsecutivePairsNeoxTheTwoHalves) {
  const float cs[] = {0.0f, 1.0f, -1.0f, 0.0f};  // pair 0: 90 deg, pair 1: 180 deg
  // Two heads of head_dim 6, rope_dim 4: dimensions 4 and 5 stay.
  std::vector<float> norm = {1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60};
  std::vector<float> neox = norm;
  RopeApply(norm.data(), 2, 6, 4, cs);
  // NORM: pair 0 = (x0, x1), pair 1 = (x2, x3).
  EXPECT_EQ(norm, (std::vector<float>{-2, 1, -3, -4, 5, 6, -20, 10, -30, -40, 50, 60}));
  RopeApplyNeox(neox.data(), 2, 6, 4, cs);
  // NEOX: pair 0 = (x0, x2), pair 1 = (x1, x3).
  EXPECT_EQ(neox, (std::vector<float>{-3, -2, 1, -4, 5, 6, -30, -20, 10, -40, 50, 60}));
}

TEST(RopeTest, AnglesDivideByTheFrequencyFactors) {
  // pos 3, rope_dim 4, base 100: theta_0 = 3, theta_1 = 3 * 100^(-1/2) = 0.3.
  float cs[4];
  RopeAngles(3, 4, 100.0f, nullptr, cs);
  EXPECT_FLOAT_EQ(cs[0], std::cos(3.0f));
  EXPECT_FLOAT_EQ(cs[1], std::sin(3.0f));
  EXPECT_FLOAT_EQ(cs[2], std::cos(0.3f));
  EXPECT_FLOAT_EQ(cs[3], std::sin(0.3f));
  const float factors[] = {2.0f, 0.5f};  // theta_0 = 1.5, theta_1 = 0.6
  RopeAngles(3, 4, 100.0f, factors, cs);
  EXPECT_FLOAT_EQ(cs[0], std::cos(1.5f));
  EXPECT_FLOAT_EQ(cs[1], std::sin(1.5f));
  EXPECT_FLOAT_EQ(cs[2], std::cos(0.6f));
  EXPECT_FLOAT_EQ(cs[3], std::sin(0.6f));
  // Factors of 1 change no bit (x / 1 is exact).
  const float ones[] = {1.0f, 1.0f};
  float plain[4], with_ones[4];
  RopeAngles(1234, 4, 10000.0f, nullptr, plain);
  RopeAngles(1234, 4, 10000.0f, ones, with_ones);
  EXPECT_EQ(std::memcmp(plain, with_ones, sizeof(plain)), 0);
}

TEST(AddBiasTest, AddsTheVectorToEveryRow) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const float b[] = {0.5f, -1.0f, 10.0f};
  AddBias(x.data(), b, 2, 3);
  EXPECT_EQ(x, (std::vector<float>{1.5f, 1, 13, 4.5f, 4, 16}));
}

}  // namespace
}  // namespace tandem::model::internal
