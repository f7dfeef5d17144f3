// How a GPU worker divides its device memory (DESIGN.md, GPU workers; the
// same rule as vLLM's gpu_memory_utilization): the worker may use
// engine.gpu_memory_fraction of the device's total memory in all; weights,
// the activation peak of one forward at max_num_batched_tokens, the cuBLAS
// workspace and the KV transfer buffers come first, and the KV block pool
// gets the rest.
//
// Owns: that arithmetic, as a pure function unit-tested on the CPU. Does
// not touch: the device (the CUDA backend measures and passes the numbers).
// Threads: pure functions.
#ifndef TANDEM_ENGINE_BACKEND_GPU_MEMORY_PLAN_H_
#define TANDEM_ENGINE_BACKEND_GPU_MEMORY_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::backend {

// All sizes in bytes.
struct GpuMemoryInputs {
  uint64_t device_total_bytes = 0;     // cudaMemGetInfo's total
  uint64_t device_free_bytes = 0;      // free when the worker started, before its own allocations
  double gpu_memory_fraction = 0.9;    // engine.gpu_memory_fraction, in (0, 1]
  uint64_t weight_bytes = 0;           // weights as uploaded
  uint64_t activation_peak_bytes = 0;  // measured over one forward at max_num_batched_tokens
  uint64_t workspace_bytes = 0;        // cuBLAS(Lt) workspace
  uint64_t transfer_buffer_bytes = 0;  // KV transfer staging buffers
  uint64_t other_bytes = 0;            // CUDA context and anything else the worker holds
  uint64_t block_bytes = 0;            // one KV block: all layers, K and V
  int32_t max_blocks = 0;              // a cap (engine.num_kv_blocks when set); 0 = none
};

struct GpuMemoryPlan {
  uint64_t budget_bytes = 0;  // fraction * total
  uint64_t kv_bytes = 0;      // num_blocks * block_bytes
  int32_t num_blocks = 0;     // >= 1
  // One line for the worker's start-up log, e.g. "GPU memory: budget
  // 128.0 GiB (0.90 of 142.2 GiB): weights 2.3 GiB, activations 0.4 GiB,
  // workspace 32 MiB, transfer 256 MiB, other 0.5 GiB; KV 124.5 GiB =
  // 1019904 blocks of 128 KiB".
  std::string Describe(const GpuMemoryInputs& in) const;
};

// blocks = min(max_blocks or unbounded,
//              (budget - weights - activations - workspace - transfer -
//               other) / block_bytes), budget = floor(fraction * total).
// Errors, RESOURCE_EXHAUSTED in one line naming the key and the numbers
// (GiB with two decimals): the fixed parts exceed the budget ("the model
// does not fit: weights 15.2 GiB + ... > engine.gpu_memory_fraction 0.90
// of 16.0 GiB"); the rest holds no block ("engine.gpu_memory_fraction 0.05
// leaves 1.2 MiB for the KV cache, less than one block of 4.0 MiB"); the
// budget exceeds the memory free at start (other processes hold the
// difference). INVALID_ARGUMENT for a fraction outside (0, 1] or a zero
// block size.
[[nodiscard]] absl::StatusOr<GpuMemoryPlan> PlanGpuMemory(const GpuMemoryInputs& in);

// `tandem up` with n workers on one GPU: each gets fraction / n (the
// split it prints). n >= 1.
double SplitGpuMemoryFraction(double fraction, int32_t n);

}  // namespace tandem::backend

#endif  // TANDEM_ENGINE_BACKEND_GPU_MEMORY_PLAN_H_
