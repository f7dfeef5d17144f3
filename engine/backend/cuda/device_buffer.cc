#include "engine/backend/cuda/device_buffer.h"

#include "absl/strings/str_cat.h"
#include "engine/backend/cuda/cuda_status.h"

namespace tandem::backend::cuda {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes, const char* what) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  const cudaError_t error = cudaMalloc(&buffer.ptr_, bytes);
  if (error != cudaSuccess) {
    buffer.ptr_ = nullptr;
    // A failed cudaMalloc also sets the thread's last error, which the next
    // launcher's cudaGetLastError would report as its own: clear it.
    (void)cudaGetLastError();
    return CudaStatus(error,
                      absl::StrCat("cudaMalloc of ", bytes, " bytes (",
                                   static_cast<double>(bytes) / (1 << 20), " MiB) for ", what));
  }
  buffer.bytes_ = bytes;
  return buffer;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

}  // namespace tandem::backend::cuda
