#include "engine/backend/cuda/cuda_device_query.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace tandem::backend::cuda {

namespace {

[[nodiscard]] absl::Status Unavailable(int32_t index, const char* call, cudaError_t error) {
  return absl::UnavailableError(absl::StrCat("cuda:", index, ": ", call, ": ",
                                             cudaGetErrorName(error), " (",
                                             cudaGetErrorString(error), ")"));
}

// Whether the NVIDIA driver's library can be loaded (the CUDA runtime
// dlopens the same name).
bool HasDriverLibrary() {
  void* handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) handle = dlopen("libcuda.so.1", RTLD_LAZY);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

}  // namespace

int32_t CudaDeviceQuery::DeviceCount(std::string* why_none) const {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // cudaErrorNoDevice, cudaErrorInsufficientDriver, ...: not sticky, but
    // the runtime keeps it as the last error; clear it so that it does not
    // surface from an unrelated later call.
    (void)cudaGetLastError();
    if (why_none != nullptr) {
      *why_none = cudaGetErrorString(error);
      // The runtime says "insufficient driver" also when there is no
      // driver at all: say which.
      if (error == cudaErrorInsufficientDriver && !HasDriverLibrary()) {
        *why_none = "no NVIDIA driver: libcuda.so.1 is not installed";
      }
    }
    return 0;
  }
  if (count <= 0 && why_none != nullptr) *why_none = "the CUDA runtime reports 0 devices";
  return count > 0 ? count : 0;
}

absl::StatusOr<GpuInfo> CudaDeviceQuery::Info(int32_t index) const {
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, index); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Unavailable(index, "cudaGetDeviceProperties", e);
  }
  if (cudaError_t e = cudaSetDevice(index); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Unavailable(index, "cudaSetDevice", e);
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Unavailable(index, "cudaMemGetInfo", e);
  }
  GpuInfo info;
  info.index = index;
  info.name = prop.name;
  info.total_bytes = total_bytes;
  info.free_bytes = free_bytes;
  info.compute_capability = prop.major * 10 + prop.minor;
  return info;
}

}  // namespace tandem::backend::cuda
