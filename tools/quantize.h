// Quantizers for the ggml weight formats `tandem synth-model` writes, and
// llama.cpp's choice of a type per tensor for its Q4_K_M / Q5_K_M files.
//
// Formats (bytes as ggml-common.h of llama.cpp lays them out; parsed and
// documented on the reading side in engine/model/quant_blocks.h):
//   F16   IEEE 754 binary16
//   Q8_0  32 weights, 34 bytes: {f16 d; i8 q[32]}
//   Q4_0  32 weights, 18 bytes: {f16 d; u8 qs[16]}
//   Q4_K  256 weights, 144 bytes: {f16 d, dmin; u8 scales[12]; u8 qs[128]}
//   Q5_K  256 weights, 176 bytes: {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
//   Q6_K  256 weights, 210 bytes: {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
// Rules: each quantizer is ggml-quants.c's quantize_row_<type>_ref, the
// function llama.cpp's llama-quantize runs when it has no importance
// matrix, operation for operation in float (rounded after each operation:
// the build uses -ffp-contract=off; f16 stores round to nearest even), so
// the bytes are llama-quantize's own (tests/tools/quantize_test.cc checks
// them against ../shared/models/kq-tiny-*.gguf). All are deterministic.
// Threads: pure functions over caller-owned memory.
#ifndef TANDEM_TOOLS_QUANTIZE_H_
#define TANDEM_TOOLS_QUANTIZE_H_

#include <cstdint>
#include <string_view>

#include "engine/gguf/gguf_file.h"
#include "engine/gguf/half.h"

