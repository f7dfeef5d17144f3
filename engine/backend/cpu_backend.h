// The CPU backend: LlamaModel's batch-invariant forward (engine/model) over
// a CpuKvStorage in engine.kv_cache_dtype (F32, F16 or BF16), and the sampling reduction computed from the full
// logits on the host (sampling::BuildSamplingView).
//
// Owns: the KV memory, the logits buffer. Does not touch: the model's
// weights (borrowed, shared by every user of the loaded model).
// Threads: the engine loop calls Forward; the model's thread pool does the
// parallel work (engine.threads).
#ifndef TANDEM_ENGINE_BACKEND_CPU_BACKEND_H_
#define TANDEM_ENGINE_BACKEND_CPU_BACKEND_H_

#include <string>
#include <vector>

#include "engine/backend/model_backend.h"
#include "engine/kv/cpu_kv_storage.h"

namespace tandem::backend {

// The bit-exact class of a CPU backend over `model` with a KV cache of
// `kv_dtype`: "tandem-cpu/<matmul>/<q8 path>/<kv dtype>/v4", where
//   <matmul>   = the kernel ISA of the float MatMul (model::KernelIsa():
//                avx512, avx2, generic), or "int8" when every matrix the
//                model multiplies runs the int8 path (all_matmuls_int8()),
//                or "fma" when every one is an F32 matrix on the panel
//                GEMM (all_matmuls_f32_panels(), f32_panels.h); with
//                either, no result depends on the ISA;
//   <q8 path>  = engine.q8_matmul, "exact" or "int8"
//                (LlamaModel::q8_matmul_name());
//   <kv dtype> = f32, f16 or bf16 (kv::KvDtypeName);
// e.g. "tandem-cpu/fma/exact/f32/v4", "tandem-cpu/int8/int8/f16/v4",
// "tandem-cpu/avx512/exact/f16/v4" (a Q8_0 or F16 model).
// Two CPU backends with equal classes give bit-identical results for the
// same model. The trailing version changes whenever the engine's
// arithmetic does (v2: attention's vectorized exp and 4-lane softmax sum;
// v3: this format; v4: F32 matrices on the panel GEMM's fma chain). HELLO and registration enforce only the KV layout id
// (which includes the KV dtype); the class is reported (HELLO, status).
std::string CpuBitExactClass(const model::LlamaModel& model, kv::KvDtype kv_dtype);

class CpuBackend final : public ModelBackend {
 public:
  // `model` must outlive the backend. Allocates num_blocks zeroed blocks of
  // block_size tokens (model->kv_shape(block_size)) in `kv_dtype`:
  // kv::CpuKvStorage::BytesFor bytes, half as many for F16/BF16 as for F32.
  CpuBackend(const model::LlamaModel* model, int32_t block_size, int32_t num_blocks,
             kv::KvDtype kv_dtype = kv::KvDtype::kF32);

  const model::LlamaConfig& config() const override { return model_->config(); }
  kv::KvStorage& kv_storage() override { return storage_; }
  std::string bit_exact_class() const override {
    return CpuBitExactClass(*model_, storage_.dtype());
  }
  // Never fails (returns OK).
  [[nodiscard]] absl::Status Forward(std::span<const ForwardEntry> batch, const LayerHook* hook,
                                     std::vector<sampling::SamplingView>* views) override;

 private:
  const model::LlamaModel* const model_;
  kv::CpuKvStorage storage_;
  std::vector<model::SequenceBatch> entries_;  // reused per step
  std::vector<float> logits_;
  std::vector<float> scratch_;
};

}  // namespace tandem::backend

#endif  // TANDEM_ENGINE_BACKEND_CPU_BACKEND_H_
