#include "engine/model/q8_int8.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/model/quant_blocks.h"
#include "engine/model/tile_dispatch.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_INT8_X86 1
#endif

namespace tandem::model::internal {
namespace {

constexpr size_t kCols = Q8Int8Matrix::kGroupCols;
// How far ahead of the loads the AVX-512 tiles prefetch a group's weight
// stream (8 tiles; 2 and 4 KiB measured the same within noise), for
// calls of at most kMaxTileRows rows (one pass of AVX-512 row tiles).
constexpr size_t kPrefetchBytes = 4096;
constexpr size_t kMaxTileRows = 6;

// One quantized activation block as the kernels read it: its 32 q, the
// VNNI paths' int32 start -128 * sum(q) (vpdpbusd over the stored w + 128
// adds 128 * sum(q) to sum(q * w); starting there takes it back), and d.
// One row's blocks are consecutive, so a tile needs one pointer per row.
struct ActivationBlock {
  int8_t q[32];
  int32_t start;
  float d;
};
static_assert(sizeof(ActivationBlock) == 40);

// Fills a row's nb blocks from QuantizeActivationRow's q [32 nb] and d [nb].
void ToBlocks(const int8_t* q, const float* d, size_t nb, ActivationBlock* out) {
  for (size_t b = 0; b < nb; ++b, q += 32) {
    std::memcpy(out[b].q, q, 32);
    int32_t sum = 0;
    for (int k = 0; k < 32; ++k) sum += q[k];
    out[b].start = -128 * sum;
    out[b].d = d[b];
  }
}

// What every tile function reads: the activation blocks x [rows][nb], the
// packed matrix, and y [rows][out].
struct Args {
  const ActivationBlock* x;
  const Q8Int8Matrix* w;
  size_t nb, out;
  float* y;
  // Whether the tiles prefetch the weights kPrefetchBytes ahead: set by
  // RunGroups when one pass of row tiles covers every row (decode), so
  // each weight byte is read once, from memory. Measured on the 110M Q8_0
  // model (Xeon, 1 thread): batch-1 decode +10%, while in prefill, whose
  // tiles are reused from cache by the later rows, it cost 20%.
  bool prefetch = false;
  // Valid columns of group g (16 but in the last group).
  int Cols(size_t g) const { return static_cast<int>(std::min(kCols, out - g * kCols)); }
};

#ifdef TANDEM_INT8_X86
// Every lane: the masked forms of some AVX-512 intrinsics with this mask
// (GCC 12's unmasked ones warn, -Wmaybe-uninitialized on their undefined
// pass-through operand); the same instructions.
constexpr __mmask16 kAll = 0xFFFF;
#endif

// Scalar: ggml's generic ggml_vec_dot_q8_0_q8_0 per element.
struct GenericIsa {
  static constexpr int kRows = 1;
  static constexpr int kGroups = 1;
  template <int R, int C>
  static void Tile(const Args& a, size_t r0, size_t g0) {
    for (int r = 0; r < R; ++r) {
      const ActivationBlock* x = a.x + (r0 + r) * a.nb;
      for (int c = 0; c < C; ++c) {
        const size_t g = g0 + c;
        for (int col = 0; col < a.Cols(g); ++col) {
          float acc = 0.0f;
          for (size_t b = 0; b < a.nb; ++b) {
            const uint8_t* t = a.w->Tile(g, b);
            int32_t sumi = 0;
            for (size_t k = 0; k < 32; ++k) {
              const int32_t wq = static_cast<int32_t>(t[(k / 4) * 64 + 4 * col + k % 4]) - 128;
              sumi += static_cast<int32_t>(x[b].q[k]) * wq;
            }
            const float dw = LoadF16(a.w->Scales(g, b) + 2 * col);
            acc = acc + static_cast<float>(sumi) * (dw * x[b].d);
          }
          a.y[(r0 + r) * a.out + g * kCols + col] = acc;
        }
      }
    }
  }
};

#ifdef TANDEM_INT8_X86
// Stores the first n (<= 8) lanes of v at p.
__attribute__((target("avx2"))) inline void Store8(float* p, __m256 v, int n) {
  if (n >= 8) return _mm256_storeu_ps(p, v);
  if (n <= 0) return;
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, v);
  std::memcpy(p, tmp, static_cast<size_t>(n) * sizeof(float));
}

// One block's float step for 8 columns: acc + (float)sumi * (dw * dx).
__attribute__((target("avx2,f16c"), always_inline)) inline __m256 Combine(__m256 acc, __m256i sumi,
                                                                          __m256 dw, __m256 dx) {
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dw, dx)));
}

