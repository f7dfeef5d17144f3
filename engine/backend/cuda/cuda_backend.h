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
// Sampling: each sampled row is reduced on the device to its RowStats
// (argmax, max, log-sum-exp) and its first K ids (LaunchRowTopK), and the
// host builds the sampling::SamplingView from those alone when the row's
// processors are the identity or a temperature only (greedy; top_k; min_p
// widening up to kMaxDeviceTopK candidates; raw_top from the same ids).
// Every other row is copied whole and built by sampling::BuildSamplingView
// (host_sampling_fallbacks() counts them). raw_log_sum is the device's
// tree-ordered sum, not BuildSamplingView's index-ordered one: logprobs
// differ from what the host reduction would give on the same row by a few
// ulps, and are bit-identical within this bit-exact class.
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
// A decode step replayed as a CUDA graph holds no marks: it counts in
// total_ms only, so the categories add up to total_ms for steps without
// graphs (prefills, mixed batches) alone.
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
  // the peak, plans the memory (gpu_memory_plan.h), allocates the KV
  // pool and captures every decode graph (CaptureGraphs). Errors as
  // CreateBackend's.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      const model::LlamaModel& model, const BackendOptions& options);
  ~CudaBackend() override;

  const model::LlamaConfig& config() const override;
  kv::KvStorage& kv_storage() override;
  // "tandem-cuda/sm_<cc>/<bi|nbi>/<weight dtype>/v1".
  std::string bit_exact_class() const override;
  [[nodiscard]] absl::Status Forward(std::span<const ForwardEntry> batch, const LayerHook* hook,
                                     std::vector<sampling::SamplingView>* views) override;
  bool device_lost() const override;

  // The plan the KV pool was sized by (for the start-up log and tests).
  const GpuMemoryPlan& memory_plan() const;

  // Decode-only steps (every entry one token and sampled, at most
  // min(max_num_seqs, max_num_batched_tokens) entries) run as CUDA graphs,
  // one per bucket (1, 2, 4, 8, 16, 32, then multiples of 32, capped:
  // GraphBuckets), all captured by Create (CaptureGraphs; a bucket missing
  // would be captured at its first step). Always on when serving (not a
  // config key); off runs the same kernels launched one by one, for tests
  // and tandem selftest to compare (bit-identical with batch_invariant).
  void set_use_cuda_graphs(bool on);

  // Captures and instantiates the graph of every bucket now (those already
  // captured are kept), so that no capture happens while serving. Create
  // runs it, so a worker's NCCL communicators, created after the backend,
  // never overlap a capture (issue #16: a stream capture must not run
  // alongside NCCL's setup and kernels on the device); calling it again
  // captures nothing. Nothing runs on the device (a capture records work,
  // it does not execute it).
  // Errors: INTERNAL for a CUDA error (naming the call) or a lost device.
  [[nodiscard]] absl::Status CaptureGraphs();
  // Graphs captured so far (tests).
  size_t captured_graphs() const;

  // Sampled rows whose view was built on the host from the whole copied
  // row (sampling::BuildSamplingView) since start-up: rows with penalties,
  // logit bias or a min_tokens mask in effect, rows at temperature > 0
  // with top_k and min_p off (the view's normaliser sums the whole
  // vocabulary), and rows needing more than kMaxDeviceTopK candidates.
  int64_t host_sampling_fallbacks() const;

  // Profiling for scripts/device-check (bench/): enable, read, reset.
  void set_profiling(bool on);
  ForwardProfile profile() const;
  void reset_profile();

  // The full logits of the last Forward's sampled rows, copied to the host
  // ([rows][vocab]; a synchronous copy, for tandem selftest only).
  [[nodiscard]] absl::StatusOr<std::vector<float>> LastLogitsForTesting();

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_CUDA_BACKEND_H_
