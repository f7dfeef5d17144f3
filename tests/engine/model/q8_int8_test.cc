// The int8 Q8_0 path (q8_int8.h): activation quantization equals ggml's
// quantize_row_q8_0_ref (tools/quantize.h's transcription, which
// tests/tools/quantize_test.cc checks against llama-quantize's bytes, and
// hand-computed ties); every ISA this CPU runs gives the generic path's
// bits for every row count, column count and thread split; the generic
// path equals a scalar transcription of ggml's vec_dot_q8_0_q8_0 over the
// GGUF bytes, a double-precision reference, and the exact product within
// the quantization bound; weights of -128 are exact.
#include "engine/model/q8_int8.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/gguf/half.h"
#include "engine/model/cpu_kernels.h"
#include "engine/model/quant_blocks.h"
#include "engine/model/thread_pool.h"
#include "gtest/gtest.h"
#include "tools/quantize.h"

namespace tandem::model::internal {
namespace {

using gguf::TensorType;

// Q8_0 rows of `in` weights, `out` rows: random q in [-128, 127] (-128
// included) and scales d in [2^-10, 2^-4).
std::vector<uint8_t> RandomQ8(size_t in, size_t out, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> q(-128, 127);
  std::uniform_real_distribution<float> d(1.0f / 1024, 1.0f / 16);
  std::vector<uint8_t> bytes(out * in / 32 * 34);
  for (size_t b = 0; b < bytes.size() / 34; ++b) {
    const uint16_t h = gguf::FloatToHalf(d(rng));
    std::memcpy(&bytes[34 * b], &h, 2);
    for (size_t k = 0; k < 32; ++k) bytes[34 * b + 2 + k] = static_cast<uint8_t>(q(rng));
  }
  return bytes;
}

std::vector<float> RandomActivations(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> x(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& e : v) e = x(rng);
  // A few blocks of other magnitudes: all zero, tiny, large.
  if (n >= 128) {
    for (size_t k = 0; k < 32; ++k) v[32 + k] = 0.0f;
    for (size_t k = 0; k < 32; ++k) v[64 + k] *= 1e-20f;
    for (size_t k = 0; k < 32; ++k) v[96 + k] *= 1e4f;
  }
  return v;
}

// The activations as ggml's quantize_row_q8_0_ref blocks (tools' transcription).
std::vector<uint8_t> RefBlocks(const std::vector<float>& x) {
  std::vector<uint8_t> blocks(x.size() / 32 * 34);
  cli::QuantizeRowQ8_0(x.data(), x.size(), blocks.data());
  return blocks;
}

// ggml's generic ggml_vec_dot_q8_0_q8_0 over two rows of GGUF blocks.
float VecDotQ8(const uint8_t* w, const uint8_t* x, size_t nb) {
  float sumf = 0.0f;
  for (size_t b = 0; b < nb; ++b) {
    int sumi = 0;
    for (size_t k = 0; k < 32; ++k) {
      sumi += static_cast<int8_t>(w[34 * b + 2 + k]) * static_cast<int8_t>(x[34 * b + 2 + k]);
    }
    sumf += static_cast<float>(sumi) * (LoadF16(w + 34 * b) * LoadF16(x + 34 * b));
  }
  return sumf;
}

TEST(Q8Int8Test, QuantizationEqualsGgmlRef) {
  std::vector<float> x = RandomActivations(32 * 40, 7);
  // Ties of x * id = k + 0.5 (amax 127: d = 1, id = 1), +-amax, a zero
  // block, tiny values, one huge value beside small ones.
  for (int j = 0; j < 32; ++j) x[j] = (j == 0 ? 127.0f : static_cast<float>(j) - 15.5f);
  for (int j = 0; j < 32; ++j) x[32 * 5 + j] = (j % 2 ? -1.0f : 1.0f) * 3.0f;
  for (int j = 0; j < 32; ++j) x[32 * 6 + j] = 1e-30f * static_cast<float>(j - 16);
  for (int j = 0; j < 32; ++j) x[32 * 7 + j] = j == 3 ? 6e4f : 0.001f * static_cast<float>(j);
  std::vector<int8_t> q(x.size());
  std::vector<float> d(x.size() / 32);
  QuantizeActivationRow(x.data(), x.size(), q.data(), d.data());
  const std::vector<uint8_t> ref = RefBlocks(x);
  for (size_t b = 0; b < d.size(); ++b) {
    const uint16_t h = LoadU16(&ref[34 * b]);
    EXPECT_EQ(gguf::FloatToHalf(d[b]), h) << "block " << b;
    EXPECT_EQ(d[b], gguf::HalfToFloat(h)) << "block " << b;
    EXPECT_EQ(std::memcmp(&q[32 * b], &ref[34 * b + 2], 32), 0) << "block " << b;
  }
  // roundf rounds ties away from zero: -15.5 -> -16, -0.5 -> -1, 0.5 -> 1,
  // 2.5 -> 3 (ties to even would give -16, -0, 0, 2).
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -15);  // 1 - 15.5 = -14.5 -> -15
  EXPECT_EQ(q[15], -1);  // -0.5
  EXPECT_EQ(q[16], 1);   // 0.5
  EXPECT_EQ(q[18], 3);   // 2.5
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(q[32 * 5], 127);
  EXPECT_EQ(q[32 * 5 + 1], -127);
  EXPECT_EQ(d[1], 0.0f);  // the zero block of RandomActivations
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[32 + j], 0);
}

