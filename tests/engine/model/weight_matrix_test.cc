// Weights in their GGUF type (weight_matrix.h): F16 / BF16 / Q8_0 decode to
// the values their formats define (IEEE 754 binary16, the high half of a
// binary32, ggml's block_q8_0 q * d), through the vector paths too, and a
// MatMul over a non-F32 matrix gives, bit for bit, the MatMul over its F32
// values for every ISA, batch size and thread count.
#include "engine/model/quant_blocks.h"
#include "engine/model/weight_matrix.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/model/cpu_kernels.h"
#include "engine/model/thread_pool.h"
#include "gtest/gtest.h"

namespace tandem::model::internal {
namespace {

using gguf::TensorType;

// binary16 by its definition: (-1)^s 2^(e-15) (1 + m/1024), subnormals
// m 2^-24, e = 31 infinity (NaNs are not used here).
float Binary16Value(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const float mag = e == 0    ? std::ldexp(static_cast<float>(m), -24)
                    : e == 31 ? INFINITY
                              : std::ldexp(1.0f + static_cast<float>(m) / 1024.0f, e - 15);
  return (h & 0x8000) != 0 ? -mag : mag;
}

bool IsNan16(uint16_t h) { return ((h >> 10) & 0x1f) == 31 && (h & 0x3ff) != 0; }

TEST(WeightMatrixTest, F16DecodesEveryNonNanBitPattern) {
  std::vector<uint16_t> halves;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    if (!IsNan16(static_cast<uint16_t>(h))) halves.push_back(static_cast<uint16_t>(h));
  }
  for (DequantIsa isa : {DequantIsa::kGeneric, DequantIsa::kAvx2, DequantIsa::kAvx512}) {
    std::vector<float> out(halves.size());
    if (!ConvertToF32With(isa, TensorType::kF16,
                          reinterpret_cast<const uint8_t*>(halves.data()), halves.size(),
                          out.data())) {
      continue;  // not on this CPU
    }
    for (size_t i = 0; i < halves.size(); ++i) {
      const float want = Binary16Value(halves[i]);
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(want))
          << "half 0x" << std::hex << halves[i] << " path " << static_cast<int>(isa);
    }
  }
  for (uint16_t h : halves) {
    ASSERT_EQ(std::bit_cast<uint32_t>(HalfToFloat(h)), std::bit_cast<uint32_t>(Binary16Value(h)));
  }
}

// Random Q8_0 blocks: {f16 d (finite, normal); int8 q[32]}.
std::vector<uint8_t> RandomQ8(size_t blocks, std::mt19937& rng) {
  std::vector<uint8_t> b(34 * blocks);
  std::uniform_int_distribution<int> byte(0, 255), exp(5, 20);
  for (size_t k = 0; k < blocks; ++k) {
    const uint16_t d = static_cast<uint16_t>((exp(rng) << 10) | (byte(rng) << 2) | (k & 1) << 15);
    std::memcpy(&b[34 * k], &d, 2);
    for (int j = 0; j < 32; ++j) b[34 * k + 2 + j] = static_cast<uint8_t>(byte(rng));
  }
  return b;
}

TEST(WeightMatrixTest, Q8_0DecodesAsQTimesD) {
  std::mt19937 rng(5);
  const std::vector<uint8_t> q8 = RandomQ8(5, rng);
  for (DequantIsa isa : {DequantIsa::kGeneric, DequantIsa::kAvx2, DequantIsa::kAvx512}) {
    std::vector<float> out(5 * 32);
    if (!ConvertToF32With(isa, TensorType::kQ8_0, q8.data(), out.size(), out.data())) continue;
    for (size_t k = 0; k < 5; ++k) {
      uint16_t d;
      std::memcpy(&d, &q8[34 * k], 2);
      for (size_t j = 0; j < 32; ++j) {
        const float want = static_cast<float>(static_cast<int8_t>(q8[34 * k + 2 + j])) *
                           Binary16Value(d);
        ASSERT_EQ(out[32 * k + j], want) << "block " << k << " weight " << j;
      }
    }
  }
}

