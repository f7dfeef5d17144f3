// CreateBackend, HasCudaBackend and SystemDeviceQuery: the one place that
// knows whether this build has the CUDA backend (TANDEM_HAVE_CUDA, defined
// by the top-level CMakeLists.txt when TANDEM_ENABLE_CUDA is ON).
#include "engine/backend/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backend/cpu_backend.h"

#ifdef TANDEM_HAVE_CUDA
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/cuda/cuda_device_query.h"
#endif

namespace tandem::backend {

namespace {

#ifndef TANDEM_HAVE_CUDA
constexpr char kNoCudaBuild[] = "this build has no CUDA backend (TANDEM_ENABLE_CUDA is OFF)";

// The query of a build without CUDA: no device, and why.
class NoCudaQuery final : public DeviceQuery {
 public:
  int32_t DeviceCount(std::string* why_none) const override {
    if (why_none != nullptr) *why_none = kNoCudaBuild;
    return 0;
  }
  [[nodiscard]] absl::StatusOr<GpuInfo> Info(int32_t index) const override {
    return absl::UnavailableError(absl::StrCat("cuda:", index, ": ", kNoCudaBuild));
  }
};
#endif

// The CPU backend's refusals: options it does not have are refused rather
// than ignored. (Every KvDtype is held: F32, F16, BF16.)
[[nodiscard]] absl::Status CheckCpuOptions(const model::LlamaModel& model,
                                           const BackendOptions& options) {
  if (options.q8_matmul != model.q8_matmul()) {
    return absl::FailedPreconditionError(
        absl::StrCat("engine.q8_matmul: ", model::Q8MatMulName(options.q8_matmul), " on ",
                     options.device_key, " cpu, but the model was loaded with ",
                     model.q8_matmul_name(), " (LlamaModelOptions::q8_matmul)"));
  }
  if (!model.f32_panels()) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.device_key,
                     " cpu: the model was loaded without its F32 panel packing "
                     "(LlamaModelOptions::f32_panels false, a load for another device)"));
  }
  if (!kv::IsKnownKvDtype(static_cast<uint32_t>(options.kv_cache_dtype))) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine.kv_cache_dtype: ", static_cast<uint32_t>(options.kv_cache_dtype),
                     " is not f32, f16 or bf16"));
  }
  if (!options.batch_invariant) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine.batch_invariant: false on ", options.device_key,
        " cpu, but the CPU backend is always batch-invariant (remove the key or set it "
        "true)"));
  }
  return absl::OkStatus();
}

}  // namespace

bool HasCudaBackend() {
#ifdef TANDEM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

const DeviceQuery& SystemDeviceQuery() {
#ifdef TANDEM_HAVE_CUDA
  static const cuda::CudaDeviceQuery query;
#else
  static const NoCudaQuery query;
#endif
  return query;
}

[[nodiscard]] absl::StatusOr<std::unique_ptr<ModelBackend>> CreateBackend(
    const model::LlamaModel& model, const BackendOptions& options, const DeviceQuery& query) {
  if (options.device.is_cuda()) {
    if (options.q8_matmul != model::Q8MatMul::kExact) {
      return absl::InvalidArgumentError(
          absl::StrCat("engine.q8_matmul: ", model::Q8MatMulName(options.q8_matmul), " on ",
                       options.device_key, " ", options.device.ToString(),
                       ", but the CUDA backend multiplies Q8_0 weights only as exact (set "
                       "engine.q8_matmul: exact, or run this worker on cpu)"));
    }
#ifdef TANDEM_HAVE_CUDA
    if (absl::Status s = CheckDeviceAvailable(query, options.device, options.device_key); !s.ok()) {
      return s;
    }
    absl::StatusOr<GpuInfo> gpu = query.Info(options.device.index);
    if (!gpu.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(options.device_key, ": ", gpu.status().message()));
    }
    if (options.log) {
      options.log(absl::StrFormat("device %s: %s, %.2f GiB (%.2f GiB free), sm_%d",
                                  options.device.ToString(), gpu->name,
                                  gpu->total_bytes / 1073741824.0, gpu->free_bytes / 1073741824.0,
                                  gpu->compute_capability));
    }
    absl::StatusOr<std::unique_ptr<cuda::CudaBackend>> backend =
        cuda::CudaBackend::Create(model, options);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<ModelBackend>(std::move(*backend));
#else
    (void)query;
    return absl::FailedPreconditionError(
        absl::StrCat(options.device_key, ": ", options.device.ToString(), ", but ", kNoCudaBuild));
#endif
  }
  if (absl::Status s = CheckCpuOptions(model, options); !s.ok()) return s;
  return std::unique_ptr<ModelBackend>(std::make_unique<CpuBackend>(
      &model, options.block_size, options.num_kv_blocks, options.kv_cache_dtype));
}

}  // namespace tandem::backend
