#include "engine/backend/cuda/kv_copy_runs.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::backend::cuda {

std::vector<KvCopyRun> SplitKvCopyRuns(std::span<const int32_t> block_table, int32_t layer,
                                       int32_t layer_blocks, int32_t max_block, int32_t block_size,
                                       int32_t token_start, int32_t count, std::string* error) {
  std::vector<KvCopyRun> runs;
  error->clear();
  if (token_start < 0 || count < 0 || block_size <= 0 || layer < 0) {
    *error = absl::StrCat("bad KV token range: start ", token_start, ", count ", count,
                          ", block_size ", block_size, ", layer ", layer);
    return runs;
  }
  const int64_t end = int64_t{token_start} + count;
  if (end > static_cast<int64_t>(block_table.size()) * block_size) {
    *error = absl::StrCat("block table of ", block_table.size(), " blocks (block_size ", block_size,
                          ") does not cover tokens [", token_start, ", ", end, ")");
    return runs;
  }
  for (int64_t t = token_start; t < end;) {
    const int32_t block = block_table[static_cast<size_t>(t / block_size)];
    if (block < 0 || block >= max_block) {
      *error =
          absl::StrCat("block id ", block, " of token ", t, " is outside [0, ", max_block, ")");
      runs.clear();
      return runs;
    }
    const int64_t slot = t % block_size;
    const int64_t rows = std::min<int64_t>(block_size - slot, end - t);
    const int64_t pool_row = (int64_t{layer} * layer_blocks + block) * block_size + slot;
    if (!runs.empty() && runs.back().pool_row + runs.back().rows == pool_row) {
      runs.back().rows += rows;
    } else {
      runs.push_back({pool_row, t - token_start, rows});
    }
    t += rows;
  }
  return runs;
}

}  // namespace tandem::backend::cuda
