#include "engine/gguf/half.h"

#include <bit>
#include <cmath>

namespace tandem::gguf {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign != 0 ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float f) {
  // After F. Giesen's float_to_half_fast3_rtne (public domain).
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  uint32_t h;
  if (x >= 0x47800000u) {  // >= 65536 (or inf/NaN): inf, NaN stays NaN
    h = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (x < 0x38800000u) {  // < 2^-14: subnormal or zero
    // Adding 0.5 aligns the half's subnormal ulp (2^-24) to the float's
    // last mantissa bit, so the FPU does the round-to-nearest-even.
    const float magic = std::bit_cast<float>(126u << 23);
    const float r = std::bit_cast<float>(x) + magic;
    h = std::bit_cast<uint32_t>(r) - (126u << 23);
  } else {
    const uint32_t mant_odd = (x >> 13) & 1u;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;  // rebias, round
    x += mant_odd;                                          // ties to even
    h = x >> 13;  // carries into the exponent (up to inf) as they should
  }
  return static_cast<uint16_t>(h | sign);
}

}  // namespace tandem::gguf
