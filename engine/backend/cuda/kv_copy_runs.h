// Splitting a token range of one layer of a paged KV pool into copies of
// contiguous rows (pure host logic of CudaKvStorage, unit-tested on the
// CPU). In the pool layout of cuda_kernels.h (PagedKv), token slot `slot`
// of block `block` of layer `layer` is row (layer * layer_blocks + block) *
// block_size + slot, a row being one token's K (or V): kv_dim elements. A
// block's slots are consecutive rows, and so are the last slot of block b
// and the first of block b + 1, so a run spans blocks whose ids follow
// each other in the table.
// Threads: pure functions.
#ifndef TANDEM_ENGINE_BACKEND_CUDA_KV_COPY_RUNS_H_
#define TANDEM_ENGINE_BACKEND_CUDA_KV_COPY_RUNS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tandem::backend::cuda {

// `rows` consecutive rows starting at pool row `pool_row`, which are the
// host buffer's rows [buffer_row, buffer_row + rows).
struct KvCopyRun {
  int64_t pool_row = 0;
  int64_t buffer_row = 0;
  int64_t rows = 0;
  bool operator==(const KvCopyRun&) const = default;
};

// The runs covering tokens [token_start, token_start + count) of the
// sequence with `block_table` in layer `layer`, in token order, each as
// long as possible; buffer row i is token token_start + i. `layer_blocks`
// is the pool's blocks per layer (its layer stride). Returns an empty
// vector for count 0. A caller bug (token_start < 0, count < 0, a table
// shorter than token_start + count tokens, a block id outside [0,
// max_block)) returns the empty vector and sets *error to a message
// naming it (error may not be null).
std::vector<KvCopyRun> SplitKvCopyRuns(std::span<const int32_t> block_table, int32_t layer,
                                       int32_t layer_blocks, int32_t max_block, int32_t block_size,
                                       int32_t token_start, int32_t count, std::string* error);

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_KV_COPY_RUNS_H_
