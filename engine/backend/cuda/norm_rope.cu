// Row kernels of cuda_kernels.h: embedding lookup, RMSNorm, and the bias
// add + RoPE on the fused QKV rows. Each follows the CPU engine's float
// operations (cpu_kernels.h: RmsNorm, RopeAngles, RopeApply,
// RopeApplyNeox, AddBias) with products and sums rounded separately
// (__fmul_rn / __fadd_rn: never contracted into an FMA), so the results
// track the CPU backend's to a few ulp; RMSNorm's sum of squares is in
// double like the CPU's, but added in a fixed tree instead of index order.
#include <cuda_runtime.h>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/kernel_util.cuh"

namespace tandem::backend::cuda {
namespace {

using internal::DispatchDtype;
using internal::FromF32;
using internal::ToF32;

constexpr unsigned kRowThreads = 256;  // a power of two (the norm's tree)

template <typename T>
__global__ void EmbeddingKernel(const int32_t* ids, const T* table, int32_t n_embd, float* x) {
  const size_t t = blockIdx.x;
  const T* row = table + static_cast<size_t>(ids[t]) * static_cast<size_t>(n_embd);
  float* out = x + t * static_cast<size_t>(n_embd);
  for (int32_t i = threadIdx.x; i < n_embd; i += blockDim.x) out[i] = ToF32(row[i]);
}

// One block of kRowThreads per output row. Thread j sums x[i]^2 in double
// for i = j, j + kRowThreads, ... ascending; the kRowThreads partial sums
// are then added in a fixed binary tree (j + s into j for s = 128, 64, ...,
// 1). The order depends only on n.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    RmsNormKernel(const float* x, const int32_t* rows, int32_t n, const float* weight, float eps,
                  T* out) {
  __shared__ double partial[kRowThreads];
  const size_t i_out = blockIdx.x;
  const size_t r = rows != nullptr ? static_cast<size_t>(rows[i_out]) : i_out;
  const float* xr = x + r * static_cast<size_t>(n);
  double sum = 0.0;
  for (int32_t i = threadIdx.x; i < n; i += kRowThreads) {
    const double v = xr[i];
    sum = __dadd_rn(sum, __dmul_rn(v, v));
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned s = kRowThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] = partial[threadIdx.x] + partial[threadIdx.x + s];
    __syncthreads();
  }
  const float mean = static_cast<float>(partial[0] / static_cast<double>(n));
  const float scale = 1.0f / sqrtf(mean + eps);
  T* yr = out + i_out * static_cast<size_t>(n);
  for (int32_t i = threadIdx.x; i < n; i += kRowThreads) {
    yr[i] = FromF32<T>(__fmul_rn(__fmul_rn(xr[i], scale), weight[i]));
  }
}

