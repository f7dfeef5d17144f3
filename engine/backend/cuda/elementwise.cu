// Elementwise kernels of cuda_kernels.h: residual add, F32 conversion and
// SwiGLU. Each output element is one fixed sequence of float operations on
// its own inputs, so the bits never depend on the batch.
#include <cuda_runtime.h>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/kernel_util.cuh"

namespace tandem::backend::cuda {
namespace {

using internal::DispatchDtype;
using internal::FromF32;
using internal::GridStrideBlocks;

constexpr unsigned kThreads = 256;

__global__ void AddKernel(float* x, const float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

template <typename T>
__global__ void ConvertKernel(const float* in, size_t n, T* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = FromF32<T>(in[i]);
  }
}

// out[t][i] = (g / (1 + exp(-g))) * u, g = gate_up[t][i], u =
// gate_up[t][n_ff + i]: cpu_kernels.h's SwiGlu (IEEE division, expf, no
// contraction possible: no multiply feeds an add).
template <typename T>
__global__ void SwiGluKernel(const float* gate_up, size_t n_tokens, size_t n_ff, T* out) {
  const size_t n = n_tokens * n_ff;
  for (size_t e = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t t = e / n_ff, i = e % n_ff;
    const float g = gate_up[t * 2 * n_ff + i];
    const float u = gate_up[t * 2 * n_ff + n_ff + i];
    const float silu = g / (1.0f + expf(-g));
    out[e] = FromF32<T>(silu * u);
  }
}

}  // namespace

cudaError_t LaunchAdd(float* x, const float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddKernel<<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchConvertF32(const float* in, size_t n, void* out, Dtype out_dtype,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchDtype(out_dtype, [&](auto tag) {
    using T = decltype(tag);
    ConvertKernel<T>
        <<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(in, n, static_cast<T*>(out));
    return cudaGetLastError();
  });
}

cudaError_t LaunchSwiGlu(const float* gate_up, int32_t n_tokens, int32_t n_ff, void* out,
                         Dtype out_dtype, cudaStream_t stream) {
  if (n_tokens < 0 || n_ff < 0) return cudaErrorInvalidValue;
  const size_t n = static_cast<size_t>(n_tokens) * static_cast<size_t>(n_ff);
  if (n == 0) return cudaSuccess;
  return DispatchDtype(out_dtype, [&](auto tag) {
    using T = decltype(tag);
    SwiGluKernel<T><<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(
        gate_up, static_cast<size_t>(n_tokens), static_cast<size_t>(n_ff), static_cast<T*>(out));
    return cudaGetLastError();
  });
}

}  // namespace tandem::backend::cuda
