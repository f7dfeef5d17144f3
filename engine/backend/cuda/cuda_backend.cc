// Placeholder until the CUDA forward lands (issue #15, being built):
// CudaBackend::Create refuses with UNIMPLEMENTED.
#include "engine/backend/cuda/cuda_backend.h"

namespace tandem::backend::cuda {

struct CudaBackend::Impl {};

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const model::LlamaModel&,
                                                                 const BackendOptions&) {
  return absl::UnimplementedError("the CUDA forward is not built yet");
}

const model::LlamaConfig& CudaBackend::config() const { std::abort(); }
kv::KvStorage& CudaBackend::kv_storage() { std::abort(); }
std::string CudaBackend::bit_exact_class() const { return "tandem-cuda/unbuilt"; }
absl::Status CudaBackend::Forward(std::span<const ForwardEntry>, const LayerHook*,
                                  std::vector<sampling::SamplingView>*) {
  return absl::UnimplementedError("the CUDA forward is not built yet");
}
bool CudaBackend::device_lost() const { return false; }
const GpuMemoryPlan& CudaBackend::memory_plan() const { std::abort(); }
void CudaBackend::set_profiling(bool) {}
ForwardProfile CudaBackend::profile() const { return {}; }
void CudaBackend::reset_profile() {}
absl::StatusOr<std::vector<float>> CudaBackend::LastLogitsForTesting() {
  return absl::UnimplementedError("the CUDA forward is not built yet");
}

}  // namespace tandem::backend::cuda
