#include "engine/model/attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "engine/gguf/half.h"
#include "engine/kv/kv_convert.h"

#if defined(__x86_64__) || defined(__i386__)
#define TANDEM_ATTENTION_X86 1
#include <immintrin.h>
#endif

// The 8-float vector type below is only passed between inlined functions
// of this file, so GCC's note on its ABI (-Wpsabi) does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tandem::model::internal {
namespace {

typedef float Float8 __attribute__((vector_size(32)));
typedef float Float16 __attribute__((vector_size(64)));

// How the kernels below read K/V elements of one dtype: `T` is the stored
// type, Load<V>(p) widens the sizeof(V) / 4 elements at p to a float vector
// V (Float8 or Float16), One(p) the element at p. Widening is exact for
// every type (F16: gguf::HalfToFloat's values; BF16: bits << 16), so the
// arithmetic after it, and therefore every result bit, depends on the
// dtype's values only, never on which reader the ISA build uses. A
// signalling NaN in an F16 cache (never written by WriteKvRows) may widen
// with its quiet bit set on F16C, which changes only a NaN's payload.
struct F32Elems {
  using T = float;
  template <typename V>
  [[gnu::always_inline]] static V Load(const float* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  [[gnu::always_inline]] static float One(const float* p) { return *p; }
};

// BF16: the high half of a binary32 (ggml_compute_bf16_to_fp32), widened
// with integer vector ops that every ISA build vectorizes.
struct Bf16Elems {
  using T = uint16_t;
  typedef uint16_t U16x8 __attribute__((vector_size(16)));
  typedef uint16_t U16x16 __attribute__((vector_size(32)));
  typedef uint32_t U32x8 __attribute__((vector_size(32)));
  typedef uint32_t U32x16 __attribute__((vector_size(64)));
  template <typename V>
  [[gnu::always_inline]] static V Load(const uint16_t* p) {
    if constexpr (sizeof(V) == sizeof(Float8)) {
      return Widen<U16x8, U32x8, V>(p);
    } else {
      return Widen<U16x16, U32x16, V>(p);
    }
  }
  template <typename H, typename W, typename V>
  [[gnu::always_inline]] static V Widen(const uint16_t* p) {
    H h;
    std::memcpy(&h, p, sizeof h);
    const W bits = __builtin_convertvector(h, W) << 16;
    V v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  [[gnu::always_inline]] static float One(const uint16_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return kv::Bf16ToFloat(h);
  }
};

// F16 without F16C: gguf::HalfToFloat per element (the portable build).
struct F16Elems {
  using T = uint16_t;
  [[gnu::always_inline]] static float One(const uint16_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return gguf::HalfToFloat(h);
  }
  template <typename V>
  [[gnu::always_inline]] static V Load(const uint16_t* p) {
    V v;
    for (size_t i = 0; i < sizeof(V) / sizeof(float); ++i) v[i] = One(p + i);
    return v;
  }
};

#ifdef TANDEM_ATTENTION_X86
// F16 with F16C (VCVTPH2PS: exact, as HalfToFloat). These carry their own
// target and are not always_inline (GCC refuses to inline a target function
// into the ISA-neutral templates); the ISA entry points below are
// [[gnu::flatten]], which inlines them there.
struct F16Avx2Elems : F16Elems {
  template <typename V>
  __attribute__((target("avx2,f16c"))) static V Load(const uint16_t* p) {
    if constexpr (sizeof(V) == sizeof(Float8)) {
      return reinterpret_cast<V>(
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    } else {
      const Float8 lo = Load<Float8>(p), hi = Load<Float8>(p + 8);
      return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    }
  }
};

struct F16Avx512Elems : F16Elems {
  template <typename V>
  __attribute__((target("avx512f,avx2,f16c"))) static V Load(const uint16_t* p) {
    if constexpr (sizeof(V) == sizeof(Float8)) {
      return reinterpret_cast<V>(
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    } else {
      return reinterpret_cast<V>(
          _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
    }
  }
};
#endif

// Base of K (or V) rows of `layer` in block `block` of the pool, as E::T.
template <typename E>
[[gnu::always_inline]] inline const typename E::T* KRows(const AttentionSpan& kv, int32_t block) {
  return reinterpret_cast<const typename E::T*>(kv.pool->KData(block, kv.layer));
}
template <typename E>
[[gnu::always_inline]] inline const typename E::T* VRows(const AttentionSpan& kv, int32_t block) {
  return reinterpret_cast<const typename E::T*>(kv.pool->VData(block, kv.layer));
}

// Asks for the `bytes` bytes at p (a KV row run) to be brought into cache
// (software prefetch, one per 64-byte line): a block's rows are contiguous,
// but its 4 KiB pages start new hardware-prefetch streams, and the next
// block of a sequence is anywhere in the pool. A prefetch never faults,
// so a range past the end of a small block only wastes the request.
[[gnu::always_inline]] inline void PrefetchBytes(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off);
}

// Position j's K (kValues false) or V row in its block, `offset` elements
// in, and the end of the run of positions [j, end) that follow it there
// (rows kv_dim apart): end = min(the block's end, j_end).
template <typename E>
struct KvRun {
  const typename E::T* row;
  int32_t end;
};
template <typename E, bool kValues>
[[gnu::always_inline]] inline KvRun<E> KvRunAt(const AttentionSpan& kv, int32_t j, int32_t j_end,
                                               size_t offset) {
  const kv::KvShape& s = kv.pool->shape();
  const size_t kv_dim = static_cast<size_t>(s.n_kv_heads) * static_cast<size_t>(s.head_dim);
  const int32_t block = j / s.block_size;
  const int32_t id = kv.block_table[static_cast<size_t>(block)];
  const typename E::T* rows = kValues ? VRows<E>(kv, id) : KRows<E>(kv, id);
  return {rows + static_cast<size_t>(j - block * s.block_size) * kv_dim + offset,
          std::min((block + 1) * s.block_size, j_end)};
}

// out[0, kChunk) = the kChunk elements at p widened (E::Load 16, then 8,
// then one at a time): one value row's slice, held in registers.
template <typename E, size_t kChunk>
[[gnu::always_inline]] inline void WidenChunk(const typename E::T* p, float* out) {
  size_t d = 0;
  for (; d + 16 <= kChunk; d += 16) {
    const Float16 v = E::template Load<Float16>(p + d);
    std::memcpy(out + d, &v, sizeof v);
  }
  for (; d + 8 <= kChunk; d += 8) {
    const Float8 v = E::template Load<Float8>(p + d);
    std::memcpy(out + d, &v, sizeof v);
  }
  for (; d < kChunk; ++d) out[d] = E::One(p + d);
}

// acc[r][d] = acc[r][d] + p_rj * v_j[d] for d < kChunk, r < kRows and j in
// [j_begin, j_end) ascending, with p_rj = scores[r][j] * inv[r] and v_j[d] =
// V(block of j)[row j % block_size][kv_off + d]: each V row is widened once
// for all kRows rows, and each sum still adds its terms in ascending j.
template <typename E, size_t kChunk, int kRows>
[[gnu::always_inline]] inline void AccumulateRange(const AttentionSpan& kv, size_t kv_off,
                                                   int32_t j_begin, int32_t j_end,
                                                   const float* const* scores, const float* inv,
                                                   float (*acc)[kChunk]) {
  const kv::KvShape& s = kv.pool->shape();
  const size_t kv_dim = static_cast<size_t>(s.n_kv_heads) * static_cast<size_t>(s.head_dim);
  for (int32_t j = j_begin; j < j_end;) {
    const KvRun<E> run = KvRunAt<E, true>(kv, j, j_end, kv_off);
    const typename E::T* v = run.row;
    for (; j < run.end; ++j, v += kv_dim) {
      const float* vf;
      float widened[kChunk];
      if constexpr (std::is_same_v<typename E::T, float>) {
        vf = v;
      } else {
        WidenChunk<E, kChunk>(v, widened);
        vf = widened;
      }
      for (int r = 0; r < kRows; ++r) {
        const float p = scores[r][j] * inv[r];
        for (size_t d = 0; d < kChunk; ++d) acc[r][d] = acc[r][d] + p * vf[d];
      }
    }
  }
}

// out[r][d0 + d] for d < kChunk and r < kRows (kRows 1 or 2): sum_j p_rj *
// v_j[d] over j < len[r] ascending (AccumulateRange, V elements from kv_off
// + d0 of each head row), the sums held in registers; rows share the V
// rows j < len[0] (len ascending).
template <typename E, size_t kChunk, int kRows>
[[gnu::always_inline]] inline void AccumulateValues(const AttentionSpan& kv, size_t kv_off,
                                                    size_t d0, const int32_t* len,
                                                    const float* const* scores, const float* inv,
                                                    float* const* out) {
  static_assert(kRows == 1 || kRows == 2);
  float acc[kRows][kChunk] = {};
  AccumulateRange<E, kChunk, kRows>(kv, kv_off + d0, 0, len[0], scores, inv, acc);
  if constexpr (kRows == 2) {
    AccumulateRange<E, kChunk, 1>(kv, kv_off + d0, len[0], len[1], scores + 1, inv + 1, acc + 1);
  }
  for (int r = 0; r < kRows; ++r) {
    for (size_t d = 0; d < kChunk; ++d) out[r][d0 + d] = acc[r][d];
  }
}

// acc[d] = acc[d] + p * v[d] for d < n, v widened exactly (AccumulateValues'
// step for one position, over a whole head row, acc in memory).
template <typename E>
[[gnu::always_inline]] inline void AddScaledRow(const typename E::T* v, size_t n, float p,
                                                float* acc) {
  size_t d = 0;
  for (; d + 16 <= n; d += 16) {
    Float16 a, x;
    std::memcpy(&a, acc + d, sizeof a);
    if constexpr (std::is_same_v<typename E::T, float>) {
      std::memcpy(&x, v + d, sizeof x);
    } else {
      x = E::template Load<Float16>(v + d);
    }
    a = a + p * x;
    std::memcpy(acc + d, &a, sizeof a);
  }
  for (; d < n; ++d) acc[d] = acc[d] + p * E::One(v + d);
}

// Dot (cpu_kernels.h) written with an 8-float vector type, so that each
// ISA build holds the 8 lanes in one or two registers: lane j sums
// a[i] * b[i] for i = j mod 8 (multiply, then add), the lanes combine as
// ((0+4)+(2+6))+((1+5)+(3+7)), then the tail in index order. Same bits as
// Dot.
[[gnu::always_inline]] inline float CombineLanes(Float8 acc) {
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

[[gnu::always_inline]] inline Float8 Load8(const float* p) {
  Float8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The 8 lanes Combine8 reduces: an 8-lane sum as it is, a 16-lane one
// folded as lane l + lane l + 8.
[[gnu::always_inline]] inline Float8 Fold(Float8 v) { return v; }
[[gnu::always_inline]] inline Float8 Fold(Float16 v) {
  return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
}

// out[t] = CombineLanes(a_t) for four keys at once: the same additions on
// the same pairs, each level done for all four keys by one vector add after
// a shuffle (transposed), instead of a chain of scalar extracts per key.
[[gnu::always_inline]] inline void CombineLanes4(Float8 a0, Float8 a1, Float8 a2, Float8 a3,
                                                 float* out) {
  const Float16 x =
      __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const Float16 y =
      __builtin_shufflevector(a2, a3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // Level 1, per key k: lanes (a0 + a4, a1 + a5, a2 + a6, a3 + a7).
  const Float16 lo =
      __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const Float16 hi =
      __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const Float16 s1 = lo + hi;
  // Level 2: ((a0 + a4) + (a2 + a6)) and ((a1 + a5) + (a3 + a7)).
  const Float8 e = __builtin_shufflevector(s1, s1, 0, 1, 4, 5, 8, 9, 12, 13);
  const Float8 o = __builtin_shufflevector(s1, s1, 2, 3, 6, 7, 10, 11, 14, 15);
  const Float8 s2 = e + o;
  // Level 3: the two halves of each key.
  typedef float Float4 __attribute__((vector_size(16)));
  const Float4 s3 =
      __builtin_shufflevector(s2, s2, 0, 2, 4, 6) + __builtin_shufflevector(s2, s2, 1, 3, 5, 7);
  std::memcpy(out, &s3, sizeof s3);
}

// out[r][t] = a[r] . b[t] for t < kKeys and r < kRows with the lanes of V
// (Float8 or Float16): kRows x kKeys independent lane sets in one pass, so
// their add chains overlap and each key's elements are widened once for
// all rows.
template <typename E, typename V, int kKeys, int kRows>
[[gnu::always_inline]] inline void DotLanesOf(const float* const* a, const typename E::T* const* b,
                                              size_t n, float* const* out) {
  constexpr size_t kWidth = sizeof(V) / sizeof(float);
  // The fixed-count loops are unrolled so that acc stays in registers.
  V acc[kRows][kKeys];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < kKeys; ++t) acc[r][t] = V{};
  }
  const size_t nw = n - n % kWidth;
  for (size_t i = 0; i < nw; i += kWidth) {
    V va[kRows];
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) std::memcpy(&va[r], a[r] + i, sizeof(V));
#pragma GCC unroll 8
    for (int t = 0; t < kKeys; ++t) {
      const V vb = E::template Load<V>(b[t] + i);
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) acc[r][t] = acc[r][t] + va[r] * vb;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float sums[kKeys];
    if constexpr (kKeys == 4) {
      CombineLanes4(Fold(acc[r][0]), Fold(acc[r][1]), Fold(acc[r][2]), Fold(acc[r][3]), sums);
    } else {
      for (int t = 0; t < kKeys; ++t) sums[t] = CombineLanes(Fold(acc[r][t]));
    }
    for (int t = 0; t < kKeys; ++t) {
      float sum = sums[t];
      for (size_t i = nw; i < n; ++i) sum += a[r][i] * E::One(b[t] + i);
      out[r][t] = sum;
    }
  }
}

// out[r][t] = a[r] . b[t] for t < kKeys, r < kRows, in the order
// attention.h documents: 16 lanes when n >= 16, else 8.
template <typename E, int kKeys, int kRows>
[[gnu::always_inline]] inline void DotLanes(const float* const* a, const typename E::T* const* b,
                                            size_t n, float* const* out) {
  if (n >= 16) return DotLanesOf<E, Float16, kKeys, kRows>(a, b, n, out);
  DotLanesOf<E, Float8, kKeys, kRows>(a, b, n, out);
}

// One query row: out[t] = a . b[t].
template <typename E, int kKeys>
[[gnu::always_inline]] inline void DotLanes(const float* a, const typename E::T* const* b, size_t n,
                                            float* out) {
  DotLanes<E, kKeys, 1>(&a, b, n, &out);
}

typedef int32_t Int8 __attribute__((vector_size(32)));
typedef double Double4 __attribute__((vector_size(32)));

// Lane-wise exp(x) for x <= 0 (scores minus their max): Cody-Waite
// reduction x = n ln2 + r, then Cephes expf's degree-6 polynomial in r (no
// FMA), times 2^n; x < -87 (or NaN) gives 0. Error within 2 ulp of exp;
// exp(0) = 1 exactly. Every lane runs the same float operations, so the
// bits do not depend on the vector width or on a value's lane.
[[gnu::always_inline]] inline Float8 ExpNonPositive(Float8 x) {
  const Int8 valid = x > -87.0f;
  x = valid ? x : Float8{} - 87.0f;
  const Float8 fx = x * 1.44269504088896341f + 0.5f;
  Int8 n = __builtin_convertvector(fx, Int8);         // toward zero
  n = n + (__builtin_convertvector(n, Float8) > fx);  // -1: floor for fx < 0
  const Float8 nf = __builtin_convertvector(n, Float8);
  Float8 r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  Float8 p = Float8{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const Int8 two_n = (n + 127) << 23;  // 2^n, n in [-126, 0]
  const Float8 y = p * reinterpret_cast<Float8>(two_n);
  return reinterpret_cast<Float8>(reinterpret_cast<Int8>(y) & valid);
}

// scores[j] = exp(scores[j] - max) for j < n (ExpNonPositive, 8 at a time,
// the last group padded); returns their sum in double: 4 lanes, lane l
// adding j = l mod 4 in ascending j, combined (l0 + l2) + (l1 + l3).
[[gnu::always_inline]] inline double ExpAndSum(float* scores, int32_t n, float max) {
  Double4 acc = {0, 0, 0, 0};
  for (int32_t j = 0; j < n; j += 8) {
    const int32_t m = std::min<int32_t>(8, n - j);
    Float8 v;
    if (m == 8) {
      v = Load8(scores + j);
    } else {
      v = Float8{} + max;  // padding: exp(0), masked out below
      std::memcpy(&v, scores + j, static_cast<size_t>(m) * sizeof(float));
    }
    Float8 e = ExpNonPositive(v - max);
    if (m < 8) {
      for (int32_t t = m; t < 8; ++t) e[t] = 0.0f;
    }
    std::memcpy(scores + j, &e, static_cast<size_t>(m) * sizeof(float));
    acc = acc + __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3), Double4);
    acc = acc + __builtin_convertvector(__builtin_shufflevector(e, e, 4, 5, 6, 7), Double4);
  }
  return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

// scores[j] = scores[j] * scale for j < n; returns the largest of `max`
// and those products (a NaN never wins, as with std::max(max, x) in
// ascending j). The lanes keep their own maxima and are combined after:
// the maximum of a set is the same in any order, but for the sign of a
// zero, and a -0 or +0 max gives the same exp(x - max) for every x.
[[gnu::always_inline]] inline float ScaleAndMax(float* scores, int32_t n, float scale, float max) {
  Float8 m = Float8{} + max;
  int32_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const Float8 v = Load8(scores + j) * scale;
    std::memcpy(scores + j, &v, sizeof v);
    m = m < v ? v : m;
  }
  for (; j < n; ++j) {
    scores[j] = scores[j] * scale;
    max = std::max(max, scores[j]);
  }
  for (int t = 0; t < 8; ++t) max = std::max(max, m[t]);
  return max;
}

// scores[r][j] = q[r] . K_j (KV head kv.kv_head) for j in [j_begin, j_end)
// and r < kRows, walking the positions block by block (j ascending), so
// the pool is asked for each block's rows once, and four keys at a time.
template <typename E, int kRows>
[[gnu::always_inline]] inline void ScoreRange(const AttentionSpan& kv, int32_t j_begin,
                                              int32_t j_end, const float* const* q,
                                              float* const* scores) {
  const kv::KvShape& s = kv.pool->shape();
  const size_t hd = static_cast<size_t>(s.head_dim);
  const size_t kv_dim = static_cast<size_t>(s.n_kv_heads) * hd;
  for (int32_t j = j_begin; j < j_end;) {
    const KvRun<E> run = KvRunAt<E, false>(kv, j, j_end, static_cast<size_t>(kv.kv_head) * hd);
    const int32_t j1 = run.end;
    const typename E::T* k = run.row;
    for (; j + 4 <= j1; j += 4, k += 4 * kv_dim) {
      const typename E::T* keys[4] = {k, k + kv_dim, k + 2 * kv_dim, k + 3 * kv_dim};
      float* out[kRows];
      for (int r = 0; r < kRows; ++r) out[r] = scores[r] + j;
      DotLanes<E, 4, kRows>(q, keys, hd, out);
    }
    for (; j < j1; ++j, k += kv_dim) {
      float* out[kRows];
      for (int r = 0; r < kRows; ++r) out[r] = scores[r] + j;
      DotLanes<E, 1, kRows>(q, &k, hd, out);
    }
  }
}

// Attend for kRows (1 or 2) query rows q[r] of one head of one sequence,
// row r at position pos[r] (ascending; kv.pos is not read): out[r] gets
// the same bits as AttendHead at pos[r], since every score and every
// output sum is formed by the same operations in the same order; the K and
// V rows that rows share are read and widened once. scores: kRows *
// (pos[kRows - 1] + 1) floats.
template <typename E, int kRows>
[[gnu::always_inline]] inline void AttendRows(const AttentionSpan& kv, const int32_t* pos,
                                              const float* const* q, float scale, float* const* out,
                                              float* scores) {
  static_assert(kRows == 1 || kRows == 2);
  const kv::KvShape& s = kv.pool->shape();
  const size_t hd = static_cast<size_t>(s.head_dim);
  const size_t kv_off = static_cast<size_t>(kv.kv_head) * hd;
  int32_t len[kRows];
  float* sc[kRows];
  float inv[kRows];
  for (int r = 0; r < kRows; ++r) {
    len[r] = pos[r] + 1;
    sc[r] = scores + static_cast<size_t>(r) * static_cast<size_t>(pos[kRows - 1] + 1);
  }
  ScoreRange<E, kRows>(kv, 0, len[0], q, sc);
  if constexpr (kRows == 2) ScoreRange<E, 1>(kv, len[0], len[1], q + 1, sc + 1);
  for (int r = 0; r < kRows; ++r) {
    const float max = ScaleAndMax(sc[r], len[r], scale, -INFINITY);
    inv[r] = static_cast<float>(1.0 / ExpAndSum(sc[r], len[r], max));
  }
  // Chunks of 64, 32, 16, 8 and 1 output elements; each element's sum is
  // the same whichever chunk holds it.
  size_t d = 0;
  for (; d + 64 <= hd; d += 64) AccumulateValues<E, 64, kRows>(kv, kv_off, d, len, sc, inv, out);
  if (d + 32 <= hd) AccumulateValues<E, 32, kRows>(kv, kv_off, d, len, sc, inv, out), d += 32;
  if (d + 16 <= hd) AccumulateValues<E, 16, kRows>(kv, kv_off, d, len, sc, inv, out), d += 16;
  if (d + 8 <= hd) AccumulateValues<E, 8, kRows>(kv, kv_off, d, len, sc, inv, out), d += 8;
  for (; d < hd; ++d) AccumulateValues<E, 1, kRows>(kv, kv_off, d, len, sc, inv, out);
}

// Attend for every query head h < n_head of one row (head h reads KV head
// h / (n_head / n_kv_heads)), walking each block's K rows and then its V
// rows once, whole (kv_dim contiguous elements per position), instead of
// once per head: a decode row's reads are then sequential. Each output
// element gets exactly Attend's operations in Attend's order (the loops
// are only interchanged): the same bits. scores: n_head * (pos + 2)
// floats of scratch (the scores, then each head's 1 / sum).
template <typename E>
[[gnu::always_inline]] inline void AttendAllHeads(const AttentionSpan& kv, size_t n_head,
                                                  const float* q, float scale, float* out,
                                                  float* scores) {
  const kv::KvShape& s = kv.pool->shape();
  const size_t hd = static_cast<size_t>(s.head_dim);
  const size_t kv_dim = static_cast<size_t>(s.n_kv_heads) * hd;
  const size_t group = n_head / static_cast<size_t>(s.n_kv_heads);
  const size_t n = static_cast<size_t>(kv.pos) + 1;
  const size_t row_bytes = kv_dim * sizeof(typename E::T);
  for (int32_t j = 0; j <= kv.pos;) {
    const KvRun<E> run = KvRunAt<E, false>(kv, j, kv.pos + 1, 0);
    const int32_t j1 = run.end;
    const typename E::T* k = run.row;
    // The next block's first rows, while this one is read.
    if (j1 <= kv.pos) {
      PrefetchBytes(KvRunAt<E, false>(kv, j1, kv.pos + 1, 0).row, 4 * row_bytes);
    }
    for (; j + 4 <= j1; j += 4, k += 4 * kv_dim) {
      if (j + 8 <= j1) PrefetchBytes(k + 4 * kv_dim, 4 * row_bytes);
      for (size_t h = 0; h < n_head; ++h) {
        const typename E::T* kh = k + (h / group) * hd;
        const typename E::T* keys[4] = {kh, kh + kv_dim, kh + 2 * kv_dim, kh + 3 * kv_dim};
        DotLanes<E, 4>(q + h * hd, keys, hd, &scores[h * n + static_cast<size_t>(j)]);
      }
    }
    for (; j < j1; ++j, k += kv_dim) {
      for (size_t h = 0; h < n_head; ++h) {
        const typename E::T* kh = k + (h / group) * hd;
        DotLanes<E, 1>(q + h * hd, &kh, hd, &scores[h * n + static_cast<size_t>(j)]);
      }
    }
  }
  // Per head: scale, max and the exponentials in Attend's order; out holds
  // the running sums (from 0.0f), p = e_j * inv as Attend forms it.
  float* const inv = scores + n_head * n;
  for (size_t h = 0; h < n_head; ++h) {
    float* sh = scores + h * n;
    const float max = ScaleAndMax(sh, kv.pos + 1, scale, -INFINITY);
    inv[h] = static_cast<float>(1.0 / ExpAndSum(sh, kv.pos + 1, max));
    std::fill(out + h * hd, out + (h + 1) * hd, 0.0f);
  }
  for (int32_t j = 0; j <= kv.pos;) {
    const KvRun<E> run = KvRunAt<E, true>(kv, j, kv.pos + 1, 0);
    const typename E::T* v = run.row;
    if (run.end <= kv.pos) {
      PrefetchBytes(KvRunAt<E, true>(kv, run.end, kv.pos + 1, 0).row, 2 * row_bytes);
    }
    for (; j < run.end; ++j, v += kv_dim) {
      if (j + 2 < run.end) PrefetchBytes(v + 2 * kv_dim, row_bytes);
      for (size_t h = 0; h < n_head; ++h) {
        const float p = scores[h * n + static_cast<size_t>(j)] * inv[h];
        AddScaledRow<E>(v + (h / group) * hd, hd, p, out + h * hd);
      }
    }
  }
}

// One query row: AttendRows<E, 1> at kv.pos.
template <typename E>
[[gnu::always_inline]] inline void Attend(const AttentionSpan& kv, const float* q, float scale,
                                          float* out, float* scores) {
  AttendRows<E, 1>(kv, &kv.pos, &q, scale, &out, scores);
}

// Two query rows, at pos0 and kv.pos: AttendRows<E, 2>.
template <typename E>
[[gnu::always_inline]] inline void AttendPair(const AttentionSpan& kv, int32_t pos0,
                                              const float* q0, const float* q1, float scale,
                                              float* out0, float* out1, float* scores) {
  const int32_t pos[2] = {pos0, kv.pos};
  const float* q[2] = {q0, q1};
  float* out[2] = {out0, out1};
  AttendRows<E, 2>(kv, pos, q, scale, out, scores);
}

template <typename E>
void AttendGeneric(const AttentionSpan& kv, const float* q, float scale, float* out,
                   float* scores) {
  Attend<E>(kv, q, scale, out, scores);
}

template <typename E>
void AttendPairGeneric(const AttentionSpan& kv, int32_t pos0, const float* q0, const float* q1,
                       float scale, float* out0, float* out1, float* scores) {
  AttendPair<E>(kv, pos0, q0, q1, scale, out0, out1, scores);
}

template <typename E>
void AttendAllHeadsGeneric(const AttentionSpan& kv, size_t n_head, const float* q, float scale,
                           float* out, float* scores) {
  AttendAllHeads<E>(kv, n_head, q, scale, out, scores);
}

#ifdef TANDEM_ATTENTION_X86
template <typename E>
[[gnu::flatten]] __attribute__((target("avx2,fma,f16c"))) void AttendAvx2(const AttentionSpan& kv,
                                                                          const float* q,
                                                                          float scale, float* out,
                                                                          float* scores) {
  Attend<E>(kv, q, scale, out, scores);
}

template <typename E>
[[gnu::flatten]] __attribute__((target("avx512f,avx2,fma,f16c"))) void AttendAvx512(
    const AttentionSpan& kv, const float* q, float scale, float* out, float* scores) {
  Attend<E>(kv, q, scale, out, scores);
}

template <typename E>
[[gnu::flatten]] __attribute__((target("avx2,fma,f16c"))) void AttendPairAvx2(
    const AttentionSpan& kv, int32_t pos0, const float* q0, const float* q1, float scale,
    float* out0, float* out1, float* scores) {
  AttendPair<E>(kv, pos0, q0, q1, scale, out0, out1, scores);
}

template <typename E>
[[gnu::flatten]] __attribute__((target("avx512f,avx2,fma,f16c"))) void AttendPairAvx512(
    const AttentionSpan& kv, int32_t pos0, const float* q0, const float* q1, float scale,
    float* out0, float* out1, float* scores) {
  AttendPair<E>(kv, pos0, q0, q1, scale, out0, out1, scores);
}

template <typename E>
[[gnu::flatten]] __attribute__((target("avx2,fma,f16c"))) void AttendAllHeadsAvx2(
    const AttentionSpan& kv, size_t n_head, const float* q, float scale, float* out,
    float* scores) {
  AttendAllHeads<E>(kv, n_head, q, scale, out, scores);
}

template <typename E>
[[gnu::flatten]] __attribute__((target("avx512f,avx2,fma,f16c"))) void AttendAllHeadsAvx512(
    const AttentionSpan& kv, size_t n_head, const float* q, float scale, float* out,
    float* scores) {
  AttendAllHeads<E>(kv, n_head, q, scale, out, scores);
}
#endif

// The entry points of one kernel (Attend, AttendPair or AttendAllHeads) for each ISA
// and dtype.
struct AttendHeadFns {
  using Fn = void (*)(const AttentionSpan&, const float*, float, float*, float*);
  template <typename E>
  static constexpr Fn kGeneric = AttendGeneric<E>;
#ifdef TANDEM_ATTENTION_X86
  template <typename E>
  static constexpr Fn kAvx2 = AttendAvx2<E>;
  template <typename E>
  static constexpr Fn kAvx512 = AttendAvx512<E>;
#endif
};
struct AttendPairFns {
  using Fn = void (*)(const AttentionSpan&, int32_t, const float*, const float*, float, float*,
                      float*, float*);
  template <typename E>
  static constexpr Fn kGeneric = AttendPairGeneric<E>;
#ifdef TANDEM_ATTENTION_X86
  template <typename E>
  static constexpr Fn kAvx2 = AttendPairAvx2<E>;
  template <typename E>
  static constexpr Fn kAvx512 = AttendPairAvx512<E>;
#endif
};
struct AttendRowFns {
  using Fn = void (*)(const AttentionSpan&, size_t, const float*, float, float*, float*);
  template <typename E>
  static constexpr Fn kGeneric = AttendAllHeadsGeneric<E>;
#ifdef TANDEM_ATTENTION_X86
  template <typename E>
  static constexpr Fn kAvx2 = AttendAllHeadsAvx2<E>;
  template <typename E>
  static constexpr Fn kAvx512 = AttendAllHeadsAvx512<E>;
#endif
};

// The entry point of `Fns` for `isa` (kGeneric when this CPU cannot run it)
// and the pool's dtype. Every KernelIsaKind other than kGeneric implies
// F16C (cpu_kernels.cc's detection requires it).
template <typename Fns>
typename Fns::Fn AttendFor(KernelIsaKind isa, kv::KvDtype dtype) {
  switch (KernelIsaSupported(isa) ? isa : KernelIsaKind::kGeneric) {
#ifdef TANDEM_ATTENTION_X86
    case KernelIsaKind::kAvx512:
      switch (dtype) {
        case kv::KvDtype::kF32:
          return Fns::template kAvx512<F32Elems>;
        case kv::KvDtype::kF16:
          return Fns::template kAvx512<F16Avx512Elems>;
        case kv::KvDtype::kBF16:
          return Fns::template kAvx512<Bf16Elems>;
      }
      break;
    case KernelIsaKind::kAvx2:
      switch (dtype) {
        case kv::KvDtype::kF32:
          return Fns::template kAvx2<F32Elems>;
        case kv::KvDtype::kF16:
          return Fns::template kAvx2<F16Avx2Elems>;
        case kv::KvDtype::kBF16:
          return Fns::template kAvx2<Bf16Elems>;
      }
      break;
#endif
    default:
      break;
  }
  switch (dtype) {
    case kv::KvDtype::kF32:
      return Fns::template kGeneric<F32Elems>;
    case kv::KvDtype::kF16:
      return Fns::template kGeneric<F16Elems>;
    case kv::KvDtype::kBF16:
      return Fns::template kGeneric<Bf16Elems>;
  }
  std::abort();  // a dtype outside KvDtype: a caller bug
}

// The widest vector ISA this CPU has (any gives the same bits).
KernelIsaKind WidestIsa() {
  static const KernelIsaKind isa = [] {
    for (KernelIsaKind isa : {KernelIsaKind::kAvx512, KernelIsaKind::kAvx2}) {
      if (KernelIsaSupported(isa)) return isa;
    }
    return KernelIsaKind::kGeneric;
  }();
  return isa;
}

}  // namespace

void AttendHeadWithIsa(KernelIsaKind isa, const AttentionSpan& kv, const float* q, float scale,
                       float* out, float* scores) {
  AttendFor<AttendHeadFns>(isa, kv.pool->dtype())(kv, q, scale, out, scores);
}

void AttendHead(const AttentionSpan& kv, const float* q, float scale, float* out, float* scores) {
  AttendHeadWithIsa(WidestIsa(), kv, q, scale, out, scores);
}

void AttendHeadPairWithIsa(KernelIsaKind isa, const AttentionSpan& kv, int32_t pos0,
                           const float* q0, const float* q1, float scale, float* out0, float* out1,
                           float* scores) {
  AttendFor<AttendPairFns>(isa, kv.pool->dtype())(kv, pos0, q0, q1, scale, out0, out1, scores);
}

void AttendHeadPair(const AttentionSpan& kv, int32_t pos0, const float* q0, const float* q1,
                    float scale, float* out0, float* out1, float* scores) {
  AttendHeadPairWithIsa(WidestIsa(), kv, pos0, q0, q1, scale, out0, out1, scores);
}

void AttendRowWithIsa(KernelIsaKind isa, const AttentionSpan& kv, size_t n_head, const float* q,
                      float scale, float* out, float* scores) {
  AttendFor<AttendRowFns>(isa, kv.pool->dtype())(kv, n_head, q, scale, out, scores);
}

void AttendRow(const AttentionSpan& kv, size_t n_head, const float* q, float scale, float* out,
               float* scores) {
  AttendRowWithIsa(WidestIsa(), kv, n_head, q, scale, out, scores);
}

}  // namespace tandem::model::internal
