// Causal self-attention of one query head over a paged KV cache (internal
// to engine/model): the decode and prefill attention of LlamaModel::Forward.
//
// Numerics (batch-invariant, DESIGN.md): for a query at position `pos`,
//   s_j = (q . k_j) * scale, j <= pos: for head_dim >= 16, 16 lanes (lane l
//         sums q[i] k[i] for i = l mod 16 over the first head_dim -
//         head_dim % 16, multiply then add), folded as lane l + lane l + 8,
//         the 8 combined ((0+4)+(2+6))+((1+5)+(3+7)), then the tail in index
//         order; for head_dim < 16, cpu_kernels.h's Dot (8 lanes)
//   e_j = exp(s_j - max_j s_j)           (Cephes expf polynomial, no FMA)
//   sum = sum_j e_j in double, 4 lanes (lane l: j = l mod 4, ascending),
//         combined (l0 + l2) + (l1 + l3)
//   out[d] = sum_j (e_j * (1 / sum)) * v_j[d], j ascending from 0.0f
// where k_j and v_j are the cache's rows widened exactly to F32 (an F16 or
// BF16 cache, kv::CpuKvStorage's dtype, is widened 8 or 16 elements at a
// time in registers as they are read: F16C's VCVTPH2PS in the AVX2 and
// AVX-512 builds, gguf::HalfToFloat in the portable one, bits << 16 for
// BF16; no F32 copy of the cache is made), so a 16-bit cache reads half
// the bytes and changes the values, never the arithmetic order.
// Every step depends only on pos and the values, never on the batch, the
// thread, the instruction set or the widening path: the AVX2 / AVX-512 builds of this code
// keep each output element's products and sums (no FMA: -ffp-contract=off)
// and differ from the portable build only in holding `out` in vector
// registers, so all three give the same bits.
// Threads: pure function over caller-owned memory; the pool is read only.
#ifndef TANDEM_ENGINE_MODEL_ATTENTION_H_
#define TANDEM_ENGINE_MODEL_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/kv/cpu_kv_storage.h"
#include "engine/model/cpu_kernels.h"

namespace tandem::model::internal {

// Where one query head reads its keys and values: KV head `kv_head` of
// layer `layer`, positions [0, pos] of the sequence whose block table is
// `block_table` (which must cover pos + 1 tokens).
struct AttentionSpan {
  const kv::CpuKvStorage* pool = nullptr;  // the KV cache memory, any dtype
  std::span<const int32_t> block_table;
  int32_t layer = 0;
  int32_t kv_head = 0;
  int32_t pos = 0;
};

// out[0, head_dim) = the attention above of query q[0, head_dim) (head_dim =
// the pool's head_dim) over `kv`, with scale = 1/sqrt(head_dim) given by
// the caller. scores: scratch of at least pos + 1 floats.
// Runs on the widest vector ISA this CPU has (any gives the same bits).
void AttendHead(const AttentionSpan& kv, const float* q, float scale, float* out, float* scores);

// AttendHead built for `isa` (kGeneric when this CPU cannot run it); for
// tests and benchmarks.
void AttendHeadWithIsa(KernelIsaKind isa, const AttentionSpan& kv, const float* q, float scale,
                       float* out, float* scores);

// AttendHead for two query rows of one head of one sequence: q0 at
// position pos0 and q1 at kv.pos (0 <= pos0 <= kv.pos). out0 and out1 get
// the same bits as AttendHead at pos0 and at kv.pos; the K and V rows
// both read (positions <= pos0) are loaded and widened once for the two,
// so a prefill chunk's rows, taken in pairs, read each head's K/V half as
// often. scores: scratch of at least 2 * (kv.pos + 1) floats.
void AttendHeadPair(const AttentionSpan& kv, int32_t pos0, const float* q0, const float* q1,
                    float scale, float* out0, float* out1, float* scores);

// AttendHeadPair built for `isa` (kGeneric when this CPU cannot run it);
// for tests and benchmarks.
void AttendHeadPairWithIsa(KernelIsaKind isa, const AttentionSpan& kv, int32_t pos0,
                           const float* q0, const float* q1, float scale, float* out0, float* out1,
                           float* scores);

// Every query head of one row: out[h * head_dim, (h + 1) * head_dim) =
// AttendHead of q + h * head_dim over KV head h / (n_head / n_kv_heads) of
// `kv` (kv.kv_head is ignored), for h < n_head (a multiple of the pool's
// n_kv_heads), with the same bits as those n_head AttendHead calls; it
// reads each K and V row of the span once, whole, instead of once per
// head (a decode row's attention then streams its KV blocks). scores:
// scratch of at least n_head * (pos + 2) floats.
void AttendRow(const AttentionSpan& kv, size_t n_head, const float* q, float scale, float* out,
               float* scores);

// AttendRow built for `isa` (kGeneric when this CPU cannot run it); for
// tests and benchmarks.
void AttendRowWithIsa(KernelIsaKind isa, const AttentionSpan& kv, size_t n_head, const float* q,
                      float scale, float* out, float* scores);

}  // namespace tandem::model::internal

#endif  // TANDEM_ENGINE_MODEL_ATTENTION_H_
