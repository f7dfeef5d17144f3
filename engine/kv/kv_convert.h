// Conversions between F32 activations and the element types of a KV cache
// (kv_dtype.h), bit-exact with ggml's CPU conversions so that a 16-bit KV
// cache holds what llama.cpp's would:
//   F16:  ggml's GGML_FP32_TO_FP16 on x86 with F16C, `_cvtss_sh(x, 0)`
//         (ggml-cpu/simd-mappings.h): IEEE round to nearest even, overflow
//         to infinity, subnormals kept, a NaN kept quiet with its sign and
//         the top 9 bits of its payload (VCVTPS2PH). Computed in portable
//         scalar code (gguf::FloatToHalf plus that NaN rule), so every CPU
//         writes the same bits.
//   BF16: ggml's ggml_compute_fp32_to_bf16 (ggml-impl.h): the high half
//         rounded to nearest even, (x + 0x7fff + ((x >> 16) & 1)) >> 16, a
//         NaN truncated and forced quiet ((x >> 16) | 0x40), subnormals kept.
// Widening back is exact: gguf::HalfToFloat for F16, bits << 16 for BF16.
// Threads: pure functions.
#ifndef TANDEM_ENGINE_KV_KV_CONVERT_H_
#define TANDEM_ENGINE_KV_KV_CONVERT_H_

#include <bit>
#include <cstddef>
#include <cstdint>

#include "engine/kv/kv_dtype.h"

namespace tandem::kv {

// binary32 -> binary16 bits as `_cvtss_sh(x, 0)` (see the header comment).
uint16_t FloatToF16(float x);

// binary32 -> bfloat16 bits as ggml_compute_fp32_to_bf16.
inline uint16_t FloatToBf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

// bfloat16 bits -> binary32, exact (ggml_compute_bf16_to_fp32).
inline float Bf16ToFloat(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

// dst[0, n * KvDtypeBytes(dtype)) = src[0, n) rounded to `dtype` as above
// (F32: copied). dst needs no alignment.
void FloatsToKv(KvDtype dtype, const float* src, size_t n, char* dst);

// dst[0, n) = the n elements of `dtype` at src, widened exactly to F32.
void KvToFloats(KvDtype dtype, const char* src, size_t n, float* dst);

}  // namespace tandem::kv

#endif  // TANDEM_ENGINE_KV_KV_CONVERT_H_
