// The F32 panel GEMM (f32_panels.h): every ISA this CPU runs gives exactly
// the bits of a scalar std::fma chain in index order (the reference written
// here, not the kernel's code), for tile edges in rows and columns, K across
// block edges, any split of the panels and any thread count; a row's bits do
// not depend on the batch; the packing puts W[o][k] where the header says.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/model/cpu_kernels.h"
#include "engine/model/f32_panels.h"
#include "engine/model/thread_pool.h"
#include "gtest/gtest.h"

namespace tandem::model::internal {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// y[r][o] = fma chain over k of x[r][k] * w[o][k], from 0.
std::vector<float> FmaChain(const std::vector<float>& x, const std::vector<float>& w,
                            size_t rows, size_t in, size_t out) {
  std::vector<float> y(rows * out);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t o = 0; o < out; ++o) {
      float acc = 0.0f;
      for (size_t k = 0; k < in; ++k) acc = std::fma(x[r * in + k], w[o * in + k], acc);
      y[r * out + o] = acc;
    }
  }
  return y;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<KernelIsaKind> SupportedIsas() {
  std::vector<KernelIsaKind> isas;
  for (KernelIsaKind isa : {KernelIsaKind::kGeneric, KernelIsaKind::kAvx2, KernelIsaKind::kAvx512}) {
    if (KernelIsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

TEST(F32PanelMatrixTest, PacksEachColumnIntoItsPanelAndZeroPadsTheLast) {
  const size_t in = 5, out = 19;  // two panels, the second with 3 columns
  const std::vector<float> w = Random(in * out, 1);
  std::unique_ptr<F32PanelMatrix> m = F32PanelMatrix::Pack(WeightMatrix::F32(w.data(), in, out));
  ASSERT_EQ(m->panels(), 2u);
  EXPECT_EQ(m->in(), in);
  EXPECT_EQ(m->out(), out);
  for (size_t p = 0; p < 2; ++p) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m->Panel(p)) % 64, 0u);
    for (size_t k = 0; k < in; ++k) {
      for (size_t c = 0; c < 16; ++c) {
        const size_t o = 16 * p + c;
        EXPECT_EQ(m->Panel(p)[16 * k + c], o < out ? w[o * in + k] : 0.0f)
            << "panel " << p << " k " << k << " column " << c;
      }
    }
  }
}

// Every ISA equals the reference chain bit for bit, over shapes that cut
// the tiles (rows not a multiple of 6 or 8, a partial last panel, a panel
// count not a multiple of 3) and the K blocks (in = 1, kPanelKBlock - 1,
// kPanelKBlock + 1, several blocks).
TEST(F32PanelGemmTest, EveryIsaEqualsTheFmaChainExactly) {
  const size_t ins[] = {1, 7, kPanelKBlock - 1, kPanelKBlock, kPanelKBlock + 1,
                        2 * kPanelKBlock + 37};
  const size_t outs[] = {1, 16, 17, 40, 64, 100};
  const size_t rows_list[] = {1, 2, 5, 6, 7, 8, 9, 13, 17};
  for (KernelIsaKind isa : SupportedIsas()) {
    for (size_t in : ins) {
      for (size_t out : outs) {
        const std::vector<float> w = Random(in * out, static_cast<uint32_t>(in * 131 + out));
        std::unique_ptr<F32PanelMatrix> m =
            F32PanelMatrix::Pack(WeightMatrix::F32(w.data(), in, out));
        for (size_t rows : rows_list) {
          const std::vector<float> x = Random(rows * in, static_cast<uint32_t>(rows + 7));
          std::vector<float> y(rows * out, std::nanf(""));
          MatMulF32PanelsWithIsa(isa, x.data(), *m, rows, y.data(), nullptr, 0);
          EXPECT_TRUE(SameBits(y, FmaChain(x, w, rows, in, out)))
              << KernelIsaName(isa) << " rows " << rows << " in " << in << " out " << out;
        }
      }
    }
  }
}

