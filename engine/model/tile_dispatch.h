// The register tile for a runtime edge (internal to engine/model's GEMM
// kernels: cpu_kernels.cc, f32_panels.cc, q8_int8.cc).
#ifndef TANDEM_ENGINE_MODEL_TILE_DISPATCH_H_
#define TANDEM_ENGINE_MODEL_TILE_DISPATCH_H_

namespace tandem::model::internal {

// Runs Isa::Tile<nr, nc>(args...) for 1 <= nr <= R and 1 <= nc <= C: a
// kernel's tile sizes are compile-time (its accumulators live in
// registers), while the rows left at a batch's end and the columns left at
// a range's end are known only at run time. Each kernel computes every
// element with the same operations whatever its tile, so an edge tile
// gives the bits a full one would.
template <typename Isa, int R, int C, typename... Args>
void RunTile(int nr, int nc, const Args&... args) {
  if constexpr (R > 1) {
    if (nr < R) return RunTile<Isa, R - 1, C>(nr, nc, args...);
  }
  if constexpr (C > 1) {
    if (nc < C) return RunTile<Isa, R, C - 1>(nr, nc, args...);
  }
  Isa::template Tile<R, C>(args...);
}

}  // namespace tandem::model::internal

#endif  // TANDEM_ENGINE_MODEL_TILE_DISPATCH_H_
