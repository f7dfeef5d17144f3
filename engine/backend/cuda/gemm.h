// The CUDA backend's GEMMs: out[m][n] (F32) = a[m][k] . w[n][k]^T
// (+ out when accumulate), a and w in the weights' dtype, F32 accumulation
// (DESIGN.md, GPU workers; cuBLASLt: row-major out^T = w . a^T in cuBLAS's
// column-major terms, i.e. transa = T on w, transb = N on a).
//
// Numerics. Default mode: cuBLASLt's heuristic picks per (m, n, k) (asked
// once per call shape, cached); TF32 never (CUBLAS_COMPUTE_32F; F32
// weights are the accuracy mode); a call shape the heuristic has no
// algorithm for runs the fixed-tile GEMM. Batch-invariant mode
// (engine.batch_invariant): per weight shape (n, k), one cuBLASLt
// algorithm is chosen once at start (the heuristic's first candidate at m
// = max_m that, with split-K 1 (CUBLASLT_ALGO_CONFIG_SPLITK_NUM) and no
// reduction scheme, passes cublasLtMatmulAlgoCheck at every m of
// kInvarianceMs up to max_m and at max_m; none: the fixed-tile GEMM from
// the start); then CheckInvariance
// runs each shape at m in kInvarianceMs and compares row 0's bits; a
// shape whose row differs falls back to LaunchFixedTileGemm
// (cuda_kernels.h), which is invariant by construction.
//
// Owns: the cuBLASLt handle, its workspace, the per-shape plans.
// Threads: one engine thread; launches on the stream given.
#ifndef TANDEM_ENGINE_BACKEND_CUDA_GEMM_H_
#define TANDEM_ENGINE_BACKEND_CUDA_GEMM_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/device_buffer.h"

namespace tandem::backend::cuda {

// The m values the batch-invariance check (and the device report) uses.
inline constexpr std::array<int32_t, 10> kInvarianceMs = {1, 2, 3, 8, 17, 64, 128, 257, 1024, 2048};

// Per weight shape, the result of the start-up check.
struct GemmShapeReport {
  int32_t n = 0, k = 0;
  std::string engine;  // "cublaslt" or "fixed-tile"
  // invariant[i]: row 0 at m = kInvarianceMs[i] has the bits of m = 1
  // (cuBLASLt's own, before any fallback); one entry per kInvarianceMs[i]
  // <= max_m. Empty before CheckInvariance, and for a shape that had no
  // cuBLASLt algorithm to check (batch-invariant mode: none passed
  // cublasLtMatmulAlgoCheck with split-K 1; it is "fixed-tile" from the
  // start).
  std::vector<bool> invariant;
};

class GemmRunner {
 public:
  // `shapes`: every (n, k) the model multiplies by. `max_m`: the most rows
  // one call has (max_num_batched_tokens). Allocates the workspace
  // (kWorkspaceBytes). Errors: INTERNAL/RESOURCE_EXHAUSTED from cuBLASLt or
  // CUDA (CublasStatus / CudaStatus), naming the shape.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GemmRunner>> Create(
      Dtype dtype, const std::vector<std::pair<int32_t, int32_t>>& shapes, int32_t max_m,
      bool batch_invariant, cudaStream_t stream);
  ~GemmRunner();

  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // 32 MiB

  // Runs every shape at kInvarianceMs (m <= max_m) on pseudo-random
  // inputs in device scratch (allocated and freed here) and fills
  // reports(). Batch-invariant mode: shapes that vary switch to the
  // fixed-tile GEMM. Default mode: only reports what the heuristic's
  // per-m choices do (for the device report); nothing switches. Start-up
  // only (synchronizes the stream given to Create; frees memory).
  [[nodiscard]] absl::Status CheckInvariance();
  const std::vector<GemmShapeReport>& reports() const;

  // Launches out = a . w^T (+ out when accumulate) on `stream`; records
  // no event, never synchronizes (capturable in a CUDA graph; a call
  // shape's first use asks cuBLASLt's heuristic, host-only). (n, k) must
  // be one of the shapes given to Create; 1 <= m <= max_m; a, w and out
  // 16-byte aligned (the algorithms are chosen for that alignment;
  // cudaMalloc gives 256). Errors: INVALID_ARGUMENT naming the violated
  // condition, INTERNAL (or RESOURCE_EXHAUSTED) from cuBLASLt or the
  // launch.
  [[nodiscard]] absl::Status Run(const void* a, const void* w, int32_t m, int32_t n, int32_t k,
                                 float* out, bool accumulate, cudaStream_t stream);

  size_t workspace_bytes() const { return kWorkspaceBytes; }

 private:
  struct Impl;
  explicit GemmRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_GEMM_H_
