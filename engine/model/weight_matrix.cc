#include "engine/model/weight_matrix.h"

#include <bit>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_DEQUANT_X86 1
#endif

namespace tandem::model::internal {
namespace {

static_assert(std::endian::native == std::endian::little,
              "GGUF tensor data is little-endian; big-endian hosts need byte swaps");

constexpr size_t kQ8Block = 32;       // weights per Q8_0 block
constexpr size_t kQ8BlockBytes = 34;  // f16 d + 32 int8

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void ConvertGeneric(gguf::TensorType type, const uint8_t* data, size_t n, float* out) {
  switch (type) {
    case gguf::TensorType::kF32:
      std::memcpy(out, data, n * sizeof(float));
      return;
    case gguf::TensorType::kF16:
      for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(LoadU16(data + 2 * i));
      return;
    case gguf::TensorType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        out[i] = std::bit_cast<float>(static_cast<uint32_t>(LoadU16(data + 2 * i)) << 16);
      }
      return;
    case gguf::TensorType::kQ8_0:
      for (size_t b = 0; b < n / kQ8Block; ++b) {
        const uint8_t* block = data + kQ8BlockBytes * b;
        const float d = HalfToFloat(LoadU16(block));
        for (size_t j = 0; j < kQ8Block; ++j) {
          out[kQ8Block * b + j] = static_cast<float>(static_cast<int8_t>(block[2 + j])) * d;
        }
      }
      return;
  }
}

#ifdef TANDEM_DEQUANT_X86
// F16C widens binary16 exactly, as HalfToFloat (NaNs come out quiet, which
// no weight is); Q8_0's q * d is the same single rounded product as the
// generic loop's.
__attribute__((target("avx2,f16c"))) void ConvertAvx2(gguf::TensorType type,
                                                       const uint8_t* data, size_t n,
                                                       float* out) {
  if (type == gguf::TensorType::kF16) {
    const size_t n8 = n - n % 8;
    for (size_t i = 0; i < n8; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 2 * i));
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    return ConvertGeneric(type, data + 2 * n8, n - n8, out + n8);
  }
  if (type == gguf::TensorType::kQ8_0) {
    for (size_t b = 0; b < n / kQ8Block; ++b) {
      const uint8_t* block = data + kQ8BlockBytes * b;
      const __m256 d = _mm256_set1_ps(HalfToFloat(LoadU16(block)));
      for (size_t j = 0; j < kQ8Block; j += 8) {
        int64_t q8;
        std::memcpy(&q8, block + 2 + j, sizeof q8);
        const __m256i q = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(q8));
        _mm256_storeu_ps(out + kQ8Block * b + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
      }
    }
    return;
  }
  ConvertGeneric(type, data, n, out);
}

// AVX-512F: 16 at a time, the same conversions (maskz forms with a full
// mask: GCC 12's unmasked 512-bit ones warn, -Wmaybe-uninitialized).
__attribute__((target("avx512f,avx2,f16c"))) void ConvertAvx512(gguf::TensorType type,
                                                                 const uint8_t* data,
                                                                 size_t n, float* out) {
  if (type == gguf::TensorType::kF16) {
    const size_t n16 = n - n % 16;
    for (size_t i = 0; i < n16; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + 2 * i));
      _mm512_storeu_ps(out + i, _mm512_maskz_cvtph_ps(0xffff, h));
    }
    return ConvertAvx2(type, data + 2 * n16, n - n16, out + n16);
  }
  if (type == gguf::TensorType::kQ8_0) {
    for (size_t b = 0; b < n / kQ8Block; ++b) {
      const uint8_t* block = data + kQ8BlockBytes * b;
      const __m512 d = _mm512_set1_ps(HalfToFloat(LoadU16(block)));
      for (size_t j = 0; j < kQ8Block; j += 16) {
        const __m128i q8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 + j));
        const __m512 q =
            _mm512_maskz_cvtepi32_ps(0xffff, _mm512_maskz_cvtepi8_epi32(0xffff, q8));
        _mm512_storeu_ps(out + kQ8Block * b + j, _mm512_mul_ps(q, d));
      }
    }
    return;
  }
  ConvertGeneric(type, data, n, out);
}

bool HasAvx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c");
  }();
  return has;
}

bool HasAvx2F16c() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  }();
  return has;
}
#endif  // TANDEM_DEQUANT_X86

}  // namespace

size_t WeightMatrix::RowBytes() const {
  switch (type) {
    case gguf::TensorType::kF32:
      return in * 4;
    case gguf::TensorType::kF16:
    case gguf::TensorType::kBF16:
      return in * 2;
    case gguf::TensorType::kQ8_0:
      return in / kQ8Block * kQ8BlockBytes;
  }
  return 0;
}

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

void ConvertToF32(gguf::TensorType type, const uint8_t* data, size_t n, float* out) {
#ifdef TANDEM_DEQUANT_X86
  if (HasAvx512()) return ConvertAvx512(type, data, n, out);
  if (HasAvx2F16c()) return ConvertAvx2(type, data, n, out);
#endif
  ConvertGeneric(type, data, n, out);
}

bool ConvertToF32With(DequantIsa isa, gguf::TensorType type, const uint8_t* data, size_t n,
                      float* out) {
  switch (isa) {
    case DequantIsa::kGeneric:
      ConvertGeneric(type, data, n, out);
      return true;
#ifdef TANDEM_DEQUANT_X86
    case DequantIsa::kAvx2:
      if (!HasAvx2F16c()) return false;
      ConvertAvx2(type, data, n, out);
      return true;
    case DequantIsa::kAvx512:
      if (!HasAvx512()) return false;
      ConvertAvx512(type, data, n, out);
      return true;
#endif
    default:
      return false;
  }
}

void DequantizeRows(const WeightMatrix& w, size_t o_begin, size_t count, float* out) {
  const size_t row_bytes = w.RowBytes();
  for (size_t i = 0; i < count; ++i) {
    ConvertToF32(w.type, w.data + (o_begin + i) * row_bytes, w.in, out + i * w.in);
  }
}

}  // namespace tandem::model::internal
