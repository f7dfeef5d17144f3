#include "engine/model/f32_panels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/model/tile_dispatch.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_PANELS_X86 1
#endif

namespace tandem::model::internal {
namespace {

constexpr size_t kCols = F32PanelMatrix::kPanelCols;

// What every tile reads: x [rows][in], the panels, y [rows][out], and the
// K block [k0, k1) (k0 == 0: the chains start at 0, else they continue
// from y).
struct Args {
  const float* x;
  const F32PanelMatrix* w;
  size_t in, out;
  float* y;
  size_t k0, k1;
  // Valid columns of panel p (16 but in the last panel).
  int Cols(size_t p) const { return static_cast<int>(std::min(kCols, out - p * kCols)); }
};

struct GenericIsa {
  static constexpr int kRows = 1;
  static constexpr int kPanels = 1;
  template <int R, int C>
  static void Tile(const Args& a, size_t r0, size_t p0) {
    for (int r = 0; r < R; ++r) {
      const float* x = a.x + (r0 + r) * a.in;
      for (int c = 0; c < C; ++c) {
        const float* panel = a.w->Panel(p0 + c);
        float* y = a.y + (r0 + r) * a.out + (p0 + c) * kCols;
        for (int col = 0; col < a.Cols(p0 + c); ++col) {
          float acc = a.k0 == 0 ? 0.0f : y[col];
          for (size_t k = a.k0; k < a.k1; ++k) acc = std::fma(x[k], panel[k * kCols + col], acc);
          y[col] = acc;
        }
      }
    }
  }
};

#ifdef TANDEM_PANELS_X86
// 8 rows x 3 panels: 24 accumulators + 3 panel vectors + 1 broadcast of
// the 32 zmm registers; per step of k, 3 loads and 8 broadcasts feed 24
// FMAs.
struct Avx512Isa {
  static constexpr int kRows = 8;
  static constexpr int kPanels = 3;
  template <int R, int C>
  __attribute__((target("avx512f,fma"))) static void Tile(const Args& a, size_t r0, size_t p0) {
    __m512 acc[R][C];
    __mmask16 mask[C];
    for (int c = 0; c < C; ++c) mask[c] = static_cast<__mmask16>((1u << a.Cols(p0 + c)) - 1);
    float* y = a.y + r0 * a.out + p0 * kCols;
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        acc[r][c] = a.k0 == 0 ? _mm512_setzero_ps()
                              : _mm512_maskz_loadu_ps(mask[c], y + r * a.out + c * kCols);
      }
    }
    const float* panel[C];
    for (int c = 0; c < C; ++c) panel[c] = a.w->Panel(p0 + c);
    const float* x = a.x + r0 * a.in;
    const size_t in = a.in;
    for (size_t k = a.k0; k < a.k1; ++k) {
      __m512 wv[C];
      for (int c = 0; c < C; ++c) wv[c] = _mm512_load_ps(panel[c] + k * kCols);
      for (int r = 0; r < R; ++r) {
        const __m512 xb = _mm512_set1_ps(x[r * in + k]);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xb, wv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        _mm512_mask_storeu_ps(y + r * a.out + c * kCols, mask[c], acc[r][c]);
      }
    }
  }
};

