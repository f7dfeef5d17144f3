// Elementwise kernels of cuda_kernels.h: residual add and F32 conversion.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "engine/backend/cuda/cuda_kernels.h"

namespace tandem::backend::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void AddKernel(float* x, const float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

template <typename T>
__device__ T FromF32(float v);
template <>
__device__ float FromF32<float>(float v) { return v; }
template <>
__device__ __half FromF32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __nv_bfloat16 FromF32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void ConvertKernel(const float* in, size_t n, T* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = FromF32<T>(in[i]);
  }
}

unsigned GridFor(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);
}

}  // namespace

cudaError_t LaunchAdd(float* x, const float* y, size_t n, cudaStream_t stream) {
  AddKernel<<<GridFor(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchConvertF32(const float* in, size_t n, void* out, Dtype out_dtype,
                             cudaStream_t stream) {
  switch (out_dtype) {
    case Dtype::kF32:
      ConvertKernel<<<GridFor(n), kThreads, 0, stream>>>(in, n, static_cast<float*>(out));
      break;
    case Dtype::kF16:
      ConvertKernel<<<GridFor(n), kThreads, 0, stream>>>(in, n, static_cast<__half*>(out));
      break;
    case Dtype::kBF16:
      ConvertKernel<<<GridFor(n), kThreads, 0, stream>>>(in, n,
                                                          static_cast<__nv_bfloat16*>(out));
      break;
  }
  return cudaGetLastError();
}

}  // namespace tandem::backend::cuda
