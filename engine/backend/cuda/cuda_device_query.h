// The DeviceQuery over the CUDA runtime (engine/backend/device.h):
// SystemDeviceQuery() returns one of these in a build with CUDA.
//
// Owns: nothing (stateless). Does not touch: device memory.
// Threads: safe from any thread; Info() makes `index` the calling thread's
// current device (cudaSetDevice), which is what a worker that runs on it
// wants anyway.
#ifndef TANDEM_ENGINE_BACKEND_CUDA_CUDA_DEVICE_QUERY_H_
#define TANDEM_ENGINE_BACKEND_CUDA_CUDA_DEVICE_QUERY_H_

#include <string>

#include "engine/backend/device.h"

namespace tandem::backend::cuda {

class CudaDeviceQuery final : public DeviceQuery {
 public:
  // cudaGetDeviceCount. On a machine without a GPU the runtime answers
  // cudaErrorNoDevice or cudaErrorInsufficientDriver (no driver): 0, with
  // cudaGetErrorString's text ("no CUDA-capable device is detected") in
  // *why_none.
  int32_t DeviceCount(std::string* why_none) const override;
  // cudaGetDeviceProperties (name, compute capability), then cudaSetDevice
  // and cudaMemGetInfo (free and total bytes; creates the CUDA context on
  // that device). UNAVAILABLE "cuda:N: <call>: <error name> (<error text>)"
  // when any of them fails.
  [[nodiscard]] absl::StatusOr<GpuInfo> Info(int32_t index) const override;
};

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_CUDA_DEVICE_QUERY_H_
