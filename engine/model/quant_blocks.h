// ggml's quantized block formats, read in place (internal to engine/model).
//
// Layouts are ggml-common.h's (llama.cpp; the GGUF spec's "GGML types"),
// little-endian, f16 = IEEE 754 binary16. `qs` nibbles, `qh` high bits:
//
//   Q4_0  32 weights, 18 bytes: {f16 d; u8 qs[16]}
//         w[j] = ((qs[j] & 0xF) - 8) * d, w[j + 16] = ((qs[j] >> 4) - 8) * d
//   Q4_1  32 weights, 20 bytes: {f16 d; f16 m; u8 qs[16]}
//         w[j] = (qs[j] & 0xF) * d + m,   w[j + 16] = (qs[j] >> 4) * d + m
//   Q5_0  32 weights, 22 bytes: {f16 d; u8 qh[4]; u8 qs[16]}
//         5-bit q[e] = nibble | (bit e of the u32 qh) << 4; w[e] = (q[e] - 16) * d
//   Q5_1  32 weights, 24 bytes: {f16 d; f16 m; u8 qh[4]; u8 qs[16]}
//         w[e] = q[e] * d + m
//   Q8_0  32 weights, 34 bytes: {f16 d; i8 qs[32]}   w[j] = qs[j] * d
//   Q4_K  256 weights, 144 bytes: {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}
//         8 sub-blocks of 32 with 6-bit scale sc[s] and min m[s] packed in
//         `scales` (ScaleMinK4). Chunk c < 4 of 64 weights: qs[32c + l]'s
//         low nibble is weight 64c + l (sub-block 2c), its high nibble
//         weight 64c + 32 + l (sub-block 2c + 1).
//         w = (d * sc) * q - dmin * m
//   Q5_K  256 weights, 176 bytes: {f16 d; f16 dmin; u8 scales[12];
//         u8 qh[32]; u8 qs[128]}: Q4_K plus a fifth bit, bit s of qh[l]
//         for the weight at l of sub-block s (value + 16).
//   Q6_K  256 weights, 210 bytes: {u8 ql[128]; u8 qh[64]; i8 scales[16];
//         f16 d}. Half h < 2 of 128 weights, group g < 4 of 32, l < 32:
//         q = ((ql[64h + l + 32 (g & 1)] >> 4 (g >> 1)) & 0xF)
//             | ((qh[32h + l] >> 2g) & 3) << 4,
//         w[128h + 32g + l] = (d * scales[8h + 2g + l / 16]) * (q - 32)
//
// Dequantization is ggml's dequantize_row_* (ggml-quants.c) operation for
// operation: the same float products and sums in the same order, each
// rounded (no FMA: the build uses -ffp-contract=off), so every path here
// and in the vector kernels gives ggml's to_float bits.
// Threads: pure functions over caller-owned memory.
#ifndef TANDEM_ENGINE_MODEL_QUANT_BLOCKS_H_
#define TANDEM_ENGINE_MODEL_QUANT_BLOCKS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#include "engine/gguf/gguf_file.h"
#include "engine/gguf/half.h"

namespace tandem::model::internal {

// The little-endian u16 at p (an f16 scale's bits), unaligned.
inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The f16 at p as a float (a block's d, m or dmin).
inline float LoadF16(const uint8_t* p) { return gguf::HalfToFloat(LoadU16(p)); }

// Whether `type` is one of the block-quantized types above (Q8_0 included).
bool IsQuantized(gguf::TensorType type);

// Sub-block j < 8's 6-bit scale and min of a Q4_K / Q5_K super-block
// (ggml's get_scale_min_k4): j < 4: sc = q[j] & 63, m = q[j + 4] & 63;
// else sc = (q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4,
// m = (q[j + 4] >> 4) | (q[j] >> 6) << 4. `q`: the 12 scale bytes.
inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// ScaleMinK4 of all 8 sub-blocks at once, on 32-bit words (as ggml's own
// Q4_K / Q5_K dot products unpack them): the bytes of words[0..1] are
// sc[0..7], those of words[2..3] m[0..7] (little-endian). `q`: the 12
// scale bytes.
inline void ScaleMinWordsK4(const uint8_t* q, uint32_t (&words)[4]) {
  uint32_t u[3];
  std::memcpy(u, q, sizeof u);
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  words[0] = u[0] & kLow6;
  words[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  words[2] = u[1] & kLow6;
  words[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
}

// Writes the n weights of quantized `type` at `data` (n a multiple of the
// block size) as floats to `out`: ggml's dequantize_row_<type>, scalar.
void DequantizeBlocksGeneric(gguf::TensorType type, const uint8_t* data, size_t n, float* out);

// Weight e (< block size) of the block at `block`, as
// DequantizeBlocksGeneric gives it. For tails and tests.
float DequantizeOne(gguf::TensorType type, const uint8_t* block, size_t e);

// The index of the first of `n_blocks` blocks of `type` at `data` whose
// f16 scale (d, and m / dmin where the type has one) is infinite or NaN;
// nullopt when all are finite (and for unquantized types).
std::optional<uint64_t> FindNonFiniteScale(gguf::TensorType type, const uint8_t* data,
                                           uint64_t n_blocks);

}  // namespace tandem::model::internal

#endif  // TANDEM_ENGINE_MODEL_QUANT_BLOCKS_H_
