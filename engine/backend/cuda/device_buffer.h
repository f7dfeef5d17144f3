// An owned device allocation (cudaMalloc / cudaFree), move-only. Freed
// only at start-up failure or backend destruction, never while serving.
// Threads: not thread-safe.
#ifndef TANDEM_ENGINE_BACKEND_CUDA_DEVICE_BUFFER_H_
#define TANDEM_ENGINE_BACKEND_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"

namespace tandem::backend::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // cudaMalloc of `bytes` (0 allocates nothing). RESOURCE_EXHAUSTED naming
  // `what` and the size when the device is out of memory, INTERNAL for
  // another error (CudaStatus).
  [[nodiscard]] static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, const char* what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_DEVICE_BUFFER_H_
