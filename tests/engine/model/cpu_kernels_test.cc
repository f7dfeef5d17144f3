// Batch-invariant kernels (DESIGN.md, Engine): Dot follows its documented
// summation order, and a MatMul row is bit-identical whatever the batch
// size (M = 1, 3, 4, 17, 64) and however many threads split the columns.
#include "engine/model/cpu_kernels.h"

#include <cmath>
#include <cstring>
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
      const float want = (o >= 1 && o < 3) ? Dot(&w[o * in], &x[r * in], in) : 7.0f;
      EXPECT_EQ(std::memcmp(&y[r * out + o], &want, sizeof(float)), 0) << r << "," << o;
    }
  }
}

}  // namespace
}  // namespace tandem::model::internal