// The AVX-512 quantizer (when this CPU has it) gives the scalar path's
// bytes: random blocks of many magnitudes, ties k + 0.5 at many scales, and
// a block so small that id overflows (q 0 on both paths, d 0).
TEST(Q8Int8Test, VectorQuantizationEqualsScalar) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30), k(-127, 126);
  std::vector<float> x(32 * 2000);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float scale = std::ldexp(1.0f, exponent(rng));
    for (size_t j = 0; j < 32; ++j) x[32 * b + j] = normal(rng) * scale;
    if (b % 3 == 0) {  // amax 127 * scale: d = scale, ties at (k + 0.5) * scale
      x[32 * b] = 127.0f * scale;
      for (size_t j = 1; j < 32; ++j) x[32 * b + j] = (static_cast<float>(k(rng)) + 0.5f) * scale;
    }
  }
  for (size_t j = 0; j < 32; ++j) x[j] = 1e-40f * static_cast<float>(j % 3);
  std::vector<int8_t> qv(x.size()), qs(x.size());
  std::vector<float> dv(x.size() / 32), ds(x.size() / 32);
  QuantizeActivationRow(x.data(), x.size(), qv.data(), dv.data());
  QuantizeActivationRowGeneric(x.data(), x.size(), qs.data(), ds.data());
  EXPECT_EQ(std::memcmp(qv.data(), qs.data(), qv.size()), 0);
  EXPECT_EQ(std::memcmp(dv.data(), ds.data(), dv.size() * 4), 0);
  for (size_t j = 0; j < 32; ++j) EXPECT_EQ(qv[j], 0);
  EXPECT_EQ(dv[0], 0.0f);
}

// Per-case data: a Q8_0 matrix, its packing, and `rows` activation rows.
struct Case {
  size_t in, out, rows;
  std::vector<uint8_t> w_bytes;
  WeightMatrix w;
  std::unique_ptr<Q8Int8Matrix> packed;
  std::vector<float> x;
  std::vector<int8_t> q;
  std::vector<float> d;

  Case(size_t in_, size_t out_, size_t rows_, uint32_t seed)
      : in(in_), out(out_), rows(rows_), w_bytes(RandomQ8(in_, out_, seed)) {
    w = WeightMatrix{TensorType::kQ8_0, w_bytes.data(), in, out};
    packed = Q8Int8Matrix::Pack(w);
    x = RandomActivations(rows * in, seed + 1);
    q.resize(rows * in);
    d.resize(rows * in / 32);
    for (size_t r = 0; r < rows; ++r) {
      QuantizeActivationRow(&x[r * in], in, &q[r * in], &d[r * in / 32]);
    }
  }

