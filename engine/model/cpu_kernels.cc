#include "engine/model/cpu_kernels.h"

#include "engine/model/f32_panels.h"
#include "engine/model/q8_int8.h"
#include "engine/model/quant_loads.h"
#include "engine/model/tile_dispatch.h"
#include "engine/model/weight_loads.h"

#include <atomic>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_KERNELS_X86 1
#endif

namespace tandem::model::internal {
namespace {

// Weight rows as the micro-kernels read them: column c of a tile is row
// o + c of W. Every source yields exactly the matrix's F32 values
// (weight_matrix.h), so a tile's bits do not depend on which one feeds it.
struct F32Rows {
  const float* w;  // row o
  size_t in;
  float At(int c, size_t i) const { return w[static_cast<size_t>(c) * in + i]; }
};

// Portable path: every element is one Dot, so its bits are Dot's.
struct GenericIsa {
  static constexpr int kRows = 1;
  static constexpr int kCols = 1;
  static constexpr bool kFusedDequant = false;
  template <int R, int C, typename Rows>  // F32Rows or F32Loads
  static void Tile(const float* x, const Rows& w, size_t in, size_t /*out*/, float* y) {
    static_assert(R == 1 && C == 1);
    *y = Dot(w.w, x, in);
  }
};

#ifdef TANDEM_KERNELS_X86
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) of the 8 lanes of `a`,
// the same combine as Dot.
TANDEM_AVX2 float Combine8(__m256 a) {
  const __m128 v = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 h = _mm_add_ps(v, _mm_movehl_ps(v, v));  // [v0 + v2, v1 + v3, ...]
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

// AVX2 + FMA: 8 lanes, each a chain of fused multiply-adds (see KernelIsa in
// cpu_kernels.h for the per-element order). 3 rows x 4 columns: 12
// accumulators + 3 inputs + 1 weight vector fit the 16 ymm registers.
struct Avx2Isa {
  static constexpr int kRows = 3;
  static constexpr int kCols = 4;
  static constexpr bool kFusedDequant = true;
  template <int R, int C, typename Rows>
  __attribute__((target("avx2,fma,f16c"))) static void Tile(const float* x, const Rows& w,
                                                            size_t in, size_t out, float* y) {
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    }
    const size_t n8 = in - in % 8;
    const Rows wl = w;  // in locals: every address stays in a register
    const float* xr[R];
    for (int r = 0; r < R; ++r) xr[r] = x + r * in;
    if constexpr (requires { Rows::kGroup; }) {
      // A quantized source: whole blocks (the loader checks rows are), a
      // block's scales unpacked once per column, groups of 32 outer and
      // columns inner (the same per-lane order as the loop below).
      for (size_t i = 0; i < n8; i += Rows::kBlock) {
        typename Rows::Context8 ctx[C];
        for (int c = 0; c < C; ++c) ctx[c] = wl.Prepare8(c, i);
        for (size_t e = i; e < i + Rows::kBlock; e += 32) {
          for (int c = 0; c < C; ++c) {
            __m256 wv[4];
            wl.LoadGroup8(c, e, ctx[c], wv);
            for (int k = 0; k < 4; ++k) {
              for (int r = 0; r < R; ++r) {
                acc[r][c] = _mm256_fmadd_ps(wv[k], _mm256_loadu_ps(xr[r] + e + 8 * k), acc[r][c]);
              }
            }
          }
        }
      }
    } else {
      for (size_t i = 0; i < n8; i += 8) {
        __m256 xv[R];
        for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(xr[r] + i);
        for (int c = 0; c < C; ++c) {
          const __m256 wv = wl.Load8(c, i);
          for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(wv, xv[r], acc[r][c]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        float sum = Combine8(acc[r][c]);
        for (size_t i = n8; i < in; ++i) sum += w.At(c, i) * x[r * in + i];
        y[r * out + c] = sum;
      }
    }
  }
};

// AVX-512F: 16 lanes of fused multiply-adds, lanes j and j + 8 added, then
// Combine8. 4 rows x 4 columns: 16 accumulators + 4 inputs + 1 weight
// vector of the 32 zmm registers.
struct Avx512Isa {
  static constexpr int kRows = 4;
  static constexpr int kCols = 6;
  static constexpr bool kFusedDequant = true;
  // acc[r][c] += W[c][i, i + 16) * x[r][i, i + 16), lane by lane.
  template <int R, int C, typename Rows>
  TANDEM_AVX512 static void Step(const float* const (&xr)[R], const Rows& w, size_t i,
                                 __m512 (&acc)[R][C]) {
    __m512 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm512_loadu_ps(xr[r] + i);
    for (int c = 0; c < C; ++c) {
      const __m512 wv = w.Load16(c, i);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(wv, xv[r], acc[r][c]);
    }
  }

  // The same FMAs as Step at i, i + 16, ..., i + kBlock - 16 for one block
  // of a quantized source (weight_loads.h): each lane's chain keeps its
  // order; the block's scales are widened once per column.
  template <int R, int C, typename Rows>
  TANDEM_AVX512 static void BlockStep(const float* const (&xr)[R], const Rows& w, size_t i,
                                      __m512 (&acc)[R][C]) {
    constexpr size_t kGroup = Rows::kGroup, kBlock = Rows::kBlock;
    constexpr int kVectors = static_cast<int>(kGroup / 16);
    typename Rows::Context ctx[C];
    for (int c = 0; c < C; ++c) ctx[c] = w.Prepare(c, i);
    // Groups outer, columns inner: the C accumulator chains interleave, so
    // a block's 16 dependent FMAs per column do not run back to back.
    for (size_t e = 0; e < kBlock; e += kGroup) {
      for (int c = 0; c < C; ++c) {
        __m512 wv[kVectors];
        w.LoadGroup16(c, i + e, ctx[c], wv);
        for (int g = 0; g < kVectors; ++g) {
          for (int r = 0; r < R; ++r) {
            acc[r][c] = _mm512_fmadd_ps(wv[g], _mm512_loadu_ps(xr[r] + i + e + 16 * g), acc[r][c]);
          }
        }
      }
    }
  }

  template <int R, int C, typename Rows>
  __attribute__((target("avx512f,avx2,fma,f16c"))) static void Tile(const float* x, const Rows& w,
                                                                    size_t in, size_t out,
                                                                    float* y) {
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    }
    const size_t n16 = in - in % 16;
    // Row pointers and the weight source in locals, so the loop keeps every
    // address in a register.
    const Rows wl = w;
    const float* xr[R];
    for (int r = 0; r < R; ++r) xr[r] = x + r * in;
    size_t i = 0;
    if constexpr (requires { Rows::kGroup; }) {
      // A quantized source: whole blocks (the loader checks rows are).
      for (; i < n16; i += Rows::kBlock) BlockStep<R, C>(xr, wl, i, acc);
    } else {
      for (; i + 32 <= n16; i += 32) {
        Step<R, C>(xr, wl, i, acc);
        Step<R, C>(xr, wl, i + 16, acc);
      }
      if (i < n16) Step<R, C>(xr, wl, i, acc);
    }
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        // Lanes 0..7 + lanes 8..15, in registers (GCC 12's 512-bit extract
        // intrinsics warn: -Wuninitialized on their pass-through operand).
        const __v16sf a = reinterpret_cast<__v16sf>(acc[r][c]);
        const __v8sf low = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7);
        const __v8sf high = __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
        float sum = Combine8(reinterpret_cast<__m256>(low + high));
        for (size_t i = n16; i < in; ++i) sum += w.At(c, i) * x[r * in + i];
        y[r * out + c] = sum;
      }
    }
  }
};
#endif  // TANDEM_KERNELS_X86

