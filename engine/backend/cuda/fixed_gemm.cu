// PLACEHOLDER on branch wip-15-res so that GemmRunner links and its tests
// run: the real LaunchFixedTileGemm is wip-15-kern's fixed_gemm.cu (on
// merge, take that file whole). This one is correct but slow: one thread
// per output element, k summed in index order (invariant across m).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "engine/backend/cuda/cuda_kernels.h"

namespace tandem::backend::cuda {
namespace {

__device__ float Load(const float* p, size_t i) { return p[i]; }
__device__ float Load(const __half* p, size_t i) { return __half2float(p[i]); }
__device__ float Load(const __nv_bfloat16* p, size_t i) { return __bfloat162float(p[i]); }

template <typename T>
__global__ void NaiveGemmKernel(const T* a, const T* w, int32_t m, int32_t n, int32_t k, float* d,
                                bool accumulate) {
  const int32_t col = blockIdx.x * blockDim.x + threadIdx.x;
  const int32_t row = blockIdx.y;
  if (col >= n || row >= m) return;
  float sum = 0.0f;
  for (int32_t i = 0; i < k; ++i) {
    sum = fmaf(Load(a, static_cast<size_t>(row) * k + i), Load(w, static_cast<size_t>(col) * k + i),
               sum);
  }
  float* out = d + static_cast<size_t>(row) * n + col;
  *out = accumulate ? *out + sum : sum;
}

}  // namespace

cudaError_t LaunchFixedTileGemm(const void* a, const void* w, Dtype dtype, int32_t m, int32_t n,
                                int32_t k, float* d, bool accumulate, cudaStream_t stream) {
  const dim3 grid((n + 127) / 128, m);
  switch (dtype) {
    case Dtype::kF32:
      NaiveGemmKernel<<<grid, 128, 0, stream>>>(static_cast<const float*>(a),
                                                static_cast<const float*>(w), m, n, k, d,
                                                accumulate);
      break;
    case Dtype::kF16:
      NaiveGemmKernel<<<grid, 128, 0, stream>>>(static_cast<const __half*>(a),
                                                static_cast<const __half*>(w), m, n, k, d,
                                                accumulate);
      break;
    case Dtype::kBF16:
      NaiveGemmKernel<<<grid, 128, 0, stream>>>(static_cast<const __nv_bfloat16*>(a),
                                                static_cast<const __nv_bfloat16*>(w), m, n, k, d,
                                                accumulate);
      break;
  }
  return cudaGetLastError();
}

}  // namespace tandem::backend::cuda
