// Q8_0 weights with integer dot products (engine.q8_matmul: int8; internal
// to engine/model), as llama.cpp computes a Q8_0 matrix times F32
// activations: the activations are quantized to Q8_0 per block of 32, each
// block pair is an exact int32 dot product, and the blocks are combined in
// float in index order.
//
// Numerics (one bit-exact class for every ISA, batch size, thread count
// and tile): for each row r and output column o, with blocks b = 0, 1, ...
// of 32 elements along `in`,
//   acc = 0.0f;  acc = acc + (float)sumi_b * (dw_b * dx_b)
// each multiply and add rounded separately (no FMA), where sumi_b is the
// int32 sum of the 32 products q_w * q_x of weight row o and activation row
// r, dw_b the weight block's F16 scale and dx_b the activation block's,
// both widened to F32: ggml's generic ggml_vec_dot_q8_0_q8_0
// (ggml-cpu/quants.c). The activation blocks are ggml's
// quantize_row_q8_0_ref (ggml/src/ggml-quants.c), see QuantizeActivationRow.
// sumi_b is exact integer arithmetic on every path (|sumi_b| <= 32 * 127 *
// 128), so the ISAs below agree bit for bit:
//   kGeneric       scalar, over the packed layout
//   kAvx2          maddubs(|w| as u8, sign(x, w) as s8) + madd: the pair
//                  sums stay within 2 * 128 * 127 < 32767 (no saturation)
//   kAvxVnni       256-bit vpdpbusd(w + 128 as u8, x as s8), started at
//                  -128 * sum(x) of the activation block (int32, no
//                  saturation: |sum| <= 32 * 255 * 127)
//   kAvx512Vnni    the same on 512 bits
// Activations are within +-127 (roundf of x * 127 / amax); a weight from a
// file may be -128, which every path handles.
// Threads: pure functions over caller-owned memory (MatMulInt8 with a pool
// blocks until every thread is done).
#ifndef TANDEM_ENGINE_MODEL_Q8_INT8_H_
#define TANDEM_ENGINE_MODEL_Q8_INT8_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/model/thread_pool.h"
#include "engine/model/weight_matrix.h"

namespace tandem::model::internal {

// ggml's quantize_row_q8_0_ref of one row of n floats (n a multiple of 32),
// operation for operation: per block of 32, amax = max |x[j]|,
// d = amax / 127 and id = d ? 1.0f / d : 0.0f (both F32),
// q[j] = (int8) roundf(x[j] * id) (ties away from zero; not llama.cpp's
// x86 runtime quantizer, which rounds ties to even), d stored as F16
// (round to nearest even). Writes q[n] and the stored scale widened back
// to F32, d[n / 32] (an exact F16 value). x must be finite. Where ggml's
// int8 cast is undefined (a block of |x| < ~1e-36: id overflows to
// infinity; its F16 d is 0, so the block adds 0 either way) q is 0.
// Uses AVX-512F when the CPU has it; the bits are the same either way.
void QuantizeActivationRow(const float* x, size_t n, int8_t* q, float* d);

// QuantizeActivationRow on the scalar path, for tests.
void QuantizeActivationRowGeneric(const float* x, size_t n, int8_t* q, float* d);

// A Q8_0 matrix W (WeightMatrix of type Q8_0, dims [in, out]) repacked once
// at load for the int8 kernels: 1.0625 bytes per weight, as in the file.
// Columns (output rows of W) go in groups of kGroupCols = 16; group g's
// bytes start at data() + g * GroupBytes() (64-byte aligned) and hold, for
// each block b (32 elements of `in`):
//   a weight tile of kTileBytes = 512 bytes at Tile(g, b): the weight q of
//     column c, element 4j + i of the block, stored as q + 128 (u8: q XOR
//     0x80) at byte 64j + 4c + i (j < 8, c < 16, i < 4): vector j holds 4
//     consecutive elements of each of the 16 columns, one 32-bit lane per
//     column (vpdpbusd's shape, weights as its unsigned operand)
//   the 16 columns' F16 scales d (32 bytes) at Scales(g, b), after all of
//     the group's tiles.
// Columns >= out of the last group are zero (q 0, stored 0x80; d 0).
class Q8Int8Matrix {
 public:
  static constexpr size_t kGroupCols = 16;
  static constexpr size_t kTileBytes = 512;
  static constexpr size_t kScaleBytes = 2 * kGroupCols;

