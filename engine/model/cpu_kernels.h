// Batch-invariant CPU kernels for the Llama forward pass (internal to
// engine/model).
//
// Every output element is computed by one fixed sequence of float
// operations that depends only on that element's own inputs, never on how
// many rows are in the batch (DESIGN.md, Engine: batch-invariant numerics):
// no BLAS, no reduction split across threads or rows, no FMA contraction
// (-ffp-contract=off; MatMul's fused multiply-adds are explicit, with one
// ISA per process, see KernelIsaKind). Threads may split a kernel's output
// elements among themselves (MatMul's `pool`), which changes who computes an
// element, never how. Matrices are row-major; a weight matrix W with GGUF
// dims [in, out] is `out` contiguous rows of `in` floats.
// Threads: pure functions over caller-owned buffers (MatMul with a pool
// blocks until every thread is done).
#ifndef TANDEM_ENGINE_MODEL_CPU_KERNELS_H_
#define TANDEM_ENGINE_MODEL_CPU_KERNELS_H_

#include <cstddef>

#include "engine/model/thread_pool.h"
#include "engine/model/weight_matrix.h"

namespace tandem::model::internal {

// sum_i a[i] * b[i] in float with 8 interleaved partial sums (lane j takes
// the elements i = j mod 8 of the first n - n % 8), combined pairwise
// ((0+4)+(2+6)) + ((1+5)+(3+7)), then the tail added in index order. The
// order depends on n alone, and the lanes are independent, so the compiler
// may vectorize it without reassociating anything. Inline so that short
// dots (attention's head_dim) inline into their loops.
inline float Dot(const float* a, const float* b, size_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const size_t n8 = n - n % 8;
  for (size_t i = 0; i < n8; i += 8) {
    for (size_t j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
  for (size_t i = n8; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Least work (multiply-adds, or a rough equivalent for other element
// operations) for which the forward pass splits a kernel across threads;
// below it, waking the workers costs about as much as it saves (64K
// multiply-adds take ~10-20 us on one core). Never affects the bits.
inline constexpr size_t kMinParallelWork = size_t{1} << 16;

// The instruction set MatMul runs on. Each has its own per-element order,
// fixed for n = in (w[o] and x[r] as a and b, i < n):
//   kGeneric: Dot(w[o], x[r], in), exactly (products rounded, then added).
//   kAvx2:    8 lanes, lane j = fma(a[i], b[i], lane j) for i = j mod 8 of
//             the first n - n % 8 (fma: one rounding), combined as Dot's
//             lanes; then the tail in index order as sum = sum + a[i] * b[i].
//   kAvx512:  16 lanes of fma as above over the first n - n % 16; the 8
//             values lane j + lane (j + 8), combined as Dot's lanes; then
//             the tail as in kAvx2.
// The ISAs differ in their bits (fma rounds once), so one process uses one
// ISA for every MatMul (ActiveKernelIsa); within an ISA an element's bits
// never depend on rows, tiling or threads.
enum class KernelIsaKind { kGeneric, kAvx2, kAvx512 };

// The best ISA this CPU and OS support (AVX-512F, else AVX2 with FMA; both
// with F16C, which every such CPU has; else
// generic), detected once per process; MatMul and MatMulColumns use it.
KernelIsaKind ActiveKernelIsa();

// "generic", "avx2" or "avx512": the name of `isa`.
const char* KernelIsaName(KernelIsaKind isa);

// KernelIsaName(ActiveKernelIsa()): names the MatMul numerics of this
// process (for the KV numerics id).
const char* KernelIsa();

// Whether MatMulColumnsWithIsa can run `isa` here (kGeneric always).
bool KernelIsaSupported(KernelIsaKind isa);

// Makes `isa` the process's ActiveKernelIsa (engine.kernel_isa). Must run
// before the first MatMul/ActiveKernelIsa call; false when this CPU cannot
// run `isa` or another ISA is already in use.
bool PinKernelIsa(KernelIsaKind isa);

// y[r][o] = the `isa` order above of W[o] (as F32, see weight_matrix.h)
// and x[r], for r < rows and o in [o_begin, o_end); other columns of y are
// left as they are. Register tiles of several rows and columns reuse each
// weight load across rows; every element still follows its own order
// alone. An unsupported `isa` runs kGeneric. For tests and benchmarks; the
// engine calls MatMul. x: [rows][w.in], y: [rows][w.out].
void MatMulColumnsWithIsa(KernelIsaKind isa, const float* x, const WeightMatrix& w, size_t rows,
                          size_t o_begin, size_t o_end, float* y);

// The same over an F32 matrix w: [out][in].
void MatMulColumnsWithIsa(KernelIsaKind isa, const float* x, const float* w, size_t rows, size_t in,
                          size_t out, size_t o_begin, size_t o_end, float* y);

// MatMulColumnsWithIsa(ActiveKernelIsa(), ...) over an F32 matrix.
void MatMulColumns(const float* x, const float* w, size_t rows, size_t in, size_t out,
                   size_t o_begin, size_t o_end, float* y);

// y[r][o] = W[o] . x[r] in the ActiveKernelIsa() order, for r < rows,
// o < w.out, W in its storage type (F32, F16, BF16, Q8_0; each gives the
// bits of its F32 conversion). When w.int8 is set (a Q8_0 matrix under
// engine.q8_matmul: int8), MatMulInt8 (q8_int8.h) instead: x quantized to
// Q8_0 per block, integer dot products, its own bit-exact class. x: [rows][w.in], y: [rows][w.out]. When
// `pool` has more than one thread and rows * in * out >= min_work, the
// output columns are split into contiguous ranges, one per thread
// (ThreadPool::ParallelFor); the reduction over `in` never is. Each element
// follows its ISA's order either way, so y's bits do not depend on rows,
// the pool or min_work.
void MatMul(const float* x, const WeightMatrix& w, size_t rows, float* y,
            ThreadPool* pool = nullptr, size_t min_work = kMinParallelWork);

// MatMul over an F32 matrix w: [out][in].
void MatMul(const float* x, const float* w, size_t rows, size_t in, size_t out, float* y,
            ThreadPool* pool = nullptr, size_t min_work = kMinParallelWork);

// llama.cpp's ggml_rms_norm followed by the weight multiply, per row:
// y = (x * (1 / sqrt(mean(x^2) + eps))) * weight, the sum of squares in
// double in index order. x, y: [rows][n] (may alias); weight: [n].
void RmsNorm(const float* x, const float* weight, size_t rows, size_t n, float eps, float* y);

// RoPE (llama.cpp's ggml_rope_ext without YaRN: freq_scale 1, ext_factor
// 0, attn_factor 1), split in two so that the angles of a position are
// computed once for all layers:
// RopeAngles writes cs[2i] = cos(theta_i), cs[2i + 1] = sin(theta_i) for
// 2i < rope_dim, theta_i = pos * freq_base^(-2i / rope_dim) / f_i, with
// f_i = freq_factors[i] when freq_factors is not null (rope_freqs.weight,
// rope_dim / 2 values > 0; ggml's rope cache divides theta by them the same
// way), else no division; in double, rounded to float. cs: [rope_dim].
void RopeAngles(int pos, size_t rope_dim, float freq_base, const float* freq_factors, float* cs);

// NORM mode (GGML_ROPE_TYPE_NORM): for each of n_heads heads of head_dim
// floats in `x`, rotates the pairs (2i, 2i + 1) for 2i < rope_dim by the
// angles of RopeAngles:
//   x0' = x0 cos - x1 sin,  x1' = x0 sin + x1 cos.
// Dimensions >= rope_dim are left as they are.
void RopeApply(float* x, size_t n_heads, size_t head_dim, size_t rope_dim, const float* cs);

// NEOX mode (GGML_ROPE_TYPE_NEOX): the same rotation of pair i by
// theta_i, but pair i is (i, i + rope_dim / 2) for i < rope_dim / 2 (ggml's
// rotate_pairs with stride n_dims / 2). Dimensions >= rope_dim are left as
// they are.
void RopeApplyNeox(float* x, size_t n_heads, size_t head_dim, size_t rope_dim, const float* cs);

// x[r * n + i] += b[i] for r < rows, i < n: a bias vector added to every
// row (ggml_add broadcasting b), one rounding per element.
void AddBias(float* x, const float* b, size_t rows, size_t n);

// a[i] = SiLU(a[i]) * b[i], SiLU(v) = v / (1 + exp(-v)).
void SwiGlu(float* a, const float* b, size_t n);

// x[i] += y[i].
void AddInPlace(float* x, const float* y, size_t n);

}  // namespace tandem::model::internal

#endif  // TANDEM_ENGINE_MODEL_CPU_KERNELS_H_
