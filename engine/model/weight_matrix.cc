#include "engine/model/weight_matrix.h"

#include "engine/model/quant_blocks.h"
#include "engine/model/quant_loads.h"
#include "engine/model/weight_loads.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace tandem::model::internal {
namespace {

static_assert(std::endian::native == std::endian::little,
              "GGUF tensor data is little-endian; big-endian hosts need byte swaps");

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
    default:
      DequantizeBlocksGeneric(type, data, n, out);
      return;
  }
}

#ifdef TANDEM_WEIGHT_LOADS_X86
// The vector sources of weight_loads.h over one row of n weights: each
// lane is the scalar reference's operations, so the bits are the generic
// path's. n is whole blocks for the quantized types; an F16 tail (n mod 8
// or 16) goes through the generic loop.
template <typename Source>
__attribute__((target("avx2,fma,f16c"))) void StoreRow8(const Source& source, size_t n8,
                                                        float* out) {
  if constexpr (requires { Source::kGroup; }) {
    for (size_t i = 0; i < n8; i += Source::kBlock) {  // n is whole blocks
      const typename Source::Context8 ctx = source.Prepare8(0, i);
      for (size_t e = i; e < i + Source::kBlock; e += 32) {
        __m256 v[4];
        source.LoadGroup8(0, e, ctx, v);
        for (size_t k = 0; k < 4; ++k) _mm256_storeu_ps(out + e + 8 * k, v[k]);
      }
    }
  } else {
    for (size_t i = 0; i < n8; i += 8) _mm256_storeu_ps(out + i, source.Load8(0, i));
  }
}

template <typename Source>
__attribute__((target("avx512f,avx2,fma,f16c"))) void StoreRow16(const Source& source, size_t n16,
                                                                 float* out) {
  if constexpr (requires { Source::kGroup; }) {
    constexpr size_t kVectors = Source::kGroup / 16;
    for (size_t i = 0; i < n16; i += Source::kBlock) {  // n is whole blocks
      const typename Source::Context ctx = source.Prepare(0, i);
      for (size_t e = i; e < i + Source::kBlock; e += Source::kGroup) {
        __m512 v[kVectors];
        source.LoadGroup16(0, e, ctx, v);
        for (size_t k = 0; k < kVectors; ++k) _mm512_storeu_ps(out + e + 16 * k, v[k]);
      }
    }
  } else {
    for (size_t i = 0; i < n16; i += 16) _mm512_storeu_ps(out + i, source.Load16(0, i));
  }
}

__attribute__((target("avx2,fma,f16c"))) void ConvertAvx2(gguf::TensorType type,
                                                          const uint8_t* data, size_t n,
                                                          float* out) {
  const size_t n8 = n - n % 8;
  const bool vector =
      WithWeightLoads(type, data, 0, 0, [&](const auto& source) { StoreRow8(source, n8, out); });
  if (!vector) return ConvertGeneric(type, data, n, out);
  if (n8 < n) ConvertGeneric(type, data + 2 * n8, n - n8, out + n8);  // F16 only
}

__attribute__((target("avx512f,avx2,fma,f16c"))) void ConvertAvx512(gguf::TensorType type,
                                                                    const uint8_t* data, size_t n,
                                                                    float* out) {
  const size_t n16 = n - n % 16;
  const bool vector =
      WithWeightLoads(type, data, 0, 0, [&](const auto& source) { StoreRow16(source, n16, out); });
  if (!vector) return ConvertGeneric(type, data, n, out);
  if (n16 < n) ConvertAvx2(type, data + 2 * n16, n - n16, out + n16);  // F16 only
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
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
           __builtin_cpu_supports("fma");
  }();
  return has;
}
#endif  // TANDEM_WEIGHT_LOADS_X86

}  // namespace

size_t WeightMatrix::RowBytes() const {
  return static_cast<size_t>(gguf::TensorBytes(type, in).value_or(0));
}

void ConvertToF32(gguf::TensorType type, const uint8_t* data, size_t n, float* out) {
#ifdef TANDEM_WEIGHT_LOADS_X86
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
#ifdef TANDEM_WEIGHT_LOADS_X86
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
