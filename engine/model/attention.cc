#include "engine/model/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#define TANDEM_ATTENTION_X86 1
#endif

// The 8-float vector type below is only passed between inlined functions
// of this file, so GCC's note on its ABI (-Wpsabi) does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tandem::model::internal {
namespace {

// out[d] for d < kChunk: sum_j p_j * v_j[d] over j ascending, with p_j =
// scores[j] * inv, the kChunk sums held in registers across all j (the
// compiler unrolls the fixed-size inner loop). v_j[d] = V(block of j)[row j
// % block_size][kv_off + d].
template <size_t kChunk>
[[gnu::always_inline]] inline void AccumulateValues(const AttentionSpan& kv, size_t kv_off,
                                                    const float* scores, float inv,
                                                    float* out) {
  const kv::KvShape& s = kv.pool->shape();
  const size_t kv_dim = static_cast<size_t>(s.n_kv_heads) * static_cast<size_t>(s.head_dim);
  float acc[kChunk] = {};
  for (int32_t j0 = 0; j0 <= kv.pos; j0 += s.block_size) {
    const float* v =
        kv.pool->V(kv.block_table[static_cast<size_t>(j0 / s.block_size)], kv.layer) + kv_off;
    const int32_t j1 = std::min(j0 + s.block_size, kv.pos + 1);
    for (int32_t j = j0; j < j1; ++j, v += kv_dim) {
      const float p = scores[j] * inv;
      for (size_t d = 0; d < kChunk; ++d) acc[d] = acc[d] + p * v[d];
    }
  }
  for (size_t d = 0; d < kChunk; ++d) out[d] = acc[d];
}

// Dot (cpu_kernels.h) written with an 8-float vector type, so that each
// ISA build holds the 8 lanes in one or two registers: lane j sums
// a[i] * b[i] for i = j mod 8 (multiply, then add), the lanes combine as
// ((0+4)+(2+6))+((1+5)+(3+7)), then the tail in index order. Same bits as
// Dot.
typedef float Float8 __attribute__((vector_size(32)));

[[gnu::always_inline]] inline float CombineLanes(Float8 acc) {
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

[[gnu::always_inline]] inline Float8 Load8(const float* p) {
  Float8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

typedef float Float16 __attribute__((vector_size(64)));

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
template <typename V, int kKeys>
[[gnu::always_inline]] inline void DotLanesOf(const float* a, const float* const* b, size_t n,
                                              float* out) {
  constexpr size_t kWidth = sizeof(V) / sizeof(float);
  V acc[kKeys] = {};
  const size_t nw = n - n % kWidth;
  for (size_t i = 0; i < nw; i += kWidth) {
    V va;
    std::memcpy(&va, a + i, sizeof va);
    for (int t = 0; t < kKeys; ++t) {
      V vb;
      std::memcpy(&vb, b[t] + i, sizeof vb);
      acc[t] = acc[t] + va * vb;
    }
  }
  for (int t = 0; t < kKeys; ++t) {
    float sum = CombineLanes(Fold(acc[t]));
    for (size_t i = nw; i < n; ++i) sum += a[i] * b[t][i];
    out[t] = sum;
  }
}

// out[t] = a . b[t] for t < kKeys in the order attention.h documents:
// 16 lanes when n >= 16, else 8.
template <int kKeys>
[[gnu::always_inline]] inline void DotLanes(const float* a, const float* const* b, size_t n,
                                            float* out) {
  if (n >= 16) return DotLanesOf<Float16, kKeys>(a, b, n, out);
  DotLanesOf<Float8, kKeys>(a, b, n, out);
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
    const float* k =
        kv.pool->K(kv.block_table[static_cast<size_t>(j0 / s.block_size)], kv.layer) + kv_off;
    const int32_t j1 = std::min(j0 + s.block_size, kv.pos + 1);
    int32_t j = j0;
    for (; j + 4 <= j1; j += 4, k += 4 * kv_dim) {
      const float* keys[4] = {k, k + kv_dim, k + 2 * kv_dim, k + 3 * kv_dim};
      DotLanes<4>(q, keys, hd, &scores[j]);
    }
    for (; j < j1; ++j, k += kv_dim) DotLanes<1>(q, &k, hd, &scores[j]);
    for (j = j0; j < j1; ++j) {
      scores[j] = scores[j] * scale;
      max = std::max(max, scores[j]);
    }
  }
  const float inv = static_cast<float>(1.0 / ExpAndSum(scores, kv.pos + 1, max));
  // Chunks of 64, 32, 16, 8 and 1 output elements; each element's sum is
  // the same whichever chunk holds it.
  size_t d = 0;
  for (; d + 64 <= hd; d += 64) AccumulateValues<64>(kv, kv_off + d, scores, inv, out + d);
  if (d + 32 <= hd) AccumulateValues<32>(kv, kv_off + d, scores, inv, out + d), d += 32;
  if (d + 16 <= hd) AccumulateValues<16>(kv, kv_off + d, scores, inv, out + d), d += 16;
  if (d + 8 <= hd) AccumulateValues<8>(kv, kv_off + d, scores, inv, out + d), d += 8;
  for (; d < hd; ++d) AccumulateValues<1>(kv, kv_off + d, scores, inv, out + d);
}

void AttendGeneric(const AttentionSpan& kv, const float* q, float scale, float* out,
                   float* scores) {
  Attend(kv, q, scale, out, scores);
}

#ifdef TANDEM_ATTENTION_X86
__attribute__((target("avx2,fma"))) void AttendAvx2(const AttentionSpan& kv, const float* q,
                                                float scale, float* out, float* scores) {
  Attend(kv, q, scale, out, scores);
}

__attribute__((target("avx512f,avx2,fma"))) void AttendAvx512(const AttentionSpan& kv,
                                                          const float* q, float scale,
                                                          float* out, float* scores) {
  Attend(kv, q, scale, out, scores);
}
#endif

using AttendFn = void (*)(const AttentionSpan&, const float*, float, float*, float*);

AttendFn AttendFor(KernelIsaKind isa) {
  switch (KernelIsaSupported(isa) ? isa : KernelIsaKind::kGeneric) {
#ifdef TANDEM_ATTENTION_X86
    case KernelIsaKind::kAvx512:
      return AttendAvx512;
    case KernelIsaKind::kAvx2:
      return AttendAvx2;
#endif
    default:
      return AttendGeneric;
  }
}

}  // namespace

void AttendHeadWithIsa(KernelIsaKind isa, const AttentionSpan& kv, const float* q,
                       float scale, float* out, float* scores) {
  AttendFor(isa)(kv, q, scale, out, scores);
}

void AttendHead(const AttentionSpan& kv, const float* q, float scale, float* out,
                float* scores) {
  static const AttendFn fn = [] {
    for (KernelIsaKind isa : {KernelIsaKind::kAvx512, KernelIsaKind::kAvx2}) {
      if (KernelIsaSupported(isa)) return AttendFor(isa);
    }
    return AttendFor(KernelIsaKind::kGeneric);
  }();
  fn(kv, q, scale, out, scores);
}

}  // namespace tandem::model::internal