// The 256-bit tiles' step after block b's integer dots: acc[r][h] =
// Combine(acc[r][h], si[r][h], the block's 8 F16 scales of half h, row
// r0 + r's activation scale), for R rows and both halves of the group.
template <int R>
__attribute__((target("avx2,f16c"), always_inline)) inline void CombineBlock(
    const Args& a, size_t g0, size_t r0, size_t b, const __m256i (&si)[R][2], __m256 (&acc)[R][2]) {
  const uint8_t* s = a.w->Scales(g0, b);
  const __m256 dw0 = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(s)));
  const __m256 dw1 = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(s + 16)));
  for (int r = 0; r < R; ++r) {
    const __m256 dx = _mm256_set1_ps(a.x[(r0 + r) * a.nb + b].d);
    acc[r][0] = Combine(acc[r][0], si[r][0], dw0, dx);
    acc[r][1] = Combine(acc[r][1], si[r][1], dw1, dx);
  }
}

// Stores the R rows' 16 columns of group g0 (fewer at the matrix's edge).
template <int R>
__attribute__((target("avx2"), always_inline)) inline void StoreRows(const Args& a, size_t r0,
                                                                     size_t g0,
                                                                     const __m256 (&acc)[R][2]) {
  const int n = a.Cols(g0);
  for (int r = 0; r < R; ++r) {
    float* yr = a.y + (r0 + r) * a.out + g0 * kCols;
    Store8(yr, acc[r][0], n);
    Store8(yr + 8, acc[r][1], n - 8);
  }
}

// AVX2: one group (two halves of 8 columns) by R rows. Per 4 elements and
// half: w back to s8 (XOR 0x80), sign(x, w) as s8 times |w| as u8 in pairs
// (maddubs, exact: pair sums <= 2 * 128 * 127), then pairs to int32 (madd
// with ones).
struct Avx2Isa {
  static constexpr int kRows = 3;
  static constexpr int kGroups = 1;
  template <int R, int C>
  __attribute__((target("avx2,f16c"))) static void Tile(const Args& a, size_t r0, size_t g0) {
    static_assert(C == 1);
    const ActivationBlock* x[R];
    for (int r = 0; r < R; ++r) x[r] = a.x + (r0 + r) * a.nb;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (size_t b = 0; b < a.nb; ++b) {
      const uint8_t* t = a.w->Tile(g0, b);
      __m256i si[R][2];
      for (int r = 0; r < R; ++r) si[r][0] = si[r][1] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        const __m256i w0 =
            _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(t + 64 * j)), bias);
        const __m256i w1 = _mm256_xor_si256(
            _mm256_load_si256(reinterpret_cast<const __m256i*>(t + 64 * j + 32)), bias);
        const __m256i aw0 = _mm256_abs_epi8(w0), aw1 = _mm256_abs_epi8(w1);
        for (int r = 0; r < R; ++r) {
          const __m256i xq = _mm256_broadcastd_epi32(_mm_loadu_si32(x[r][b].q + 4 * j));
          const __m256i p0 = _mm256_maddubs_epi16(aw0, _mm256_sign_epi8(xq, w0));
          const __m256i p1 = _mm256_maddubs_epi16(aw1, _mm256_sign_epi8(xq, w1));
          si[r][0] = _mm256_add_epi32(si[r][0], _mm256_madd_epi16(p0, ones));
          si[r][1] = _mm256_add_epi32(si[r][1], _mm256_madd_epi16(p1, ones));
        }
      }
      CombineBlock<R>(a, g0, r0, b, si, acc);
    }
    StoreRows<R>(a, r0, g0, acc);
  }
};

