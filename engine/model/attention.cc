#include "engine/model/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#define TANDEM_ATTENTION_X86 1
#endif

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

// out[t] = Dot(a, b[t], n) for t < kKeys: kKeys independent lane sets in
// one pass over a, so their add chains overlap.
template <int kKeys>
[[gnu::always_inline]] inline void DotLanes(const float* a, const float* const* b, size_t n,
                                            float* out) {
  Float8 acc[kKeys] = {};
  const size_t n8 = n - n % 8;
  for (size_t i = 0; i < n8; i += 8) {
    const Float8 va = Load8(a + i);
    for (int t = 0; t < kKeys; ++t) acc[t] = acc[t] + va * Load8(b[t] + i);
  }
  for (int t = 0; t < kKeys; ++t) {
    float sum = CombineLanes(acc[t]);
    for (size_t i = n8; i < n; ++i) sum += a[i] * b[t][i];
    out[t] = sum;
  }
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
  double sum = 0.0;
  for (int32_t j = 0; j <= kv.pos; ++j) {
    const float e = std::exp(scores[j] - max);
    scores[j] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / sum);
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
