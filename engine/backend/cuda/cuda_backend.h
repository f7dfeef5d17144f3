// The CUDA backend (DESIGN.md, GPU workers): the model's weights in device
// memory, a paged KV pool in device memory, the forward over a flattened
// mixed batch (cuBLASLt GEMMs with F32 accumulation, own kernels in
// cuda_kernels.h), decode-only steps replayed as CUDA graphs, and the
// sampling reduction on the device (only K values per sequence cross to
// the host). Built only with TANDEM_ENABLE_CUDA; CreateBackend
// (backend_factory.h) is how workers get one.
//
// Owns: device memory (weights, KV pool, activations, workspaces), its
// streams, events and graphs. Does not touch: which blocks are free
// (KvCacheManager), scheduling, the random draw.
// Threads: the engine loop calls Forward; not thread-safe. No
// device-synchronizing call (cudaFree, cudaDeviceSynchronize, synchronous
// copies) during serving: Forward waits on its own stream's event only.
#ifndef TANDEM_ENGINE_BACKEND_CUDA_CUDA_BACKEND_H_
#define TANDEM_ENGINE_BACKEND_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend_factory.h"
#include "engine/backend/gpu_memory_plan.h"
#include "engine/backend/model_backend.h"

namespace tandem::backend::cuda {

// Per-category device time of the forwards since the last reset, from
// CUDA events around each category's launches (profiling only: events
// between kernels cost a little; off by default).
struct ForwardProfile {
  double gemm_ms = 0;
  double attention_ms = 0;
  double other_ms = 0;  // norms, RoPE, KV writes, SwiGLU, adds, sampling
  double total_ms = 0;  // the whole forward, first launch to last
  int64_t forwards = 0;
};

class CudaBackend final : public ModelBackend {
 public:
  // Uploads the weights, allocates the activation arena for
  // max_num_batched_tokens tokens, runs one forward at that size to measure
  // the peak, plans the memory (gpu_memory_plan.h) and allocates the KV
  // pool. Errors as CreateBackend's.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const model::LlamaModel& model,
                                                             const BackendOptions& options);
  ~CudaBackend() override;

  const model::LlamaConfig& config() const override;
  kv::KvStorage& kv_storage() override;
  // "tandem-cuda/sm_<cc>/<bi|nbi>/<weight dtype>/v1".
  std::string bit_exact_class() const override;
  absl::Status Forward(std::span<const ForwardEntry> batch, const LayerHook* hook,
                       std::vector<sampling::SamplingView>* views) override;
  bool device_lost() const override;

  // The plan the KV pool was sized by (for the start-up log and tests).
  const GpuMemoryPlan& memory_plan() const;

  // Profiling for scripts/device-check (bench/): enable, read, reset.
  void set_profiling(bool on);
  ForwardProfile profile() const;
  void reset_profile();

  // The full logits of the last Forward's sampled rows, copied to the host
  // ([rows][vocab]; a synchronous copy, for tandem selftest only).
  absl::StatusOr<std::vector<float>> LastLogitsForTesting();

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_CUDA_BACKEND_H_
