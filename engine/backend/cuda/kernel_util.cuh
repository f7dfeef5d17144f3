// Device helpers shared by the *.cu files of the CUDA backend (internal to
// engine/backend/cuda): element loads and stores for the three dtypes of
// cuda_kernels.h, and the host-side dispatch from a Dtype value to a kernel
// template argument.
//
// Owns: nothing. Threads: pure functions.
#ifndef TANDEM_ENGINE_BACKEND_CUDA_KERNEL_UTIL_CUH_
#define TANDEM_ENGINE_BACKEND_CUDA_KERNEL_UTIL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "engine/backend/cuda/cuda_kernels.h"

namespace tandem::backend::cuda::internal {

// The F32 value of one element (exact for all three types).
__device__ __forceinline__ float ToF32(float v) { return v; }
__device__ __forceinline__ float ToF32(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToF32(__nv_bfloat16 v) { return __bfloat162float(v); }

// `v` as T, rounded to nearest even.
template <typename T>
__device__ __forceinline__ T FromF32(float v);
template <>
__device__ __forceinline__ float FromF32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromF32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Calls fn(T{}) with T = float, __half or __nv_bfloat16 for `dtype`
// (kernels are templates over T; the launcher picks the instance here).
// Returns cudaErrorInvalidValue for a value outside the enum, else what fn
// returns.
template <typename Fn>
cudaError_t DispatchDtype(Dtype dtype, Fn&& fn) {
  switch (dtype) {
    case Dtype::kF32:
      return fn(float{});
    case Dtype::kF16:
      return fn(__half{});
    case Dtype::kBF16:
      return fn(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

// Blocks for a grid-stride loop over n elements with `threads` per block,
// at least 1 and at most 65535 (the loops cover the rest).
inline unsigned GridStrideBlocks(size_t n, unsigned threads) {
  const size_t blocks = (n + threads - 1) / threads;
  if (blocks == 0) return 1;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

}  // namespace tandem::backend::cuda::internal

#endif  // TANDEM_ENGINE_BACKEND_CUDA_KERNEL_UTIL_CUH_