TEST(WeightMatrixTest, Bf16IsTheHighHalfOfABinary32) {
  const uint16_t bf16[9] = {0x3F80, 0xC0A0, 0x0000, 0x8000, 0x7F80, 0x0001, 0x4049, 0x3EAB,
                            0xBF00};
  std::vector<float> out(9);
  ConvertToF32(TensorType::kBF16, reinterpret_cast<const uint8_t*>(bf16), 9, out.data());
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), static_cast<uint32_t>(bf16[i]) << 16) << i;
  }
}

TEST(WeightMatrixTest, RowBytesFollowTheType) {
  EXPECT_EQ((WeightMatrix{TensorType::kF32, nullptr, 64, 3}.RowBytes()), 256u);
  EXPECT_EQ((WeightMatrix{TensorType::kF16, nullptr, 64, 3}.RowBytes()), 128u);
  EXPECT_EQ((WeightMatrix{TensorType::kBF16, nullptr, 64, 3}.RowBytes()), 128u);
  EXPECT_EQ((WeightMatrix{TensorType::kQ8_0, nullptr, 64, 3}.RowBytes()), 68u);
  // ggml-common.h's block sizes: 18, 20, 22, 24 bytes per 32; 144, 176, 210
  // per 256.
  EXPECT_EQ((WeightMatrix{TensorType::kQ4_0, nullptr, 64, 3}.RowBytes()), 36u);
  EXPECT_EQ((WeightMatrix{TensorType::kQ4_1, nullptr, 64, 3}.RowBytes()), 40u);
  EXPECT_EQ((WeightMatrix{TensorType::kQ5_0, nullptr, 64, 3}.RowBytes()), 44u);
  EXPECT_EQ((WeightMatrix{TensorType::kQ5_1, nullptr, 64, 3}.RowBytes()), 48u);
  EXPECT_EQ((WeightMatrix{TensorType::kQ4_K, nullptr, 512, 3}.RowBytes()), 288u);
  EXPECT_EQ((WeightMatrix{TensorType::kQ5_K, nullptr, 512, 3}.RowBytes()), 352u);
  EXPECT_EQ((WeightMatrix{TensorType::kQ6_K, nullptr, 512, 3}.RowBytes()), 420u);
}

// A matrix of `type` with random contents (finite values): its bytes and
// its F32 values.
struct TypedMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> f32;
};

// n weights of a quantized `type` as random bytes, each block's f16
// scales (d, and m / dmin) set to finite values of either sign in
// [2^-12, 2^-5). Values: DequantizeOne, checked against llama.cpp by
// quant_dequant_test.
std::vector<uint8_t> RandomBlocks(TensorType type, size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  const size_t block_bytes = gguf::TensorBlockBytes(type);
  std::vector<uint8_t> bytes(n / gguf::TensorBlockSize(type) * block_bytes);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
  auto scale = [&] {
    return static_cast<uint16_t>((byte(rng) & 1) << 15 | (3 + byte(rng) % 7) << 10 |
                                 (byte(rng) << 2 | byte(rng) % 4));
  };
  for (size_t b = 0; b < bytes.size(); b += block_bytes) {
    const size_t first = type == TensorType::kQ6_K ? 208 : 0;
    const bool two = type == TensorType::kQ4_1 || type == TensorType::kQ5_1 ||
                     type == TensorType::kQ4_K || type == TensorType::kQ5_K;
    for (size_t k = 0; k < (two ? 2u : 1u); ++k) {
      const uint16_t h = scale();
      std::memcpy(&bytes[b + first + 2 * k], &h, 2);
    }
  }
  return bytes;
}