// F32 rows with the vector loads where there are vector kernels.
#ifdef TANDEM_KERNELS_X86
template <bool kPrefetch>
F32Loads<kPrefetch> F32Source(const float* w, size_t in, size_t ahead) {
  return F32Loads<kPrefetch>{w, in, ahead};
}
#else
template <bool kPrefetch>
F32Rows F32Source(const float* w, size_t in, size_t /*ahead*/) {
  return F32Rows{w, in};
}
#endif

// Column blocks outer, so a block of kCols weight rows stays in cache while
// every input row passes over it. `rows_at(o, nc)` gives the weight source
// of rows [o, o + nc).
template <typename Isa, typename RowsAt>
void Columns(const float* x, size_t rows, size_t in, size_t out, size_t o_begin, size_t o_end,
             float* y, RowsAt rows_at) {
  for (size_t o = o_begin; o < o_end; o += Isa::kCols) {
    const int nc = static_cast<int>(std::min<size_t>(Isa::kCols, o_end - o));
    const auto w = rows_at(o, nc);
    for (size_t r = 0; r < rows; r += Isa::kRows) {
      const int nr = static_cast<int>(std::min<size_t>(Isa::kRows, rows - r));
      RunTile<Isa, Isa::kRows, Isa::kCols>(nr, nc, x + r * in, w, in, out, y + r * out + o);
    }
  }
}