// AVX-VNNI: 256-bit vpdpbusd of w + 128 (u8) and x (s8), started at
// -128 * sum(x) of the activation block (Args::start), so that it ends at
// sum(q_x * q_w). One group (two halves) by R rows.
struct AvxVnniIsa {
  static constexpr int kRows = 3;
  static constexpr int kGroups = 1;
  template <int R, int C>
  __attribute__((target("avx2,f16c,avxvnni"))) static void Tile(const Args& a, size_t r0,
                                                                size_t g0) {
    static_assert(C == 1);
    const ActivationBlock* x[R];
    for (int r = 0; r < R; ++r) x[r] = a.x + (r0 + r) * a.nb;
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (size_t b = 0; b < a.nb; ++b) {
      const uint8_t* t = a.w->Tile(g0, b);
      __m256i si[R][2];
      for (int r = 0; r < R; ++r) {
        si[r][0] = si[r][1] = _mm256_set1_epi32(x[r][b].start);
      }
      for (int j = 0; j < 8; ++j) {
        const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(t + 64 * j));
        const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(t + 64 * j + 32));
        for (int r = 0; r < R; ++r) {
          const __m256i xq = _mm256_broadcastd_epi32(_mm_loadu_si32(x[r][b].q + 4 * j));
          si[r][0] = _mm256_dpbusd_avx_epi32(si[r][0], w0, xq);
          si[r][1] = _mm256_dpbusd_avx_epi32(si[r][1], w1, xq);
        }
      }
      CombineBlock<R>(a, g0, r0, b, si, acc);
    }
    StoreRows<R>(a, r0, g0, acc);
  }
};

#define TANDEM_INT8_AVX512 "avx512f,avx512bw,avx512vnni,avx2,f16c"

// AVX-512 VNNI: 512-bit vpdpbusd, one 16-column group per vector, R rows by
// C groups (R * C int32 and R * C float accumulators of the 32 zmm).
struct Avx512VnniIsa {
  static constexpr int kRows = 6;
  static constexpr int kGroups = 2;
  template <int R, int C>
  __attribute__((target(TANDEM_INT8_AVX512))) static void Tile(const Args& a, size_t r0,
                                                               size_t g0) {
    const ActivationBlock* x[R];
    for (int r = 0; r < R; ++r) x[r] = a.x + (r0 + r) * a.nb;
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    }
    const uint8_t* t0[C];
    const uint8_t* s0[C];
    for (int c = 0; c < C; ++c) {
      t0[c] = a.w->Tile(g0 + c, 0);
      s0[c] = a.w->Scales(g0 + c, 0);
    }
    for (size_t b = 0; b < a.nb; ++b) {
      const uint8_t* t[C];
      for (int c = 0; c < C; ++c) t[c] = t0[c] + b * Q8Int8Matrix::kTileBytes;
      if (a.prefetch) {
        for (int c = 0; c < C; ++c) {
          for (size_t l = 0; l < Q8Int8Matrix::kTileBytes; l += 64) {
            _mm_prefetch(reinterpret_cast<const char*>(t[c] + kPrefetchBytes + l), _MM_HINT_T0);
          }
        }
      }
      __m512i si[R][C];
      for (int r = 0; r < R; ++r) {
        const __m512i s = _mm512_set1_epi32(x[r][b].start);
        for (int c = 0; c < C; ++c) si[r][c] = s;
      }
      for (int j = 0; j < 8; ++j) {
        __m512i w[C];
        for (int c = 0; c < C; ++c) {
          w[c] = _mm512_load_si512(reinterpret_cast<const void*>(t[c] + 64 * j));
        }
        for (int r = 0; r < R; ++r) {
          const __m512i xq = _mm512_maskz_broadcastd_epi32(kAll, _mm_loadu_si32(x[r][b].q + 4 * j));
          for (int c = 0; c < C; ++c) si[r][c] = _mm512_dpbusd_epi32(si[r][c], w[c], xq);
        }
      }
      __m512 dw[C];
      for (int c = 0; c < C; ++c) {
        dw[c] = _mm512_maskz_cvtph_ps(kAll, _mm256_load_si256(reinterpret_cast<const __m256i*>(
                                                s0[c] + b * Q8Int8Matrix::kScaleBytes)));
      }
      for (int r = 0; r < R; ++r) {
        const __m512 dx = _mm512_set1_ps(x[r][b].d);
        for (int c = 0; c < C; ++c) {
          acc[r][c] = _mm512_add_ps(
              acc[r][c],
              _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(kAll, si[r][c]), _mm512_mul_ps(dw[c], dx)));
        }
      }
    }
    for (int c = 0; c < C; ++c) {
      const int n = a.Cols(g0 + c);
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
      for (int r = 0; r < R; ++r) {
        _mm512_mask_storeu_ps(a.y + (r0 + r) * a.out + (g0 + c) * kCols, m, acc[r][c]);
      }
    }
  }
};
static_assert(Avx512VnniIsa::kRows == kMaxTileRows);
#endif  // TANDEM_INT8_X86