// 6 rows x 1 panel (two ymm halves): 12 accumulators + 2 panel vectors + 1
// broadcast of the 16 ymm registers.
struct Avx2Isa {
  static constexpr int kRows = 6;
  static constexpr int kPanels = 1;
  template <int R, int C>
  __attribute__((target("avx2,fma"))) static void Tile(const Args& a, size_t r0, size_t p0) {
    static_assert(C == 1);
    const int cols = a.Cols(p0);
    float* y = a.y + r0 * a.out + p0 * kCols;
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) {
      alignas(32) float start[kCols] = {};
      if (a.k0 != 0) std::memcpy(start, y + r * a.out, cols * sizeof(float));
      acc[r][0] = _mm256_load_ps(start);
      acc[r][1] = _mm256_load_ps(start + 8);
    }
    const float* panel = a.w->Panel(p0);
    const float* x = a.x + r0 * a.in;
    const size_t in = a.in;
    for (size_t k = a.k0; k < a.k1; ++k) {
      const __m256 w0 = _mm256_load_ps(panel + k * kCols);
      const __m256 w1 = _mm256_load_ps(panel + k * kCols + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 xb = _mm256_set1_ps(x[r * in + k]);
        acc[r][0] = _mm256_fmadd_ps(xb, w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(xb, w1, acc[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      alignas(32) float done[kCols];
      _mm256_store_ps(done, acc[r][0]);
      _mm256_store_ps(done + 8, acc[r][1]);
      std::memcpy(y + r * a.out, done, cols * sizeof(float));
    }
  }
};
#endif  // TANDEM_PANELS_X86

// Row blocks outer (kPanelRowBlockBytes of x each, so they stay in L2
// instead of every panel group re-reading all of x from L3), then panels,
// K blocks in increasing k, rows inner: a block of kPanels panels x
// kPanelKBlock steps (24 KiB on AVX-512) stays in L1 while every row of
// the row block passes over it. Each element's chain still runs over the K
// blocks in increasing k.
template <typename Isa>
void Panels(Args a, size_t rows, size_t p_begin, size_t p_end) {
  const size_t block_rows =
      std::max<size_t>(1, kPanelRowBlockBytes / (a.in * sizeof(float)) / Isa::kRows) * Isa::kRows;
  for (size_t r_begin = 0; r_begin < rows; r_begin += block_rows) {
    const size_t r_end = std::min(rows, r_begin + block_rows);
    for (size_t p = p_begin; p < p_end; p += Isa::kPanels) {
      const int nc = static_cast<int>(std::min<size_t>(Isa::kPanels, p_end - p));
      for (a.k0 = 0; a.k0 < a.in; a.k0 = a.k1) {
        a.k1 = std::min(a.in, a.k0 + kPanelKBlock);
        for (size_t r = r_begin; r < r_end; r += Isa::kRows) {
          const int nr = static_cast<int>(std::min<size_t>(Isa::kRows, r_end - r));
          RunTile<Isa, Isa::kRows, Isa::kPanels>(nr, nc, a, r, p);
        }
      }
    }
  }
}

}  // namespace

std::unique_ptr<F32PanelMatrix> F32PanelMatrix::Pack(const WeightMatrix& w) {
  auto m = std::unique_ptr<F32PanelMatrix>(new F32PanelMatrix());
  m->in_ = w.in;
  m->out_ = w.out;
  const size_t floats = std::max<size_t>(1, m->panels() * w.in) * kCols;
  m->data_.reset(static_cast<float*>(std::aligned_alloc(64, floats * sizeof(float))));
  std::memset(m->data_.get(), 0, floats * sizeof(float));
  const float* src = reinterpret_cast<const float*>(w.data);
  for (size_t o = 0; o < w.out; ++o) {
    float* panel = m->data_.get() + (o / kCols) * w.in * kCols + o % kCols;
    const float* row = src + o * w.in;
    for (size_t k = 0; k < w.in; ++k) panel[k * kCols] = row[k];
  }
  return m;
}

void MatMulF32PanelsRangeWithIsa(KernelIsaKind isa, const float* x, const F32PanelMatrix& w,
                                 size_t rows, size_t p_begin, size_t p_end, float* y) {
  if (w.in() == 0) {  // an empty sum
    for (size_t r = 0; r < rows; ++r) {
      const size_t o_end = std::min(w.out(), p_end * kCols);
      for (size_t o = p_begin * kCols; o < o_end; ++o) y[r * w.out() + o] = 0.0f;
    }
    return;
  }
  const Args a{x, &w, w.in(), w.out(), y, 0, 0};
  switch (KernelIsaSupported(isa) ? isa : KernelIsaKind::kGeneric) {
#ifdef TANDEM_PANELS_X86
    case KernelIsaKind::kAvx512:
      return Panels<Avx512Isa>(a, rows, p_begin, p_end);
    case KernelIsaKind::kAvx2:
      return Panels<Avx2Isa>(a, rows, p_begin, p_end);
#endif
    default:
      return Panels<GenericIsa>(a, rows, p_begin, p_end);
  }
}

void MatMulF32PanelsWithIsa(KernelIsaKind isa, const float* x, const F32PanelMatrix& w, size_t rows,
                            float* y, ThreadPool* pool, size_t min_work) {
  MaybeParallelFor(pool, w.panels(), rows * w.in() * w.out(), min_work,
                   [&](size_t begin, size_t end) {
                     MatMulF32PanelsRangeWithIsa(isa, x, w, rows, begin, end, y);
                   });
}

void MatMulF32Panels(const float* x, const F32PanelMatrix& w, size_t rows, float* y,
                     ThreadPool* pool, size_t min_work) {
  MatMulF32PanelsWithIsa(ActiveKernelIsa(), x, w, rows, y, pool, min_work);
}

}  // namespace tandem::model::internal
