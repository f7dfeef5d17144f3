// LaunchFixedTileGemm (cuda_kernels.h): the batch-invariant GEMM.
//
// Every output d[m][n] = sum_k a[m][k] * w[n][k] is accumulated in F32 in
// an order fixed by k alone, never by m or by the tile the row falls in
// (then + d[m][n] when accumulating), so a row's bits are the same
// whatever m is:
//   F32:      one chain of fused multiply-adds acc = fma(a, w, acc) for
//             k = 0, 1, ..., K - 1 from acc = 0 (CUDA cores; TF32 never).
//             A block of 16 x 16 threads computes a 64 x 64 tile, 4 x 4
//             outputs per thread, staging 64 x 16 panels in shared memory.
//   F16/BF16: tensor cores (WMMA 16x16x16, F32 accumulators): the k
//             steps of 16 run in ascending order, each an MMA whose result
//             for an element depends on that element's row of a, column
//             of w and accumulator only. The K tail is padded with zeros
//             (the same padding for every m). A block of 4 warps computes
//             a 64 x 64 tile, 32 x 32 per warp, staging 64 x 32 panels.
// Rows, columns and k outside the matrices read as zero and are never
// stored.
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/kernel_util.cuh"

namespace tandem::backend::cuda {
namespace {

using internal::FromF32;

constexpr int32_t kTile = 64;                  // rows and columns of an output tile
constexpr int32_t kTileK = 16;                 // k per shared-memory panel
constexpr int32_t kSide = 16;                  // threads per tile side
constexpr int32_t kPerThread = kTile / kSide;  // outputs per thread per side
constexpr unsigned kThreads = kSide * kSide;
constexpr int32_t kLoads = kTile * kTileK / kThreads;  // panel elements per thread

// The CUDA-core path (F32).
__global__ void __launch_bounds__(kThreads)
    FixedTileGemmKernel(const float* a, const float* w, int32_t m, int32_t n, int32_t k, float* d,
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
      a_panel[kk][r] = (gm < m && gk < k) ? a[static_cast<size_t>(gm) * k + gk] : 0.0f;
      w_panel[kk][r] = (gn < n && gk < k) ? w[static_cast<size_t>(gn) * k + gk] : 0.0f;
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

// The tensor-core path (F16/BF16).
constexpr int32_t kTensorK = 32;            // k per staged panel
constexpr int32_t kPanelLd = kTensorK + 8;  // panel row stride (elements)
constexpr int32_t kOutLd = kTile + 4;       // output tile row stride (floats)
constexpr unsigned kTensorThreads = 128;    // 4 warps, 2 x 2 over the tile

// Rows [r0, r0 + kTile) x k [k0, k0 + kTensorK) of src [rows][k] into
// panel [kTile][kPanelLd], zeros outside src. 16-byte copies when the
// whole panel is inside and aligned (`vectors`), else element by element:
// the same values either way.
template <typename T>
__device__ void LoadPanel(const T* src, int32_t rows, int32_t k, int32_t r0, int32_t k0,
                          bool vectors, T* panel) {
  constexpr int32_t kPerVector = 16 / sizeof(T);
  if (vectors && r0 + kTile <= rows && k0 + kTensorK <= k) {
    constexpr int32_t kVectorsPerRow = kTensorK / kPerVector;
    for (int32_t v = threadIdx.x; v < kTile * kVectorsPerRow; v += kTensorThreads) {
      const int32_t r = v / kVectorsPerRow, c = (v % kVectorsPerRow) * kPerVector;
      *reinterpret_cast<uint4*>(panel + r * kPanelLd + c) =
          *reinterpret_cast<const uint4*>(src + static_cast<size_t>(r0 + r) * k + k0 + c);
    }
    return;
  }
  for (int32_t e = threadIdx.x; e < kTile * kTensorK; e += kTensorThreads) {
    const int32_t r = e / kTensorK, c = e % kTensorK;
    const int32_t gr = r0 + r, gk = k0 + c;
    panel[r * kPanelLd + c] =
        (gr < rows && gk < k) ? src[static_cast<size_t>(gr) * k + gk] : FromF32<T>(0.0f);
  }
}

template <typename T>
__global__ void __launch_bounds__(kTensorThreads)
    TensorTileGemmKernel(const T* a, const T* w, int32_t m, int32_t n, int32_t k, float* d,
                         bool accumulate) {
  using namespace nvcuda;
  // WMMA needs 32-byte aligned tiles: every offset used below is a
  // multiple of 32 bytes from these bases.
  __shared__ __align__(32) T a_panel[kTile * kPanelLd];
  __shared__ __align__(32) T w_panel[kTile * kPanelLd];
  __shared__ __align__(32) float out_tile[kTile * kOutLd];
  const int32_t warp = threadIdx.x / 32;
  const int32_t wy = warp / 2, wx = warp % 2;  // the warp's 32 x 32 quarter
  const int32_t m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  const bool vectors = k % (16 / static_cast<int32_t>(sizeof(T))) == 0 &&
                       reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(w) % 16 == 0;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (int32_t i = 0; i < 2; ++i) {
    for (int32_t j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }
  for (int32_t k0 = 0; k0 < k; k0 += kTensorK) {
    LoadPanel(a, m, k, m0, k0, vectors, a_panel);
    LoadPanel(w, n, k, n0, k0, vectors, w_panel);
    __syncthreads();
    for (int32_t kk = 0; kk < kTensorK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
      // w [n][k] read as the k x n matrix B, column-major with stride kPanelLd.
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb[2];
      for (int32_t i = 0; i < 2; ++i) {
        wmma::load_matrix_sync(fa[i], a_panel + (wy * 32 + i * 16) * kPanelLd + kk, kPanelLd);
      }
      for (int32_t j = 0; j < 2; ++j) {
        wmma::load_matrix_sync(fb[j], w_panel + (wx * 32 + j * 16) * kPanelLd + kk, kPanelLd);
      }
      for (int32_t i = 0; i < 2; ++i) {
        for (int32_t j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  for (int32_t i = 0; i < 2; ++i) {
    for (int32_t j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(out_tile + (wy * 32 + i * 16) * kOutLd + wx * 32 + j * 16, acc[i][j],
                              kOutLd, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int32_t e = threadIdx.x; e < kTile * kTile; e += kTensorThreads) {
    const int32_t r = e / kTile, c = e % kTile;
    const int32_t gm = m0 + r, gn = n0 + c;
    if (gm >= m || gn >= n) continue;
    const float v = out_tile[r * kOutLd + c];
    float* out = d + static_cast<size_t>(gm) * n + gn;
    *out = accumulate ? __fadd_rn(v, *out) : v;
  }
}

}  // namespace

cudaError_t LaunchFixedTileGemm(const void* a, const void* w, Dtype dtype, int32_t m, int32_t n,
                                int32_t k, float* d, bool accumulate, cudaStream_t stream) {
  if (m < 0 || n < 0 || k < 0) return cudaErrorInvalidValue;
  if (m == 0 || n == 0) return cudaSuccess;
  const unsigned tiles_m = static_cast<unsigned>((m + kTile - 1) / kTile);
  const unsigned tiles_n = static_cast<unsigned>((n + kTile - 1) / kTile);
  if (tiles_m > 65535) return cudaErrorInvalidValue;
  const dim3 grid(tiles_n, tiles_m);
  switch (dtype) {
    case Dtype::kF32:
      FixedTileGemmKernel<<<grid, kThreads, 0, stream>>>(
          static_cast<const float*>(a), static_cast<const float*>(w), m, n, k, d, accumulate);
      return cudaGetLastError();
    case Dtype::kF16:
      TensorTileGemmKernel<<<grid, kTensorThreads, 0, stream>>>(
          static_cast<const __half*>(a), static_cast<const __half*>(w), m, n, k, d, accumulate);
      return cudaGetLastError();
    case Dtype::kBF16:
      TensorTileGemmKernel<<<grid, kTensorThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(w), m, n, k, d,
          accumulate);
      return cudaGetLastError();
  }
  return cudaErrorInvalidValue;
}

}  // namespace tandem::backend::cuda
