// Weight matrices kept in their GGUF storage type (internal to engine/model).
//
// The forward pass never widens a whole matrix to F32: MatMul dequantizes a
// few rows at a time into a small F32 panel that stays in L1 and runs the
// F32 micro-kernel on it, so an F16 or Q8_0 model occupies (and streams
// from memory) 2 or 1.0625 bytes per weight instead of 4. Dequantization is
// exact (F16/BF16 widen exactly; Q8_0 is one rounded product q * d), so a
// matrix gives the very bits its F32 conversion would (ConvertToF32), for
// every batch size and thread count.
// Formats: ggml's (GGUF spec, "GGML types"): F16 = IEEE 754 binary16,
// BF16 = the high half of a binary32, Q8_0 = blocks of 32 weights
// {f16 d; int8 q[32]} (34 bytes) with weight = q * d (ggml's
// dequantize_row_q8_0).
// Threads: pure functions over caller-owned memory.
#ifndef TANDEM_ENGINE_MODEL_WEIGHT_MATRIX_H_
#define TANDEM_ENGINE_MODEL_WEIGHT_MATRIX_H_

#include <cstddef>
#include <cstdint>

#include "engine/gguf/gguf_file.h"
#include "engine/gguf/half.h"

namespace tandem::model::internal {

class Q8Int8Matrix;    // q8_int8.h
class F32PanelMatrix;  // f32_panels.h

// A weight matrix W of GGUF dims [in, out]: `out` rows of `in` elements of
// `type`, row o starting at data + o * RowBytes(). For Q8_0, `in` is a
// multiple of 32 (the loader checks). `data` is not owned and needs no
// alignment (an F32 matrix: 4-byte aligned).
struct WeightMatrix {
  gguf::TensorType type = gguf::TensorType::kF32;
  const uint8_t* data = nullptr;
  size_t in = 0;
  size_t out = 0;
  // For a Q8_0 matrix under engine.q8_matmul: int8, its packed copy
  // (q8_int8.h, owned by whoever owns the matrix): MatMul then takes the
  // integer path. Null: MatMul dequantizes exactly (everything else here
  // ignores it).
  const Q8Int8Matrix* int8 = nullptr;
  // For an F32 matrix of a model loaded with LlamaModelOptions::f32_panels,
  // its panel packing (f32_panels.h, owned likewise): MatMul then runs the
  // outer-product GEMM and its fma-chain numerics. Null: the dot-product
  // kernels of cpu_kernels.h.
  const F32PanelMatrix* f32_panels = nullptr;

  // Bytes of one row: in * 4 (F32), in * 2 (F16, BF16), in / 32 * 34 (Q8_0).
  size_t RowBytes() const;

  // An F32 view of `out` rows of `in` floats at `w`.
  static WeightMatrix F32(const float* w, size_t in, size_t out) {
    return {gguf::TensorType::kF32, reinterpret_cast<const uint8_t*>(w), in, out};
  }
};

// engine/gguf/half.h's exact binary16 -> binary32, used by the widening
// code of this folder.
using gguf::HalfToFloat;

// Writes n elements of `type` starting at `data` (GGUF little-endian bytes,
// n a multiple of the type's block size, 32 for Q8_0) as floats to `out`.
// Uses AVX-512F or F16C / AVX2 when the CPU has them; the bits are the
// same either way.
void ConvertToF32(gguf::TensorType type, const uint8_t* data, size_t n, float* out);

// The code paths of ConvertToF32, for tests: each must give the same bits.
enum class DequantIsa { kGeneric, kAvx2, kAvx512 };

// ConvertToF32 on `isa`'s code path; false (nothing written) when this CPU
// cannot run it.
bool ConvertToF32With(DequantIsa isa, gguf::TensorType type, const uint8_t* data, size_t n,
                      float* out);

// out[i][k] = W[o_begin + i][k] as F32 for i < count, k < w.in
// (ConvertToF32 of each row). out: [count][w.in].
void DequantizeRows(const WeightMatrix& w, size_t o_begin, size_t count, float* out);

}  // namespace tandem::model::internal

#endif  // TANDEM_ENGINE_MODEL_WEIGHT_MATRIX_H_