// Groups outer, rows inner: a few groups' tiles stay in cache while every
// activation row passes over them.
template <typename Isa>
void Groups(const Args& a, size_t rows, size_t g_begin, size_t g_end) {
  for (size_t g = g_begin; g < g_end; g += Isa::kGroups) {
    const int nc = static_cast<int>(std::min<size_t>(Isa::kGroups, g_end - g));
    for (size_t r = 0; r < rows; r += Isa::kRows) {
      const int nr = static_cast<int>(std::min<size_t>(Isa::kRows, rows - r));
      RunTile<Isa, Isa::kRows, Isa::kGroups>(nr, nc, a, r, g);
    }
  }
}

Int8IsaKind DetectInt8Isa() {
#ifdef TANDEM_INT8_X86
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("f16c")) {
    return Int8IsaKind::kGeneric;
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni")) {
    return Int8IsaKind::kAvx512Vnni;
  }
  if (__builtin_cpu_supports("avxvnni")) return Int8IsaKind::kAvxVnni;
  return Int8IsaKind::kAvx2;
#else
  return Int8IsaKind::kGeneric;
#endif
}

bool HasAvx2() {
#ifdef TANDEM_INT8_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool HasAvxVnni() {
#ifdef TANDEM_INT8_X86
  return HasAvx2() && __builtin_cpu_supports("avxvnni");
#else
  return false;
#endif
}

// d = amax / 127 and id = d ? 1 / d : 0 of one block (ggml's order).
struct BlockScale {
  float d, id;
};
inline BlockScale ScaleOf(float amax) {
  const float d = amax / 127.0f;
  return {d, d != 0.0f ? 1.0f / d : 0.0f};
}

// roundf(y) as int8. ggml casts without a check, which is defined only for
// |roundf(y)| <= 127, all that a finite id gives; a block whose id
// overflowed (amax below ~127 / FLT_MAX, whose F16 d is 0 anyway) gets 0
// here on every path.
inline int8_t RoundToInt8(float y) {
  const float r = std::roundf(y);
  return std::fabs(r) <= 127.0f ? static_cast<int8_t>(r) : 0;
}

void QuantizeRowGeneric(const float* x, size_t n, int8_t* q, float* d) {
  for (size_t b = 0; b < n / 32; ++b, x += 32, q += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const BlockScale s = ScaleOf(amax);
    d[b] = gguf::HalfToFloat(gguf::FloatToHalf(s.d));
    for (int j = 0; j < 32; ++j) q[j] = RoundToInt8(x[j] * s.id);
  }
}

