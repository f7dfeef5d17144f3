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
      return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                     15);
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
[[gnu::always_inline]] inline const typename E::T* KRows(const AttentionSpan& kv,
                                                         int32_t block) {
  return reinterpret_cast<const typename E::T*>(kv.pool->KData(block, kv.layer));
}
template <typename E>
[[gnu::always_inline]] inline const typename E::T* VRows(const AttentionSpan& kv,
                                                         int32_t block) {
  return reinterpret_cast<const typename E::T*>(kv.pool->VData(block, kv.layer));
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

// out[d] for d < kChunk: sum_j p_j * v_j[d] over j ascending, with p_j =
// scores[j] * inv, the kChunk sums held in registers across all j (the
// compiler unrolls the fixed-size inner loop). v_j[d] = V(block of j)[row j
// % block_size][kv_off + d].
template <typename E, size_t kChunk>
[[gnu::always_inline]] inline void AccumulateValues(const AttentionSpan& kv, size_t kv_off,
                                                    const float* scores, float inv,
                                                    float* out) {
  const kv::KvShape& s = kv.pool->shape();
  const size_t kv_dim = static_cast<size_t>(s.n_kv_heads) * static_cast<size_t>(s.head_dim);
  float acc[kChunk] = {};
  for (int32_t j0 = 0; j0 <= kv.pos; j0 += s.block_size) {
    const typename E::T* v =
        VRows<E>(kv, kv.block_table[static_cast<size_t>(j0 / s.block_size)]) + kv_off;
    const int32_t j1 = std::min(j0 + s.block_size, kv.pos + 1);
    for (int32_t j = j0; j < j1; ++j, v += kv_dim) {
      const float p = scores[j] * inv;
      if constexpr (std::is_same_v<typename E::T, float>) {
        for (size_t d = 0; d < kChunk; ++d) acc[d] = acc[d] + p * v[d];
      } else {
        float vf[kChunk];
        WidenChunk<E, kChunk>(v, vf);
        for (size_t d = 0; d < kChunk; ++d) acc[d] = acc[d] + p * vf[d];
      }
    }
  }
  for (size_t d = 0; d < kChunk; ++d) out[d] = acc[d];
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

// out[t] = a . b[t] for t < kKeys with the lanes of V (Float8 or Float16):
// kKeys independent lane sets in one pass over a, so their add chains
// overlap.
template <typename E, typename V, int kKeys>
[[gnu::always_inline]] inline void DotLanesOf(const float* a, const typename E::T* const* b,
                                              size_t n, float* out) {
  constexpr size_t kWidth = sizeof(V) / sizeof(float);
  V acc[kKeys] = {};
  const size_t nw = n - n % kWidth;
  for (size_t i = 0; i < nw; i += kWidth) {
    V va;
    std::memcpy(&va, a + i, sizeof va);
    for (int t = 0; t < kKeys; ++t) {
      const V vb = E::template Load<V>(b[t] + i);
      acc[t] = acc[t] + va * vb;
    }
  }
  for (int t = 0; t < kKeys; ++t) {
    float sum = CombineLanes(Fold(acc[t]));
    for (size_t i = nw; i < n; ++i) sum += a[i] * E::One(b[t] + i);
    out[t] = sum;
  }
}

// out[t] = a . b[t] for t < kKeys in the order attention.h documents:
// 16 lanes when n >= 16, else 8.
template <typename E, int kKeys>
[[gnu::always_inline]] inline void DotLanes(const float* a, const typename E::T* const* b,
                                            size_t n, float* out) {
  if (n >= 16) return DotLanesOf<E, Float16, kKeys>(a, b, n, out);
  DotLanesOf<E, Float8, kKeys>(a, b, n, out);
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
  Int8 n = __builtin_convertvector(fx, Int8);  // toward zero
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

template <typename E>
[[gnu::always_inline]] inline void Attend(const AttentionSpan& kv, const float* q,
                                          float scale, float* out, float* scores) {
  const kv::KvShape& s = kv.pool->shape();
  const size_t hd = static_cast<size_t>(s.head_dim);
  const size_t kv_dim = static_cast<size_t>(s.n_kv_heads) * hd;
  const size_t kv_off = static_cast<size_t>(kv.kv_head) * hd;
  // Positions are walked block by block (j ascending), so the pool is
  // asked for each block's rows once.
  float max = -INFINITY;
  for (int32_t j0 = 0; j0 <= kv.pos; j0 += s.block_size) {
    const typename E::T* k =
        KRows<E>(kv, kv.block_table[static_cast<size_t>(j0 / s.block_size)]) + kv_off;
    const int32_t j1 = std::min(j0 + s.block_size, kv.pos + 1);
    int32_t j = j0;
    for (; j + 4 <= j1; j += 4, k += 4 * kv_dim) {
      const typename E::T* keys[4] = {k, k + kv_dim, k + 2 * kv_dim, k + 3 * kv_dim};
      DotLanes<E, 4>(q, keys, hd, &scores[j]);
    }
    for (; j < j1; ++j, k += kv_dim) DotLanes<E, 1>(q, &k, hd, &scores[j]);
    for (j = j0; j < j1; ++j) {
      scores[j] = scores[j] * scale;
      max = std::max(max, scores[j]);
    }
  }
  const float inv = static_cast<float>(1.0 / ExpAndSum(scores, kv.pos + 1, max));
  // Chunks of 64, 32, 16, 8 and 1 output elements; each element's sum is
  // the same whichever chunk holds it.
  size_t d = 0;
  for (; d + 64 <= hd; d += 64) AccumulateValues<E, 64>(kv, kv_off + d, scores, inv, out + d);
  if (d + 32 <= hd) AccumulateValues<E, 32>(kv, kv_off + d, scores, inv, out + d), d += 32;
  if (d + 16 <= hd) AccumulateValues<E, 16>(kv, kv_off + d, scores, inv, out + d), d += 16;
  if (d + 8 <= hd) AccumulateValues<E, 8>(kv, kv_off + d, scores, inv, out + d), d += 8;
  for (; d < hd; ++d) AccumulateValues<E, 1>(kv, kv_off + d, scores, inv, out + d);
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
  for (int32_t j0 = 0; j0 <= kv.pos; j0 += s.block_size) {
    const typename E::T* k = KRows<E>(kv, kv.block_table[static_cast<size_t>(j0 / s.block_size)]);
    const int32_t j1 = std::min(j0 + s.block_size, kv.pos + 1);
    int32_t j = j0;
    for (; j + 4 <= j1; j += 4, k += 4 * kv_dim) {
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
    float max = -INFINITY;
    for (size_t j = 0; j < n; ++j) {
      sh[j] = sh[j] * scale;
      max = std::max(max, sh[j]);
    }
    inv[h] = static_cast<float>(1.0 / ExpAndSum(sh, kv.pos + 1, max));
    std::fill(out + h * hd, out + (h + 1) * hd, 0.0f);
  }
  for (int32_t j0 = 0; j0 <= kv.pos; j0 += s.block_size) {
    const typename E::T* v = VRows<E>(kv, kv.block_table[static_cast<size_t>(j0 / s.block_size)]);
    const int32_t j1 = std::min(j0 + s.block_size, kv.pos + 1);
    for (int32_t j = j0; j < j1; ++j, v += kv_dim) {
      for (size_t h = 0; h < n_head; ++h) {
        const float p = scores[h * n + static_cast<size_t>(j)] * inv[h];
        AddScaledRow<E>(v + (h / group) * hd, hd, p, out + h * hd);
      }
    }
  }
}

template <typename E>
void AttendGeneric(const AttentionSpan& kv, const float* q, float scale, float* out,
                   float* scores) {
  Attend<E>(kv, q, scale, out, scores);
}

template <typename E>
void AttendAllHeadsGeneric(const AttentionSpan& kv, size_t n_head, const float* q,
                           float scale, float* out, float* scores) {
  AttendAllHeads<E>(kv, n_head, q, scale, out, scores);
}

#ifdef TANDEM_ATTENTION_X86
template <typename E>
[[gnu::flatten]] __attribute__((target("avx2,fma,f16c"))) void AttendAvx2(
    const AttentionSpan& kv, const float* q, float scale, float* out, float* scores) {
  Attend<E>(kv, q, scale, out, scores);
}

template <typename E>
[[gnu::flatten]] __attribute__((target("avx512f,avx2,fma,f16c"))) void AttendAvx512(
    const AttentionSpan& kv, const float* q, float scale, float* out, float* scores) {
  Attend<E>(kv, q, scale, out, scores);
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

// The entry points of one kernel (Attend or AttendAllHeads) for each ISA
// and dtype.
struct AttendHeadFns {
  using Fn = void (*)(const AttentionSpan&, const float*, float, float*, float*);
  template <typename E> static constexpr Fn kGeneric = AttendGeneric<E>;
#ifdef TANDEM_ATTENTION_X86
  template <typename E> static constexpr Fn kAvx2 = AttendAvx2<E>;
  template <typename E> static constexpr Fn kAvx512 = AttendAvx512<E>;
#endif
};
struct AttendRowFns {
  using Fn = void (*)(const AttentionSpan&, size_t, const float*, float, float*, float*);
  template <typename E> static constexpr Fn kGeneric = AttendAllHeadsGeneric<E>;
#ifdef TANDEM_ATTENTION_X86
  template <typename E> static constexpr Fn kAvx2 = AttendAllHeadsAvx2<E>;
  template <typename E> static constexpr Fn kAvx512 = AttendAllHeadsAvx512<E>;
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
        case kv::KvDtype::kF32: return Fns::template kAvx512<F32Elems>;
        case kv::KvDtype::kF16: return Fns::template kAvx512<F16Avx512Elems>;
        case kv::KvDtype::kBF16: return Fns::template kAvx512<Bf16Elems>;
      }
      break;
    case KernelIsaKind::kAvx2:
      switch (dtype) {
        case kv::KvDtype::kF32: return Fns::template kAvx2<F32Elems>;
        case kv::KvDtype::kF16: return Fns::template kAvx2<F16Avx2Elems>;
        case kv::KvDtype::kBF16: return Fns::template kAvx2<Bf16Elems>;
      }
      break;
#endif
    default:
      break;
  }
  switch (dtype) {
    case kv::KvDtype::kF32: return Fns::template kGeneric<F32Elems>;
    case kv::KvDtype::kF16: return Fns::template kGeneric<F16Elems>;
    case kv::KvDtype::kBF16: return Fns::template kGeneric<Bf16Elems>;
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

void AttendHeadWithIsa(KernelIsaKind isa, const AttentionSpan& kv, const float* q,
                       float scale, float* out, float* scores) {
  AttendFor<AttendHeadFns>(isa, kv.pool->dtype())(kv, q, scale, out, scores);
}

void AttendHead(const AttentionSpan& kv, const float* q, float scale, float* out,
                float* scores) {
  AttendHeadWithIsa(WidestIsa(), kv, q, scale, out, scores);
}

void AttendRowWithIsa(KernelIsaKind isa, const AttentionSpan& kv, size_t n_head,
                      const float* q, float scale, float* out, float* scores) {
  AttendFor<AttendRowFns>(isa, kv.pool->dtype())(kv, n_head, q, scale, out, scores);
}

void AttendRow(const AttentionSpan& kv, size_t n_head, const float* q, float scale,
               float* out, float* scores) {
  AttendRowWithIsa(WidestIsa(), kv, n_head, q, scale, out, scores);
}

}  // namespace tandem::model::internal