// One block per token. First the token's angles into shared memory, in
// double as RopeAngles computes them: cs[2i] = cos(theta_i), cs[2i + 1] =
// sin(theta_i), theta_i = pos * base^(-2i / rope_dim) (/ freq_factors[i]).
// Then every element of the row once: the owner of a rotated pair adds
// both biases and rotates (NORM: pair (2i, 2i + 1); NEOX: (i, i + half));
// every other element (dims past the rotated ones, the V part) only gets
// its bias.
__global__ void BiasRopeKernel(float* qkv, const int32_t* positions, const float* bias,
                               int32_t n_rope_heads, int32_t width, int32_t head_dim,
                               int32_t rope_dim, bool neox, float freq_base,
                               const float* freq_factors) {
  extern __shared__ float cs[];  // [2 * n_pairs]
  const int32_t n_pairs = rope_dim / 2;
  const size_t t = blockIdx.x;
  const double pos = static_cast<double>(positions[t]);
  for (int32_t i = threadIdx.x; i < n_pairs; i += blockDim.x) {
    double theta = pos * pow(static_cast<double>(freq_base),
                             -2.0 * static_cast<double>(i) / static_cast<double>(rope_dim));
    if (freq_factors != nullptr) theta = theta / static_cast<double>(freq_factors[i]);
    double s, c;
    sincos(theta, &s, &c);
    cs[2 * i] = static_cast<float>(c);
    cs[2 * i + 1] = static_cast<float>(s);
  }
  __syncthreads();
  float* row = qkv + t * static_cast<size_t>(width);
  const int32_t rope_width = n_rope_heads * head_dim;  // the q and k heads
  for (int32_t e = threadIdx.x; e < width; e += blockDim.x) {
    const int32_t d = e % head_dim;
    int32_t partner = -1;  // the pair's second element when this thread owns a pair
    int32_t pair = 0;
    if (e < rope_width && d < 2 * n_pairs) {
      if (neox) {
        if (d >= n_pairs) continue;  // owned by the thread at d - n_pairs
        pair = d;
        partner = e + n_pairs;
      } else {
        if (d % 2 != 0) continue;  // owned by the thread at d - 1
        pair = d / 2;
        partner = e + 1;
      }
    }
    float x0 = row[e];
    if (bias != nullptr) x0 = __fadd_rn(x0, bias[e]);
    if (partner < 0) {
      row[e] = x0;
      continue;
    }
    float x1 = row[partner];
    if (bias != nullptr) x1 = __fadd_rn(x1, bias[partner]);
    const float c = cs[2 * pair], s = cs[2 * pair + 1];
    row[e] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    row[partner] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
}

}  // namespace

cudaError_t LaunchEmbedding(const int32_t* ids, int32_t n_tokens, const void* table,
                            Dtype table_dtype, int32_t n_embd, float* x, cudaStream_t stream) {
  if (n_tokens < 0 || n_embd < 0) return cudaErrorInvalidValue;
  if (n_tokens == 0 || n_embd == 0) return cudaSuccess;
  return DispatchDtype(table_dtype, [&](auto tag) {
    using T = decltype(tag);
    EmbeddingKernel<T><<<static_cast<unsigned>(n_tokens), kRowThreads, 0, stream>>>(
        ids, static_cast<const T*>(table), n_embd, x);
    return cudaGetLastError();
  });
}

cudaError_t LaunchRmsNorm(const float* x, const int32_t* rows, int32_t n_rows, int32_t n,
                          const float* weight, float eps, void* out, Dtype out_dtype,
                          cudaStream_t stream) {
  if (n_rows < 0 || n <= 0) return cudaErrorInvalidValue;
  if (n_rows == 0) return cudaSuccess;
  return DispatchDtype(out_dtype, [&](auto tag) {
    using T = decltype(tag);
    RmsNormKernel<T><<<static_cast<unsigned>(n_rows), kRowThreads, 0, stream>>>(
        x, rows, n, weight, eps, static_cast<T*>(out));
    return cudaGetLastError();
  });
}

cudaError_t LaunchBiasRope(float* qkv, int32_t n_tokens, const int32_t* positions,
                           const float* bias, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                           int32_t rope_dim, model::RopeType rope_type, float freq_base,
                           const float* freq_factors, cudaStream_t stream) {
  if (n_tokens < 0 || n_head <= 0 || n_head_kv <= 0 || head_dim <= 0 || rope_dim < 0 ||
      rope_dim > head_dim || !(freq_base > 0.0f)) {
    return cudaErrorInvalidValue;
  }
  if (n_tokens == 0) return cudaSuccess;
  const int32_t width = (n_head + 2 * n_head_kv) * head_dim;
  const size_t shared = static_cast<size_t>(rope_dim / 2) * 2 * sizeof(float);
  BiasRopeKernel<<<static_cast<unsigned>(n_tokens), kRowThreads, shared, stream>>>(
      qkv, positions, bias, n_head + n_head_kv, width, head_dim, rope_dim,
      rope_type == model::RopeType::kNeox, freq_base, freq_factors);
  return cudaGetLastError();
}

}  // namespace tandem::backend::cuda