// Rows past one row block (kPanelRowBlockBytes of x: 16-21 rows at in =
// 6000, by ISA) give the same chains: two full blocks and a partial one.
TEST(F32PanelGemmTest, RowsAcrossRowBlocksEqualTheFmaChainExactly) {
  const size_t in = 6000, out = 40, rows = 45;
  ASSERT_LT(kPanelRowBlockBytes / (in * sizeof(float)) * 2, rows);
  const std::vector<float> w = Random(out * in, 8);
  const auto m = F32PanelMatrix::Pack(WeightMatrix::F32(w.data(), in, out));
  const std::vector<float> x = Random(rows * in, 9);
  const std::vector<float> want = FmaChain(x, w, rows, in, out);
  for (KernelIsaKind isa : SupportedIsas()) {
    std::vector<float> y(rows * out, std::nanf(""));
    MatMulF32PanelsWithIsa(isa, x.data(), *m, rows, y.data(), nullptr, 0);
    EXPECT_TRUE(SameBits(y, want)) << KernelIsaName(isa);
  }
}

// A row's bits do not depend on the rows beside it, on which panels a call
// covers, or on the threads (whole panels per thread).
TEST(F32PanelGemmTest, RowBitsDoNotDependOnBatchRangeOrThreads) {
  const size_t in = 300, out = 200, rows = 23;
  const std::vector<float> w = Random(in * out, 3);
  const std::vector<float> x = Random(rows * in, 4);
  std::unique_ptr<F32PanelMatrix> m = F32PanelMatrix::Pack(WeightMatrix::F32(w.data(), in, out));
  const std::vector<float> want = FmaChain(x, w, rows, in, out);
  ThreadPool pool(2);
  for (KernelIsaKind isa : SupportedIsas()) {
    std::vector<float> batched(rows * out);
    MatMulF32PanelsWithIsa(isa, x.data(), *m, rows, batched.data(), &pool, 0);
    EXPECT_TRUE(SameBits(batched, want)) << KernelIsaName(isa) << " on 2 threads";
    for (size_t r = 0; r < rows; ++r) {
      std::vector<float> alone(out);
      MatMulF32PanelsWithIsa(isa, x.data() + r * in, *m, 1, alone.data(), nullptr, 0);
      EXPECT_EQ(std::memcmp(alone.data(), want.data() + r * out, out * sizeof(float)), 0)
          << KernelIsaName(isa) << " row " << r << " alone";
    }
    // Panels [0, 5) then [5, 13): the columns of each call and nothing else.
    std::vector<float> split(rows * out, -1.0f);
    MatMulF32PanelsRangeWithIsa(isa, x.data(), *m, rows, 0, 5, split.data());
    for (size_t r = 0; r < rows; ++r) {
      EXPECT_EQ(split[r * out + 80], -1.0f) << "column 80 belongs to panel 5";
    }
    MatMulF32PanelsRangeWithIsa(isa, x.data(), *m, rows, 5, m->panels(), split.data());
    EXPECT_TRUE(SameBits(split, want)) << KernelIsaName(isa) << " split at panel 5";
  }
}

// MatMul takes the panel GEMM when the WeightMatrix carries the packing,
// and the dot-product kernels (their own order) when it does not.
TEST(F32PanelGemmTest, MatMulRunsThePackingWhenTheMatrixHasOne) {
  const size_t in = 96, out = 40, rows = 3;
  const std::vector<float> w = Random(in * out, 5);
  const std::vector<float> x = Random(rows * in, 6);
  std::unique_ptr<F32PanelMatrix> m = F32PanelMatrix::Pack(WeightMatrix::F32(w.data(), in, out));
  WeightMatrix packed = WeightMatrix::F32(w.data(), in, out);
  packed.f32_panels = m.get();
  std::vector<float> y(rows * out);
  MatMul(x.data(), packed, rows, y.data(), nullptr);
  EXPECT_TRUE(SameBits(y, FmaChain(x, w, rows, in, out)));
}

}  // namespace
}  // namespace tandem::model::internal