#ifdef TANDEM_INT8_X86
// QuantizeRowGeneric on 16 lanes: the same amax (max is exact in any
// order), the same scalar d and id, y = x * id rounded once, and roundf as
// t = trunc(y), t += copysign(1, y) when |y - t| >= 0.5 (y - t is exact).
__attribute__((target("avx512f"))) void QuantizeRowAvx512(const float* x, size_t n, int8_t* q,
                                                          float* d) {
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
  const __m512 limit = _mm512_set1_ps(127.0f);
  const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
  for (size_t b = 0; b < n / 32; ++b, x += 32, q += 32) {
    const __m512 v[2] = {_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)};
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, _mm512_maskz_max_ps(kAll, _mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    float amax = 0.0f;
    for (float l : lanes) amax = std::max(amax, l);
    const BlockScale s = ScaleOf(amax);
    d[b] = gguf::HalfToFloat(gguf::FloatToHalf(s.d));
    const __m512 id = _mm512_set1_ps(s.id);
    for (int h = 0; h < 2; ++h) {
      const __m512 y = _mm512_mul_ps(v[h], id);
      __m512 t = _mm512_maskz_roundscale_ps(kAll, y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __mmask16 away =
          _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(y, t)), half, _CMP_GE_OQ);
      const __m512 step = _mm512_castsi512_ps(_mm512_or_si512(
          _mm512_and_si512(_mm512_castps_si512(y), sign), _mm512_castps_si512(one)));
      t = _mm512_mask_add_ps(t, away, t, step);
      const __mmask16 ok = _mm512_cmp_ps_mask(_mm512_abs_ps(t), limit, _CMP_LE_OQ);
      const __m512i i = _mm512_maskz_cvttps_epi32(ok, t);
      _mm512_mask_cvtsepi32_storeu_epi8(q + 16 * h, kAll, i);
    }
  }
}
#endif  // TANDEM_INT8_X86

// Groups on a supported `isa`, over `rows` rows of a (its prefetch flag set
// here, from rows).
void RunGroups(Int8IsaKind isa, Args a, size_t rows, size_t g_begin, size_t g_end) {
  a.prefetch = rows <= kMaxTileRows;
  switch (isa) {
#ifdef TANDEM_INT8_X86
    case Int8IsaKind::kAvx512Vnni:
      return Groups<Avx512VnniIsa>(a, rows, g_begin, g_end);
    case Int8IsaKind::kAvxVnni:
      return Groups<AvxVnniIsa>(a, rows, g_begin, g_end);
    case Int8IsaKind::kAvx2:
      return Groups<Avx2Isa>(a, rows, g_begin, g_end);
#endif
    default:
      return Groups<GenericIsa>(a, rows, g_begin, g_end);
  }
}

}  // namespace

void QuantizeActivationRow(const float* x, size_t n, int8_t* q, float* d) {
#ifdef TANDEM_INT8_X86
  static const bool avx512 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  if (avx512) return QuantizeRowAvx512(x, n, q, d);
#endif
  QuantizeRowGeneric(x, n, q, d);
}

void QuantizeActivationRowGeneric(const float* x, size_t n, int8_t* q, float* d) {
  QuantizeRowGeneric(x, n, q, d);
}

void Q8Int8Matrix::Free::operator()(uint8_t* p) const { std::free(p); }

std::unique_ptr<Q8Int8Matrix> Q8Int8Matrix::Pack(const WeightMatrix& w) {
  auto m = std::unique_ptr<Q8Int8Matrix>(new Q8Int8Matrix());
  m->in_ = w.in;
  m->out_ = w.out;
  const size_t bytes = std::max<size_t>(64, m->groups() * m->GroupBytes());
  m->data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)));
  // Zero weights (stored + 128) and zero scales for the missing columns.
  std::memset(m->data_.get(), 0, bytes);
  for (size_t g = 0; g < m->groups(); ++g) {
    std::memset(m->data_.get() + g * m->GroupBytes(), 0x80, m->blocks() * kTileBytes);
  }
  const size_t row_bytes = w.RowBytes();
  for (size_t o = 0; o < w.out; ++o) {
    const size_t g = o / kCols, c = o % kCols;
    const uint8_t* row = w.data + o * row_bytes;
    for (size_t b = 0; b < m->blocks(); ++b) {
      const uint8_t* block = row + 34 * b;
      uint8_t* t = m->data_.get() + m->TileOffset(g, b);
      std::memcpy(m->data_.get() + m->ScalesOffset(g, b) + 2 * c, block, 2);
      for (size_t k = 0; k < 32; ++k) t[(k / 4) * 64 + 4 * c + k % 4] = block[2 + k] ^ 0x80u;
    }
  }
  return m;
}

