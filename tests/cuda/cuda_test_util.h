// Helpers for the CUDA kernel tests: the no-GPU skip, device arrays, and
// host encodings of the three element types of cuda_kernels.h.
#ifndef TANDEM_TESTS_CUDA_CUDA_TEST_UTIL_H_
#define TANDEM_TESTS_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cuda/cuda_kernels.h"

namespace tandem::backend::cuda::testing {

// Why this process cannot run CUDA kernels ("cudaGetDeviceCount: <error>",
// no device, or device 0 older than sm_90), or "" when it can. Asked once
// per process.
const std::string& NoGpuReason();

// Skips the current test (GTEST_SKIP) when NoGpuReason() is not empty.
#define TANDEM_REQUIRE_GPU()                                                 \
  do {                                                                       \
    const std::string& tandem_no_gpu = ::tandem::backend::cuda::testing::NoGpuReason(); \
    if (!tandem_no_gpu.empty()) GTEST_SKIP() << "no CUDA GPU: " << tandem_no_gpu; \
  } while (0)

// n elements of T in device memory (cudaMalloc / cudaFree); allocation or
// copy failures are test failures (ADD_FAILURE), not exceptions.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    const cudaError_t err = cudaMalloc(&data_, (n == 0 ? 1 : n) * sizeof(T));
    if (err != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc(" << n * sizeof(T) << "): " << cudaGetErrorString(err);
      data_ = nullptr;
    }
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { Upload(host); }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  size_t size() const { return n_; }

  // Copies host (host.size() == size()) to the device.
  void Upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    if (n_ == 0) return;
    ASSERT_EQ(cudaMemcpy(data_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  // The device contents (after the default stream's work so far).
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    if (n_ == 0) return host;
    const cudaError_t err =
        cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) ADD_FAILURE() << "cudaMemcpy: " << cudaGetErrorString(err);
    return host;
  }

 private:
  size_t n_;
  T* data_ = nullptr;
};

// The three dtypes, for parameterized loops.
inline constexpr Dtype kAllDtypes[] = {Dtype::kF32, Dtype::kF16, Dtype::kBF16};

// `x` rounded to `dtype` (nearest even), as floats.
std::vector<float> RoundTo(const std::vector<float>& x, Dtype dtype);

// The bytes of `x` as `dtype` elements (nearest even).
std::vector<uint8_t> Encode(const std::vector<float>& x, Dtype dtype);

// The floats held in `bytes` of `dtype` elements (exact).
std::vector<float> Decode(const std::vector<uint8_t>& bytes, Dtype dtype);

// n floats uniform in [lo, hi) from `rng`.
std::vector<float> RandomFloats(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f);

// The bit pattern of a float (bit-identity checks, NaN included).
uint32_t Bits(float v);

// Synchronizes the device; a failure (a kernel fault) fails the test.
void SyncOrFail();

}  // namespace tandem::backend::cuda::testing

#endif  // TANDEM_TESTS_CUDA_CUDA_TEST_UTIL_H_
