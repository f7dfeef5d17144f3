#include "engine/kv/kv_convert.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

#if defined(__x86_64__)
// FloatsTo16<FloatToF16> with VCVTPS2PH, 8 at a time: the same bits
// (FloatToF16 is that instruction's rounding, NaNs included).
__attribute__((target("avx,f16c"))) void FloatsToF16C(const float* src, size_t n, char* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  FloatsTo16<FloatToF16>(src + i, n - i, dst + 2 * i);
}

bool HasF16C() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return has;
}
#endif
}  // namespace

void FloatsToKv(KvDtype dtype, const float* src, size_t n, char* dst) {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case KvDtype::kF16:
#if defined(__x86_64__)
      if (HasF16C()) return FloatsToF16C(src, n, dst);
#endif
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
