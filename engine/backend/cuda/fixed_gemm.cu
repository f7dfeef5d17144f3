// LaunchFixedTileGemm (cuda_kernels.h): the batch-invariant GEMM.
//
// d[m][n] = sum_k a[m][k] * w[n][k], every output one chain of fused
// multiply-adds acc = fma(a[m][k], w[n][k], acc) for k = 0, 1, ..., K - 1
// from acc = 0 (then + d[m][n] when accumulating). The chain depends on
// nothing but k, so a row's bits are the same whatever m is and whichever
// tile the row falls in. Tiles: a block of 16 x 16 threads computes a
// 64 x 64 output tile, 4 x 4 outputs per thread (rows ty + 16 i, columns
// tx + 16 j), staging 64 x 16 panels of a and w as F32 in shared memory.
// Out-of-range rows, columns and k are never part of a stored chain.
#include <cuda_runtime.h>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/kernel_util.cuh"

namespace tandem::backend::cuda {
namespace {

using internal::DispatchDtype;
using internal::ToF32;

constexpr int32_t kTile = 64;        // rows and columns of an output tile
constexpr int32_t kTileK = 16;       // k per shared-memory panel
constexpr int32_t kSide = 16;        // threads per tile side
constexpr int32_t kPerThread = kTile / kSide;  // outputs per thread per side
constexpr unsigned kThreads = kSide * kSide;
constexpr int32_t kLoads = kTile * kTileK / kThreads;  // panel elements per thread

template <typename T>
__global__ void __launch_bounds__(kThreads)
    FixedTileGemmKernel(const T* a, const T* w, int32_t m, int32_t n, int32_t k, float* d,
                        bool accumulate) {
  // [k][row]; the +1 keeps the transposed stores off one bank.
  __shared__ float a_panel[kTileK][kTile + 1];
  __shared__ float w_panel[kTileK][kTile + 1];
  const int32_t tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const int32_t m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  float acc[kPerThread][kPerThread];
  for (int32_t i = 0; i < kPerThread; ++i) {
    for (int32_t j = 0; j < kPerThread; ++j) acc[i][j] = 0.0f;
  }
  for (int32_t k0 = 0; k0 < k; k0 += kTileK) {
    for (int32_t l = 0; l < kLoads; ++l) {
      const int32_t e = threadIdx.x + l * kThreads;
      const int32_t r = e / kTileK, kk = e % kTileK;
      const int32_t gk = k0 + kk;
      const int32_t gm = m0 + r, gn = n0 + r;
      a_panel[kk][r] =
          (gm < m && gk < k) ? ToF32(a[static_cast<size_t>(gm) * k + gk]) : 0.0f;
      w_panel[kk][r] =
          (gn < n && gk < k) ? ToF32(w[static_cast<size_t>(gn) * k + gk]) : 0.0f;
    }
    __syncthreads();
    const int32_t k_end = min(kTileK, k - k0);  // the chain stops at k - 1
    for (int32_t kk = 0; kk < k_end; ++kk) {
      float av[kPerThread], wv[kPerThread];
      for (int32_t i = 0; i < kPerThread; ++i) av[i] = a_panel[kk][ty + kSide * i];
      for (int32_t j = 0; j < kPerThread; ++j) wv[j] = w_panel[kk][tx + kSide * j];
      for (int32_t i = 0; i < kPerThread; ++i) {
        for (int32_t j = 0; j < kPerThread; ++j) acc[i][j] = __fmaf_rn(av[i], wv[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  for (int32_t i = 0; i < kPerThread; ++i) {
    const int32_t gm = m0 + ty + kSide * i;
    if (gm >= m) continue;
    for (int32_t j = 0; j < kPerThread; ++j) {
      const int32_t gn = n0 + tx + kSide * j;
      if (gn >= n) continue;
      float* out = d + static_cast<size_t>(gm) * n + gn;
      *out = accumulate ? __fadd_rn(acc[i][j], *out) : acc[i][j];
    }
  }
}

}  // namespace

cudaError_t LaunchFixedTileGemm(const void* a, const void* w, Dtype dtype, int32_t m,
                                int32_t n, int32_t k, float* d, bool accumulate,
                                cudaStream_t stream) {
  if (m < 0 || n < 0 || k < 0) return cudaErrorInvalidValue;
  if (m == 0 || n == 0) return cudaSuccess;
  const unsigned tiles_m = static_cast<unsigned>((m + kTile - 1) / kTile);
  const unsigned tiles_n = static_cast<unsigned>((n + kTile - 1) / kTile);
  if (tiles_m > 65535) return cudaErrorInvalidValue;
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    FixedTileGemmKernel<T><<<dim3(tiles_n, tiles_m), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(w), m, n, k, d, accumulate);
    return cudaGetLastError();
  });
}

}  // namespace tandem::backend::cuda
