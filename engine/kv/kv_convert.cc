#include "engine/kv/kv_convert.h"

#include <cstring>

#include "engine/gguf/half.h"

namespace tandem::kv {

uint16_t FloatToF16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // VCVTPS2PH on a NaN: sign, all-ones exponent, quiet bit, payload >> 13.
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u | ((u & 0x7fffffu) >> 13));
  }
  return gguf::FloatToHalf(x);  // round to nearest even, like _cvtss_sh(x, 0)
}

namespace {
// dst (2n bytes, unaligned) = convert(src[i]) for i < n.
template <uint16_t (*convert)(float)>
void FloatsTo16(const float* src, size_t n, char* dst) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = convert(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}
}  // namespace

void FloatsToKv(KvDtype dtype, const float* src, size_t n, char* dst) {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case KvDtype::kF16:
      return FloatsTo16<FloatToF16>(src, n, dst);
    case KvDtype::kBF16:
      return FloatsTo16<FloatToBf16>(src, n, dst);
  }
}

void KvToFloats(KvDtype dtype, const char* src, size_t n, float* dst) {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case KvDtype::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = gguf::HalfToFloat(h);
      }
      return;
    case KvDtype::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = Bf16ToFloat(h);
      }
      return;
  }
}

}  // namespace tandem::kv