  // Packs `w` (type Q8_0, `in` a multiple of 32; the loader checks). Copies
  // the bytes: `w` need not outlive the result.
  static std::unique_ptr<Q8Int8Matrix> Pack(const WeightMatrix& w);

  size_t in() const { return in_; }
  size_t out() const { return out_; }
  size_t blocks() const { return in_ / 32; }
  size_t groups() const { return (out_ + kGroupCols - 1) / kGroupCols; }
  // Bytes of one group: its tiles and scales, rounded up to 64.
  size_t GroupBytes() const { return (blocks() * (kTileBytes + kScaleBytes) + 63) / 64 * 64; }
  // The weight tile of group g, block b (layout above); 64-byte aligned.
  const uint8_t* Tile(size_t g, size_t b) const { return data_.get() + TileOffset(g, b); }
  // The 16 F16 scales of group g, block b; 32-byte aligned.
  const uint8_t* Scales(size_t g, size_t b) const { return data_.get() + ScalesOffset(g, b); }

 private:
  size_t TileOffset(size_t g, size_t b) const { return g * GroupBytes() + b * kTileBytes; }
  size_t ScalesOffset(size_t g, size_t b) const {
    return g * GroupBytes() + blocks() * kTileBytes + b * kScaleBytes;
  }
  struct Free {
    void operator()(uint8_t* p) const;
  };
  size_t in_ = 0;
  size_t out_ = 0;
  std::unique_ptr<uint8_t, Free> data_;
};

// The instruction sets of the int8 kernels (see the top of this file); all
// give the same bits.
enum class Int8IsaKind { kGeneric, kAvx2, kAvxVnni, kAvx512Vnni };

// Whether this CPU and OS run `isa` (kGeneric always).
bool Int8IsaSupported(Int8IsaKind isa);

// The best supported of the above, detected once per process.
Int8IsaKind BestInt8Isa();

// "generic", "avx2", "avxvnni" or "avx512vnni".
const char* Int8IsaName(Int8IsaKind isa);

// y[r][o] for r < rows and o in [16 * g_begin, min(out, 16 * g_end)), the
// formula at the top of this file, from activations already quantized by
// QuantizeActivationRow: q: [rows][w.in()], d: [rows][w.blocks()];
// y: [rows][w.out()] (other columns left as they are). An unsupported `isa`
// runs kGeneric. For tests and benchmarks; the engine calls MatMulInt8.
void MatMulInt8GroupsWithIsa(Int8IsaKind isa, const int8_t* q, const float* d,
                             const Q8Int8Matrix& w, size_t rows, size_t g_begin, size_t g_end,
                             float* y);

// y[r][o] = the formula above of W's row o and x[r] quantized per block
// (QuantizeActivationRow), for r < rows, o < w.out(), on `isa` (an
// unsupported one runs kGeneric). x: [rows][w.in()], y: [rows][w.out()].
// With `pool` of more than one thread and rows * in * out >= min_work, the
// quantization is split over rows and the products over column groups
// (ThreadPool::ParallelFor); the reduction over `in` never is, so y's bits
// depend on neither.
void MatMulInt8WithIsa(Int8IsaKind isa, const float* x, const Q8Int8Matrix& w, size_t rows,
                       float* y, ThreadPool* pool, size_t min_work);

// MatMulInt8WithIsa on BestInt8Isa().
void MatMulInt8(const float* x, const Q8Int8Matrix& w, size_t rows, float* y, ThreadPool* pool,
                size_t min_work);

}  // namespace tandem::model::internal

#endif  // TANDEM_ENGINE_MODEL_Q8_INT8_H_