// Up to this many input rows (decode), the weights stream from memory once
// per MatMul: an F16 / Q8_0 matrix is widened inside the vector kernels as
// it is read, and every weight load prefetches the next column block.
// Above it (prefill), each block of kCols rows of a non-F32 matrix is
// dequantized once into a per-thread F32 panel that every input row then
// reads (BF16 always takes this path). All paths give the F32 conversion's
// values, hence the same bits.
constexpr size_t kFusedDequantMaxRows = 8;

template <typename Isa>
void ColumnsTiled(const float* x, const WeightMatrix& w, size_t rows, size_t o_begin, size_t o_end,
                  float* y) {
  const size_t in = w.in, out = w.out;
  if (w.type == gguf::TensorType::kF32) {
    const float* f = reinterpret_cast<const float*>(w.data);
    const size_t ahead = Isa::kCols * in * sizeof(float);
    if (rows <= kFusedDequantMaxRows) {
      return Columns<Isa>(x, rows, in, out, o_begin, o_end, y,
                          [&](size_t o, int) { return F32Source<true>(f + o * in, in, ahead); });
    }
    return Columns<Isa>(x, rows, in, out, o_begin, o_end, y,
                        [&](size_t o, int) { return F32Source<false>(f + o * in, in, 0); });
  }
#ifdef TANDEM_KERNELS_X86
  if constexpr (Isa::kFusedDequant) {
    if (rows <= kFusedDequantMaxRows) {
      const size_t row_bytes = w.RowBytes();
      const bool fused = WithWeightLoads(
          w.type, w.data, row_bytes, Isa::kCols * row_bytes, [&](const auto& source) {
            using Source = std::decay_t<decltype(source)>;
            Columns<Isa>(x, rows, in, out, o_begin, o_end, y, [&](size_t o, int) {
              Source at_o = source;
              at_o.w = w.data + o * row_bytes;
              return at_o;
            });
          });
      if (fused) return;
    }
  }
#endif
  thread_local std::vector<float> panel;
  if (panel.size() < Isa::kCols * in) panel.resize(Isa::kCols * in);
  Columns<Isa>(x, rows, in, out, o_begin, o_end, y, [&](size_t o, int nc) {
    DequantizeRows(w, o, static_cast<size_t>(nc), panel.data());
    return F32Source<false>(panel.data(), in, 0);
  });
}

KernelIsaKind DetectKernelIsa() {
#ifdef TANDEM_KERNELS_X86
  __builtin_cpu_init();
  // Every AVX2 / AVX-512 CPU has F16C; checked all the same (F16 loads).
  if (!__builtin_cpu_supports("f16c")) return KernelIsaKind::kGeneric;
  if (__builtin_cpu_supports("avx512f")) return KernelIsaKind::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return KernelIsaKind::kAvx2;
  }
#endif
  return KernelIsaKind::kGeneric;
}

}  // namespace

namespace {
std::atomic<int> g_pinned_isa{-1};  // PinKernelIsa's choice; -1 = best

KernelIsaKind BestKernelIsa() {
  static const KernelIsaKind isa = DetectKernelIsa();
  return isa;
}
}  // namespace

bool KernelIsaSupported(KernelIsaKind isa) {
  switch (isa) {
    case KernelIsaKind::kGeneric:
      return true;
    case KernelIsaKind::kAvx2:
      return BestKernelIsa() != KernelIsaKind::kGeneric;
    case KernelIsaKind::kAvx512:
      return BestKernelIsa() == KernelIsaKind::kAvx512;
  }
  return false;
}

KernelIsaKind ActiveKernelIsa() {
  static const KernelIsaKind isa = [] {
    const int pinned = g_pinned_isa.load();
    return pinned >= 0 ? static_cast<KernelIsaKind>(pinned) : BestKernelIsa();
  }();
  return isa;
}

bool PinKernelIsa(KernelIsaKind isa) {
  if (!KernelIsaSupported(isa)) return false;
  g_pinned_isa.store(static_cast<int>(isa));
  return ActiveKernelIsa() == isa;
}

const char* KernelIsaName(KernelIsaKind isa) {
  switch (isa) {
    case KernelIsaKind::kGeneric:
      return "generic";
    case KernelIsaKind::kAvx2:
      return "avx2";
    case KernelIsaKind::kAvx512:
      return "avx512";
  }
  return "generic";
}