  std::vector<float> Run(Int8IsaKind isa, size_t n_rows) const {
    std::vector<float> y(n_rows * out, -1.0f);
    MatMulInt8GroupsWithIsa(isa, q.data(), d.data(), *packed, n_rows, 0, packed->groups(),
                            y.data());
    return y;
  }
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(Q8Int8Test, GenericEqualsGgmlVecDot) {
  for (size_t out : {1, 17, 33}) {
    Case c(128, out, 5, 11 + static_cast<uint32_t>(out));
    const std::vector<float> y = c.Run(Int8IsaKind::kGeneric, c.rows);
    for (size_t r = 0; r < c.rows; ++r) {
      const std::vector<uint8_t> xb =
          RefBlocks(std::vector<float>(c.x.begin() + r * c.in, c.x.begin() + (r + 1) * c.in));
      for (size_t o = 0; o < out; ++o) {
        const float want = VecDotQ8(&c.w_bytes[o * c.in / 32 * 34], xb.data(), c.in / 32);
        EXPECT_EQ(std::memcmp(&y[r * out + o], &want, 4), 0)
            << "r " << r << " o " << o << ": " << y[r * out + o] << " vs " << want;
      }
    }
  }
}

// One ISA per instance; an ISA this CPU lacks is skipped.
class Q8Int8IsaTest : public ::testing::TestWithParam<Int8IsaKind> {
 protected:
  void SetUp() override {
    if (!Int8IsaSupported(GetParam())) {
      GTEST_SKIP() << "this CPU lacks " << Int8IsaName(GetParam());
    }
  }
};

INSTANTIATE_TEST_SUITE_P(AllIsas, Q8Int8IsaTest,
                         ::testing::Values(Int8IsaKind::kGeneric, Int8IsaKind::kAvx2,
                                           Int8IsaKind::kAvxVnni, Int8IsaKind::kAvx512Vnni),
                         [](const ::testing::TestParamInfo<Int8IsaKind>& info) {
                           return std::string(Int8IsaName(info.param));
                         });

// Rows 1..70 (every register-tile edge), column counts around the
// 16-column groups, 1, 3 and 8 blocks: the generic path's bits.
TEST_P(Q8Int8IsaTest, EqualsGenericForRowsColumnsAndBlocks) {
  const Int8IsaKind isa = GetParam();
  for (size_t in : {32, 96, 256}) {
    for (size_t out : {1, 15, 16, 17, 31, 33, 47, 64, 70}) {
      Case c(in, out, 70, static_cast<uint32_t>(in * 131 + out));
      const std::vector<float> all = c.Run(Int8IsaKind::kGeneric, 70);
      for (size_t rows = 1; rows <= 70; ++rows) {
        const std::vector<float> y = c.Run(isa, rows);
        ASSERT_TRUE(SameBits(y, std::vector<float>(all.begin(), all.begin() + rows * out)))
            << "in " << in << " out " << out << " rows " << rows;
      }
    }
  }
}

TEST_P(Q8Int8IsaTest, ColumnRangesAndThreadsGiveTheSameBits) {
  const Int8IsaKind isa = GetParam();
  Case c(96, 70, 9, 5);
  ThreadPool pool(2);
  const std::vector<float> whole = c.Run(isa, c.rows);
  EXPECT_TRUE(SameBits(whole, c.Run(Int8IsaKind::kGeneric, c.rows)));
  // Group by group.
  std::vector<float> parts(c.rows * c.out, -1.0f);
  for (size_t g = 0; g < c.packed->groups(); ++g) {
    MatMulInt8GroupsWithIsa(isa, c.q.data(), c.d.data(), *c.packed, c.rows, g, g + 1,
                            parts.data());
  }
  EXPECT_TRUE(SameBits(parts, whole));
  // From float activations, 1 and 2 threads (every kernel split).
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    std::vector<float> y(c.rows * c.out);
    MatMulInt8WithIsa(isa, c.x.data(), *c.packed, c.rows, y.data(), p, 0);
    EXPECT_TRUE(SameBits(y, whole)) << (p ? "2 threads" : "1 thread");
  }
}

