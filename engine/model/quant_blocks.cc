#include "engine/model/quant_blocks.h"

namespace tandem::model::internal {
namespace {

uint32_t U32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The 4-bit (legacy) or 5-bit value of weight e < 32 of a legacy block
// with nibbles at qs and, for Q5, 32 high bits qh (else 0 with has_qh).
int LegacyQ(const uint8_t* qs, uint32_t qh, bool has_qh, size_t e) {
  const int nibble = e < 16 ? (qs[e] & 0xF) : (qs[e - 16] >> 4);
  return has_qh ? (nibble | static_cast<int>(((qh >> e) & 1u) << 4)) : nibble;
}

// Q4_K / Q5_K: weight e < 256's (d * sc, dmin * m) and its 4- or 5-bit q.
struct KWeight {
  float d1, m1;
  int q;
};
KWeight QK45(const uint8_t* b, size_t e, bool five_bit) {
  const size_t s = e / 32, c = e / 64, l = e % 32;
  uint8_t sc, m;
  ScaleMinK4(static_cast<int>(s), b + 4, &sc, &m);
  const uint8_t* qs = b + (five_bit ? 48 : 16);
  int q = (s % 2 == 0) ? (qs[32 * c + l] & 0xF) : (qs[32 * c + l] >> 4);
  if (five_bit && ((b[16 + l] >> s) & 1) != 0) q += 16;
  return {LoadF16(b) * sc, LoadF16(b + 2) * m, q};
}

// Q6_K: weight e < 256's scale index and 6-bit q (0..63).
void Q6(const uint8_t* b, size_t e, int* scale_index, int* q) {
  const size_t h = e / 128, g = (e % 128) / 32, l = e % 32;
  const uint8_t ql = b[64 * h + l + 32 * (g & 1)];
  const uint8_t qh = b[128 + 32 * h + l];
  *q = ((ql >> (4 * (g >> 1))) & 0xF) | (((qh >> (2 * g)) & 3) << 4);
  *scale_index = static_cast<int>(8 * h + 2 * g + l / 16);
}

bool NonFiniteF16(const uint8_t* p) { return ((LoadU16(p) >> 10) & 0x1f) == 0x1f; }

}  // namespace

bool IsQuantized(gguf::TensorType type) {
  switch (type) {
    case gguf::TensorType::kQ4_0:
    case gguf::TensorType::kQ4_1:
    case gguf::TensorType::kQ5_0:
    case gguf::TensorType::kQ5_1:
    case gguf::TensorType::kQ8_0:
    case gguf::TensorType::kQ4_K:
    case gguf::TensorType::kQ5_K:
    case gguf::TensorType::kQ6_K:
      return true;
    default:
      return false;
  }
}

float DequantizeOne(gguf::TensorType type, const uint8_t* b, size_t e) {
  switch (type) {
    case gguf::TensorType::kQ4_0:
      return static_cast<float>(LegacyQ(b + 2, 0, false, e) - 8) * LoadF16(b);
    case gguf::TensorType::kQ4_1:
      return static_cast<float>(LegacyQ(b + 4, 0, false, e)) * LoadF16(b) + LoadF16(b + 2);
    case gguf::TensorType::kQ5_0:
      return static_cast<float>(LegacyQ(b + 6, U32(b + 2), true, e) - 16) * LoadF16(b);
    case gguf::TensorType::kQ5_1:
      return static_cast<float>(LegacyQ(b + 8, U32(b + 4), true, e)) * LoadF16(b) + LoadF16(b + 2);
    case gguf::TensorType::kQ8_0:
      return static_cast<float>(static_cast<int8_t>(b[2 + e])) * LoadF16(b);
    case gguf::TensorType::kQ4_K:
    case gguf::TensorType::kQ5_K: {
      const KWeight w = QK45(b, e, type == gguf::TensorType::kQ5_K);
      return w.d1 * static_cast<float>(w.q) - w.m1;
    }
    case gguf::TensorType::kQ6_K: {
      int scale_index, q;
      Q6(b, e, &scale_index, &q);
      const float ds =
          LoadF16(b + 208) * static_cast<float>(static_cast<int8_t>(b[192 + scale_index]));
      return ds * static_cast<float>(q - 32);
    }
    default:
      return 0.0f;
  }
}

void DequantizeBlocksGeneric(gguf::TensorType type, const uint8_t* data, size_t n, float* out) {
  const size_t block = gguf::TensorBlockSize(type);
  const size_t block_bytes = gguf::TensorBlockBytes(type);
  for (size_t b = 0; b < n / block; ++b) {
    const uint8_t* blk = data + b * block_bytes;
    float* y = out + b * block;
    for (size_t e = 0; e < block; ++e) y[e] = DequantizeOne(type, blk, e);
  }
}

std::optional<uint64_t> FindNonFiniteScale(gguf::TensorType type, const uint8_t* data,
                                           uint64_t n_blocks) {
  if (!IsQuantized(type)) return std::nullopt;
  const size_t block_bytes = gguf::TensorBlockBytes(type);
  // Offsets of the f16 scales in a block.
  size_t offsets[2] = {0, 0};
  size_t count = 1;
  switch (type) {
    case gguf::TensorType::kQ4_1:
    case gguf::TensorType::kQ5_1:
    case gguf::TensorType::kQ4_K:
    case gguf::TensorType::kQ5_K:
      offsets[1] = 2;
      count = 2;
      break;
    case gguf::TensorType::kQ6_K:
      offsets[0] = 208;
      break;
    default:
      break;
  }
  for (uint64_t b = 0; b < n_blocks; ++b) {
    for (size_t k = 0; k < count; ++k) {
      if (NonFiniteF16(data + b * block_bytes + offsets[k])) return b;
    }
  }
  return std::nullopt;
}

}  // namespace tandem::model::internal