const char* KernelIsa() { return KernelIsaName(ActiveKernelIsa()); }

void MatMulColumnsWithIsa(KernelIsaKind isa, const float* x, const WeightMatrix& w, size_t rows,
                          size_t o_begin, size_t o_end, float* y) {
  switch (KernelIsaSupported(isa) ? isa : KernelIsaKind::kGeneric) {
#ifdef TANDEM_KERNELS_X86
    case KernelIsaKind::kAvx512:
      return ColumnsTiled<Avx512Isa>(x, w, rows, o_begin, o_end, y);
    case KernelIsaKind::kAvx2:
      return ColumnsTiled<Avx2Isa>(x, w, rows, o_begin, o_end, y);
#endif
    default:
      return ColumnsTiled<GenericIsa>(x, w, rows, o_begin, o_end, y);
  }
}

void MatMulColumnsWithIsa(KernelIsaKind isa, const float* x, const float* w, size_t rows, size_t in,
                          size_t out, size_t o_begin, size_t o_end, float* y) {
  MatMulColumnsWithIsa(isa, x, WeightMatrix::F32(w, in, out), rows, o_begin, o_end, y);
}

void MatMulColumns(const float* x, const float* w, size_t rows, size_t in, size_t out,
                   size_t o_begin, size_t o_end, float* y) {
  MatMulColumnsWithIsa(ActiveKernelIsa(), x, w, rows, in, out, o_begin, o_end, y);
}

void MatMul(const float* x, const WeightMatrix& w, size_t rows, float* y, ThreadPool* pool,
            size_t min_work) {
  if (w.int8 != nullptr) return MatMulInt8(x, *w.int8, rows, y, pool, min_work);
  if (w.f32_panels != nullptr) return MatMulF32Panels(x, *w.f32_panels, rows, y, pool, min_work);
  const KernelIsaKind isa = ActiveKernelIsa();
  MaybeParallelFor(pool, w.out, rows * w.in * w.out, min_work, [&](size_t begin, size_t end) {
    MatMulColumnsWithIsa(isa, x, w, rows, begin, end, y);
  });
}

void MatMul(const float* x, const float* w, size_t rows, size_t in, size_t out, float* y,
            ThreadPool* pool, size_t min_work) {
  MatMul(x, WeightMatrix::F32(w, in, out), rows, y, pool, min_work);
}

void RmsNorm(const float* x, const float* weight, size_t rows, size_t n, float eps, float* y) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (size_t i = 0; i < n; ++i) yr[i] = (xr[i] * scale) * weight[i];
  }
}

void RopeAngles(int pos, size_t rope_dim, float freq_base, const float* freq_factors, float* cs) {
  for (size_t i = 0; 2 * i + 1 < rope_dim; ++i) {
    double theta = pos * std::pow(static_cast<double>(freq_base),
                                  -2.0 * static_cast<double>(i) / static_cast<double>(rope_dim));
    if (freq_factors != nullptr) theta /= static_cast<double>(freq_factors[i]);
    cs[2 * i] = static_cast<float>(std::cos(theta));
    cs[2 * i + 1] = static_cast<float>(std::sin(theta));
  }
}

void RopeApply(float* x, size_t n_heads, size_t head_dim, size_t rope_dim, const float* cs) {
  for (size_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * head_dim;
    for (size_t i = 0; 2 * i + 1 < rope_dim; ++i) {
      const float c = cs[2 * i], s = cs[2 * i + 1];
      const float x0 = xh[2 * i], x1 = xh[2 * i + 1];
      xh[2 * i] = x0 * c - x1 * s;
      xh[2 * i + 1] = x0 * s + x1 * c;
    }
  }
}

void RopeApplyNeox(float* x, size_t n_heads, size_t head_dim, size_t rope_dim, const float* cs) {
  const size_t half = rope_dim / 2;
  for (size_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * head_dim;
    for (size_t i = 0; i < half; ++i) {
      const float c = cs[2 * i], s = cs[2 * i + 1];
      const float x0 = xh[i], x1 = xh[i + half];
      xh[i] = x0 * c - x1 * s;
      xh[i + half] = x0 * s + x1 * c;
    }
  }
}

void AddBias(float* x, const float* b, size_t rows, size_t n) {
  for (size_t r = 0; r < rows; ++r) {
    for (size_t i = 0; i < n; ++i) x[r * n + i] += b[i];
  }
}

void SwiGlu(float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
}

void AddInPlace(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace tandem::model::internal