bool Int8IsaSupported(Int8IsaKind isa) {
  switch (isa) {
    case Int8IsaKind::kGeneric:
      return true;
    case Int8IsaKind::kAvx2:
      return HasAvx2();
    case Int8IsaKind::kAvxVnni:
      return HasAvxVnni();
    case Int8IsaKind::kAvx512Vnni:
      return BestInt8Isa() == Int8IsaKind::kAvx512Vnni;
  }
  return false;
}

Int8IsaKind BestInt8Isa() {
  static const Int8IsaKind isa = DetectInt8Isa();
  return isa;
}

const char* Int8IsaName(Int8IsaKind isa) {
  switch (isa) {
    case Int8IsaKind::kGeneric:
      return "generic";
    case Int8IsaKind::kAvx2:
      return "avx2";
    case Int8IsaKind::kAvxVnni:
      return "avxvnni";
    case Int8IsaKind::kAvx512Vnni:
      return "avx512vnni";
  }
  return "generic";
}

void MatMulInt8GroupsWithIsa(Int8IsaKind isa, const int8_t* q, const float* d,
                             const Q8Int8Matrix& w, size_t rows, size_t g_begin, size_t g_end,
                             float* y) {
  if (!Int8IsaSupported(isa)) isa = Int8IsaKind::kGeneric;
  const size_t nb = w.blocks();
  std::vector<ActivationBlock> blocks(rows * nb);
  for (size_t r = 0; r < rows; ++r) ToBlocks(q + r * w.in(), d + r * nb, nb, &blocks[r * nb]);
  RunGroups(isa, Args{blocks.data(), &w, nb, w.out(), y}, rows, g_begin, g_end);
}

void MatMulInt8WithIsa(Int8IsaKind isa, const float* x, const Q8Int8Matrix& w, size_t rows,
                       float* y, ThreadPool* pool, size_t min_work) {
  if (!Int8IsaSupported(isa)) isa = Int8IsaKind::kGeneric;
  const size_t in = w.in(), nb = w.blocks();
  // Reused from call to call on the calling thread; the workers only read.
  thread_local std::vector<ActivationBlock> blocks;
  if (blocks.size() < rows * nb) blocks.resize(rows * nb);
  ActivationBlock* const xb = blocks.data();
  // ~8 operations per element, as the element-wise kernels count.
  MaybeParallelFor(pool, rows, rows * in * 8, min_work, [&](size_t begin, size_t end) {
    // One row's q and d on the way to its blocks, per worker thread.
    thread_local std::vector<int8_t> q;
    thread_local std::vector<float> d;
    if (q.size() < in) q.resize(in);
    if (d.size() < nb) d.resize(nb);
    for (size_t r = begin; r < end; ++r) {
      QuantizeActivationRow(x + r * in, in, q.data(), d.data());
      ToBlocks(q.data(), d.data(), nb, xb + r * nb);
    }
  });
  const Args a{xb, &w, nb, w.out(), y};
  MaybeParallelFor(pool, w.groups(), rows * in * w.out(), min_work,
                   [&](size_t begin, size_t end) { RunGroups(isa, a, rows, begin, end); });
}

void MatMulInt8(const float* x, const Q8Int8Matrix& w, size_t rows, float* y, ThreadPool* pool,
                size_t min_work) {
  MatMulInt8WithIsa(BestInt8Isa(), x, w, rows, y, pool, min_work);
}

}  // namespace tandem::model::internal
