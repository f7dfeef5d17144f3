#include "tests/cuda/cuda_test_util.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

namespace tandem::backend::cuda::testing {

const std::string& NoGpuReason() {
  static const std::string reason = [] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + " (" +
             cudaGetErrorString(err) + ")";
    }
    if (count == 0) return std::string("cudaGetDeviceCount reports no device");
    // The kernels are built for sm_90 (and its PTX): older devices cannot
    // run them.
    cudaDeviceProp prop;
    const cudaError_t prop_err = cudaGetDeviceProperties(&prop, 0);
    if (prop_err != cudaSuccess) {
      return std::string("cudaGetDeviceProperties: ") + cudaGetErrorName(prop_err);
    }
    if (prop.major < 9) {
      return std::string(prop.name) + " has compute capability " + std::to_string(prop.major) +
             "." + std::to_string(prop.minor) + ", the kernels need 9.0";
    }
    return std::string();
  }();
  return reason;
}

namespace {

uint16_t HalfBits(float v) {
  const __half_raw raw = __float2half_rn(v);
  return raw.x;
}

uint16_t Bf16Bits(float v) {
  const __nv_bfloat16_raw raw = __float2bfloat16_rn(v);
  return raw.x;
}

float FromHalfBits(uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

float FromBf16Bits(uint16_t bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

}  // namespace

std::vector<float> RoundTo(const std::vector<float>& x, Dtype dtype) {
  return Decode(Encode(x, dtype), dtype);
}

std::vector<uint8_t> Encode(const std::vector<float>& x, Dtype dtype) {
  std::vector<uint8_t> bytes(x.size() * kv::KvDtypeBytes(dtype));
  for (size_t i = 0; i < x.size(); ++i) {
    switch (dtype) {
      case Dtype::kF32:
        std::memcpy(&bytes[4 * i], &x[i], 4);
        break;
      case Dtype::kF16: {
        const uint16_t b = HalfBits(x[i]);
        std::memcpy(&bytes[2 * i], &b, 2);
        break;
      }
      case Dtype::kBF16: {
        const uint16_t b = Bf16Bits(x[i]);
        std::memcpy(&bytes[2 * i], &b, 2);
        break;
      }
    }
  }
  return bytes;
}

std::vector<float> Decode(const std::vector<uint8_t>& bytes, Dtype dtype) {
  const size_t width = kv::KvDtypeBytes(dtype);
  std::vector<float> x(bytes.size() / width);
  for (size_t i = 0; i < x.size(); ++i) {
    switch (dtype) {
      case Dtype::kF32:
        std::memcpy(&x[i], &bytes[4 * i], 4);
        break;
      case Dtype::kF16: {
        uint16_t b;
        std::memcpy(&b, &bytes[2 * i], 2);
        x[i] = FromHalfBits(b);
        break;
      }
      case Dtype::kBF16: {
        uint16_t b;
        std::memcpy(&b, &bytes[2 * i], 2);
        x[i] = FromBf16Bits(b);
        break;
      }
    }
  }
  return x;
}

std::vector<float> RandomFloats(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

void SyncOrFail() {
  const cudaError_t err = cudaDeviceSynchronize();
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorName(err) << ": " << cudaGetErrorString(err);
}

}  // namespace tandem::backend::cuda::testing