TypedMatrix RandomMatrix(TensorType type, size_t in, size_t out, std::mt19937& rng) {
  TypedMatrix m;
  std::uniform_int_distribution<int> byte(0, 255);
  if (type == TensorType::kQ8_0) {
    m.bytes = RandomQ8(in / 32 * out, rng);
  } else if (IsQuantized(type)) {
    m.bytes = RandomBlocks(type, in * out, rng);
  } else {
    m.bytes.resize(2 * in * out);
    for (size_t i = 0; i < in * out; ++i) {
      // Sign, an exponent in a moderate range, random mantissa bits.
      uint16_t h;
      if (type == TensorType::kF16) {
        h = static_cast<uint16_t>((byte(rng) & 1) << 15 | (8 + byte(rng) % 16) << 10 |
                                  (byte(rng) << 2 | byte(rng) % 4));
      } else {
        h = static_cast<uint16_t>((byte(rng) & 1) << 15 | (120 + byte(rng) % 16) << 7 |
                                  (byte(rng) % 128));
      }
      std::memcpy(&m.bytes[2 * i], &h, 2);
    }
  }
  m.f32.resize(in * out);
  for (size_t o = 0; o < out; ++o) {
    for (size_t k = 0; k < in; ++k) {
      float v;
      if (IsQuantized(type) && type != TensorType::kQ8_0) {
        const size_t block = gguf::TensorBlockSize(type);
        v = DequantizeOne(type, &m.bytes[(o * in + k) / block * gguf::TensorBlockBytes(type)],
                          (o * in + k) % block);
      } else if (type == TensorType::kQ8_0) {
        const size_t block = (o * in + k) / 32, j = (o * in + k) % 32;
        uint16_t d;
        std::memcpy(&d, &m.bytes[34 * block], 2);
        v = static_cast<float>(static_cast<int8_t>(m.bytes[34 * block + 2 + j])) *
            Binary16Value(d);
      } else {
        uint16_t h;
        std::memcpy(&h, &m.bytes[2 * (o * in + k)], 2);
        v = type == TensorType::kF16 ? Binary16Value(h)
                                     : std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
      }
      m.f32[o * in + k] = v;
    }
  }
  return m;
}

std::vector<float> RandomInputs(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(WeightMatrixTest, MatMulOverStorageTypesEqualsMatMulOverTheirF32Values) {
  std::mt19937 rng(11);
  ThreadPool pool2(2), pool3(3);
  ThreadPool* const pools[] = {nullptr, &pool2, &pool3};
  for (TensorType type :
       {TensorType::kF16, TensorType::kBF16, TensorType::kQ8_0, TensorType::kQ4_0,
        TensorType::kQ4_1, TensorType::kQ5_0, TensorType::kQ5_1, TensorType::kQ4_K,
        TensorType::kQ5_K, TensorType::kQ6_K}) {
    for (auto [in, out] : {std::pair<size_t, size_t>{64, 172},
                           {96, 37},
                           {256, 9},
                           {100, 6},
                           {72, 5},
                           {512, 23}}) {
      if (in % gguf::TensorBlockSize(type) != 0) continue;  // whole blocks only
      const TypedMatrix m = RandomMatrix(type, in, out, rng);
      const WeightMatrix w{type, m.bytes.data(), in, out};
      const std::vector<float> x = RandomInputs(64 * in, rng);
      for (KernelIsaKind isa :
           {KernelIsaKind::kGeneric, KernelIsaKind::kAvx2, KernelIsaKind::kAvx512}) {
        if (!KernelIsaSupported(isa)) continue;
        SCOPED_TRACE(::testing::Message() << gguf::TensorTypeName(type) << " " << in << "x"
                                          << out << " " << KernelIsaName(isa));
        std::vector<float> want(64 * out), got(64 * out, -1.0f);
        MatMulColumnsWithIsa(isa, x.data(), m.f32.data(), 64, in, out, 0, out, want.data());
        MatMulColumnsWithIsa(isa, x.data(), w, 64, 0, out, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
        // Row 5 alone, and a column range starting mid-tile.
        std::vector<float> row(out, -1.0f);
        MatMulColumnsWithIsa(isa, &x[5 * in], w, 1, 0, out, row.data());
        ASSERT_EQ(std::memcmp(row.data(), &want[5 * out], out * sizeof(float)), 0);
        std::vector<float> part(64 * out, -1.0f);
        MatMulColumnsWithIsa(isa, x.data(), w, 64, 3, out, part.data());
        for (size_t r = 0; r < 64; ++r) {
          ASSERT_EQ(std::memcmp(&part[r * out + 3], &want[r * out + 3],
                                (out - 3) * sizeof(float)),
                    0);
          ASSERT_EQ(part[r * out], -1.0f);
        }
      }
      // The engine's entry point, any batch size and pool.
      std::vector<float> want(64 * out);
      MatMul(x.data(), m.f32.data(), 64, in, out, want.data());
      for (size_t rows : {1, 3, 17, 64}) {
        for (ThreadPool* pool : pools) {
          std::vector<float> got(rows * out, -1.0f);
          MatMul(x.data(), w, rows, got.data(), pool, 0);
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
              << gguf::TensorTypeName(type) << " rows " << rows;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::model::internal
