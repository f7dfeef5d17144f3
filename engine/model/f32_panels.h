// F32 weights packed in column panels for an outer-product GEMM (internal
// to engine/model): the CPU forward's MatMul for every F32 matrix of a
// model loaded with LlamaModelOptions::f32_panels.
//
// Numerics (one bit-exact class for every ISA, batch size, tile, K block
// and thread count): for each row r and output column o,
//   acc = 0.0f;  for k = 0, 1, ..., in - 1:  acc = fma(x[r][k], W[o][k], acc)
// one fused multiply-add chain in index order (one rounding per step), as
// std::fma computes it and as the CUDA backend's fixed-tile GEMM does
// (engine/backend/cuda/fixed_gemm.cu). Every ISA below runs exactly that
// chain per element, so they agree bit for bit:
//   kGeneric   scalar std::fma
//   kAvx2      8-lane vfmadd231ps, a tile of 6 rows x 16 columns
//   kAvx512    16-lane vfmadd231ps, a tile of 8 rows x 48 columns
// The blocking (after BLIS, Van Zee & van de Geijn, "BLIS: A Framework for
// Rapidly Instantiating BLAS Functionality", TOMS 2015): panels of 16
// output columns are packed once at load ([in][16] floats each, so a step
// of k reads 64 contiguous bytes per panel); a thread takes whole panels;
// the K loop runs in blocks of kKBlock in increasing k, a tile's 16-lane
// accumulators stored to y between blocks and reloaded (exact), so a block
// of panels stays in L1 while every row passes over it and the order per
// element does not depend on M.
// Threads: pure functions over caller-owned memory (MatMulF32Panels with a
// pool blocks until every thread is done).
#ifndef TANDEM_ENGINE_MODEL_F32_PANELS_H_
#define TANDEM_ENGINE_MODEL_F32_PANELS_H_

#include <cstddef>
#include <cstdlib>
#include <memory>

#include "engine/model/cpu_kernels.h"
#include "engine/model/thread_pool.h"
#include "engine/model/weight_matrix.h"

namespace tandem::model::internal {

// An F32 matrix W (WeightMatrix of type F32, dims [in, out]) repacked once
// at load: panel p holds columns [16p, 16p + 16) (output rows of W) as
// [in][16] floats, W[16p + c][k] at Panel(p)[16k + c]. Columns >= out of
// the last panel are zero and never stored.
class F32PanelMatrix {
 public:
  static constexpr size_t kPanelCols = 16;

  // Packs `w` (type F32). Copies the values: `w` need not outlive the result.
  static std::unique_ptr<F32PanelMatrix> Pack(const WeightMatrix& w);

  size_t in() const { return in_; }
  size_t out() const { return out_; }
  size_t panels() const { return (out_ + kPanelCols - 1) / kPanelCols; }
  // Panel p, [in][16] floats, 64-byte aligned.
  const float* Panel(size_t p) const { return data_.get() + p * in_ * kPanelCols; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  size_t in_ = 0;
  size_t out_ = 0;
  std::unique_ptr<float, Free> data_;
};

// K elements per block of the K loop (see the top of this file).
inline constexpr size_t kPanelKBlock = 128;

// Rows of x per pass over the panels: about this many bytes of x (rows x
// in floats, at least one tile of rows), so a large batch's rows stay in
// L2 while the panels stream by. Changes no bit (each element's chain is
// the same in every pass).
inline constexpr size_t kPanelRowBlockBytes = 512 * 1024;

// y[r][o] for r < rows and o in [16 * p_begin, min(out, 16 * p_end)), the
// chain at the top of this file; x: [rows][w.in()], y: [rows][w.out()]
// (other columns left as they are). An unsupported `isa` runs kGeneric.
// For tests and benchmarks; the engine calls MatMulF32Panels.
void MatMulF32PanelsRangeWithIsa(KernelIsaKind isa, const float* x, const F32PanelMatrix& w,
                                 size_t rows, size_t p_begin, size_t p_end, float* y);

// y = the chain above for every row and column, on `isa`, with `pool` of
// more than one thread splitting whole panels when rows * in * out >=
// min_work (the reduction over `in` is never split, so y's bits depend on
// neither).
void MatMulF32PanelsWithIsa(KernelIsaKind isa, const float* x, const F32PanelMatrix& w, size_t rows,
                            float* y, ThreadPool* pool, size_t min_work);

// MatMulF32PanelsWithIsa on ActiveKernelIsa() (which changes the speed,
// never the bits).
void MatMulF32Panels(const float* x, const F32PanelMatrix& w, size_t rows, float* y,
                     ThreadPool* pool, size_t min_work);

}  // namespace tandem::model::internal

#endif  // TANDEM_ENGINE_MODEL_F32_PANELS_H_