// Against double precision: the same quantized values summed exactly in
// double, within 1e-6 of the sum of the terms' magnitudes (each float
// operation is within 2^-24 relative; at most 3 per block); and against the
// exact product W x in double within the quantization bound: per element,
// |x - q * d16| <= d / 2 + 127 * d * 2^-11 (rounding to the grid, then d's
// F16 rounding), so |error| <= sum_k |w_k| * 0.5625 * d_block(k), plus 1e-6
// relative.
TEST(Q8Int8Test, MatchesDoublePrecisionReferences) {
  Case c(256, 40, 6, 23);
  const std::vector<float> y = c.Run(BestInt8Isa(), c.rows);
  std::vector<float> wf(c.in * c.out);
  DequantizeRows(c.w, 0, c.out, wf.data());
  const size_t nb = c.in / 32;
  double worst_rel = 0, worst_bound_share = 0;
  for (size_t r = 0; r < c.rows; ++r) {
    for (size_t o = 0; o < c.out; ++o) {
      double same = 0, mag = 0, exact = 0, bound = 0;
      for (size_t b = 0; b < nb; ++b) {
        const uint8_t* wb = &c.w_bytes[(o * nb + b) * 34];
        long sumi = 0;
        for (size_t k = 0; k < 32; ++k) {
          sumi += static_cast<long>(static_cast<int8_t>(wb[2 + k])) * c.q[r * c.in + 32 * b + k];
        }
        const double term = static_cast<double>(sumi) * LoadF16(wb) * c.d[r * nb + b];
        same += term;
        mag += std::fabs(term);
        double amax = 0;
        for (size_t k = 0; k < 32; ++k) {
          amax = std::max(amax, std::fabs(static_cast<double>(c.x[r * c.in + 32 * b + k])));
        }
        for (size_t k = 0; k < 32; ++k) {
          const double wk = wf[o * c.in + 32 * b + k];
          exact += wk * c.x[r * c.in + 32 * b + k];
          bound += std::fabs(wk) * 0.5625 * (amax / 127);
        }
      }
      const double got = y[r * c.out + o];
      EXPECT_LE(std::fabs(got - same), 1e-6 * mag + 1e-30) << r << " " << o;
      EXPECT_LE(std::fabs(got - exact), bound + 1e-6 * mag + 1e-30) << r << " " << o;
      if (mag > 0) worst_rel = std::max(worst_rel, std::fabs(got - same) / mag);
      if (bound > 0) {
        worst_bound_share = std::max(worst_bound_share, std::fabs(got - exact) / bound);
      }
    }
  }
  std::printf("int8 vs double of the same values: worst %.3g of sum|terms|; vs exact W x: "
              "worst %.3g of the quantization bound\n",
              worst_rel, worst_bound_share);
}

// Weights of -128 (a file may hold them; the quantizer never writes them)
// against the extreme activations +-127, on every ISA: maddubs' pairs reach
// 2 * 128 * 127 = 32512 < 32767, vpdpbusd's offset sums stay in int32.
TEST_P(Q8Int8IsaTest, MinusOneTwentyEightWeightsAreExact) {
  const size_t in = 64, out = 17, rows = 3;
  std::vector<uint8_t> bytes(out * 2 * 34);
  for (size_t b = 0; b < out * 2; ++b) {
    const uint16_t one = 0x3C00;  // F16 1.0
    std::memcpy(&bytes[34 * b], &one, 2);
    for (size_t k = 0; k < 32; ++k) bytes[34 * b + 2 + k] = 0x80;  // -128
  }
  const WeightMatrix w{TensorType::kQ8_0, bytes.data(), in, out};
  std::unique_ptr<Q8Int8Matrix> packed = Q8Int8Matrix::Pack(w);
  // Row 0: all +1 (q = 127), row 1: all -1 (q = -127), row 2: alternating.
  std::vector<float> x(rows * in);
  for (size_t k = 0; k < in; ++k) {
    x[k] = 1.0f;
    x[in + k] = -1.0f;
    x[2 * in + k] = k % 2 ? -1.0f : 1.0f;
  }
  const float dx = gguf::HalfToFloat(gguf::FloatToHalf(1.0f / 127.0f));
  const float block0 = static_cast<float>(32 * -128 * 127) * (1.0f * dx);
  const float want[3] = {0.0f + block0 + block0, 0.0f - block0 - block0, 0.0f};
  std::vector<float> y(rows * out);
  MatMulInt8WithIsa(GetParam(), x.data(), *packed, rows, y.data(), nullptr, 0);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t o = 0; o < out; ++o) EXPECT_EQ(y[r * out + o], want[r]) << "r " << r << " o " << o;
  }
}

// MatMul takes the int8 path exactly when the view points at a packing.
TEST(Q8Int8Test, MatMulDispatchesOnTheViewsPacking) {
  Case c(64, 20, 4, 3);
  std::vector<float> exact(c.rows * c.out), int8(c.rows * c.out), direct(c.rows * c.out);
  MatMul(c.x.data(), c.w, c.rows, exact.data());
  WeightMatrix view = c.w;
  view.int8 = c.packed.get();
  MatMul(c.x.data(), view, c.rows, int8.data());
  MatMulInt8(c.x.data(), *c.packed, c.rows, direct.data(), nullptr, 0);
  EXPECT_TRUE(SameBits(int8, direct));
  EXPECT_FALSE(SameBits(int8, exact));
}

}  // namespace
}  // namespace tandem::model::internal