namespace tandem::cli {

// engine/gguf/half.h's float -> binary16 (round to nearest even), which
// the quantizers store their scales with.
using gguf::FloatToHalf;

// Each QuantizeRow* reads n finite floats at `x` (n a multiple of the
// format's block size) and writes n / block size blocks at `out`.

// Q8_0 (ggml's quantize_row_q8_0_ref): per block of 32, d = max|x| / 127,
// stored as f16, q[j] = roundf(x[j] / d) (0 when d = 0).
void QuantizeRowQ8_0(const float* x, uint64_t n, uint8_t* out);

// Q4_0 (quantize_row_q4_0_ref): per block of 32, with m the first value of
// largest magnitude, d = m / -8 (stored as f16) and id = 1/d (0 when d = 0):
// q[j] = min(15, (int8)(x[j] * id + 8.5)), truncating; weight j < 16 in the
// low nibble of qs[j], weight j + 16 in its high nibble. Decodes as
// (q - 8) * d.
void QuantizeRowQ4_0(const float* x, uint64_t n, uint8_t* out);

// Q4_K (quantize_row_q4_K_ref). Per super-block of 256, per sub-block s of
// 32 (elements 32s..32s+31): weights w = sqrt(mean x^2) + |x|; a scale
// a_s > 0 and min m_s >= 0 fitted by ggml's make_qkx2_quants(nmax 15,
// rmin -1, rdelta 0.1, nstep 20): min(x, 0) and max(x) give a first grid,
// then for each of the 21 inverse scales (15 + rmin + 0.1 k) / range the
// levels round(iscale * (x - min)) are refitted by weighted least squares
// (min clamped to <= 0), keeping the fit of least weighted squared error.
// Then d = max a_s / 63 and dmin = max m_s / 63 (f16), the 6-bit
// sc_s = min(63, round(63 a_s / max a_s)) and m_s likewise, packed as
// ggml's get_scale_min_k4 reads them, and each level requantized against
// the stored values: q = clamp(round((x + dmin*m_s) / (d*sc_s)), 0, 15)
// (unchanged where d*sc_s = 0). Element 64c + l (c < 4, l < 32) goes in
// the low nibble of qs[32c + l], element 64c + 32 + l in its high nibble.
// Decodes as d*sc_s*q - dmin*m_s. round = to nearest, ties to even.
void QuantizeRowQ4_K(const float* x, uint64_t n, uint8_t* out);

// Q5_K (quantize_row_q5_K_ref): Q4_K's rule with 5-bit levels
// (make_qkx2_quants nmax 31, rmin -0.5, rdelta 0.1, nstep 15; q clamped to
// 0..31). The low 4 bits are packed as Q4_K's; bit 4 of element 64c + l is
// bit 2c of qh[l], that of element 64c + 32 + l bit 2c + 1.
void QuantizeRowQ5_K(const float* x, uint64_t n, uint8_t* out);

// Q6_K (quantize_row_q6_K_ref). Per super-block of 256, per sub-block b of
// 16: a signed scale from ggml's make_qx_quants(nmax 32, rmse_type 1):
// with m the first value of largest magnitude, the levels
// clamp(round(iscale * x), -32, 31) for iscale = -(32 + 0.1 k) / m, k in
// -9..9, each scored by the least-squares scale under weights x^2, the best
// kept. With S the scale of largest magnitude: iscale = -128 / S,
// d = 1 / iscale (f16; negative when S > 0), scales[b] = min(127,
// round(iscale * scale_b)), then q = clamp(round(x / (d * scales[b])),
// -32, 31) + 32 (unchanged where that product is 0). A super-block whose
// scales are all below 1e-15 in magnitude is all zero bytes. For half
// h < 2 and l < 32, with e = 128h + l: ql[64h + l] holds q[e] (low
// nibble) and q[e + 64] (high), ql[64h + l + 32] holds q[e + 32] and
// q[e + 96], and qh[32h + l] the top two bits of q[e], q[e + 32],
// q[e + 64], q[e + 96] at bits 0, 2, 4, 6. Decodes as
// d * scales[b] * (q - 32).
void QuantizeRowQ6_K(const float* x, uint64_t n, uint8_t* out);

// binary32 -> bfloat16 bits (the high half of the binary32), rounding to
// nearest even, as ggml's GGML_FP32_TO_BF16: a NaN keeps its sign and top
// payload bits and is forced quiet (| 0x40); overflow rounds to infinity.
uint16_t FloatToBf16(float x);

// Writes the n floats at `x` as `type` at `out`: F32 copied, F16 by
// FloatToHalf, BF16 by FloatToBf16, the block types by the quantizers above (n a multiple of the
// block size). `type` is one of F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K.
// The inverse of engine/model's ConvertToF32, up to the rounding.
void ConvertFromF32(gguf::TensorType type, const float* x, uint64_t n, uint8_t* out);

// How a quantized model picks each weight's type: kPure, every 2-D weight
// in the base type; kKQuantM, llama.cpp's Q4_K_M / Q5_K_M mix
// (MixTensorType).
enum class QuantMix { kPure, kKQuantM };

// llama.cpp's use_more_bits(i_layer, n_layers) (llama-quant.cpp):
// i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2, integer division.
bool UseMoreBits(int32_t layer, int32_t n_layer);

// The type of 2-D weight `name` (a GGUF tensor name, "blk.<i>.<what>.weight"
// or "token_embd.weight" / "output.weight") in a model of `n_layer`
// layers. kPure: `base`. kKQuantM (base Q4_K or Q5_K), llama.cpp's
// llama_tensor_get_type for LLAMA_FTYPE_MOSTLY_Q4_K_M / Q5_K_M on a
// model whose rows are multiples of 256: Q6_K for output.weight (for
// token_embd.weight instead when `has_output` is false: a tied output), and
// for blk.<i>.attn_v.weight and blk.<i>.ffn_down.weight when
// UseMoreBits(i, n_layer); `base` for every other weight.
gguf::TensorType MixTensorType(gguf::TensorType base, QuantMix mix, std::string_view name,
                               int32_t n_layer, bool has_output);

// general.file_type for a model of `base` under `mix`, as llama.h's
// llama_ftype: F32 0 (ALL_F32), F16 1, BF16 32, Q8_0 7, Q4_0 2, Q4_K 14 (Q4_K_S,
// what llama-quantize --pure Q4_K_S writes), Q5_K 16 (Q5_K_S), Q6_K 18;
// under kKQuantM Q4_K 15 (Q4_K_M), Q5_K 17 (Q5_K_M). 0 for other pairs.
uint32_t LlamaFileType(gguf::TensorType base, QuantMix mix);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_QUANTIZE_H_
