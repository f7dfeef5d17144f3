#include "engine/backend/cuda/kv_staging.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/cuda/kv_copy_runs.h"

namespace tandem::backend::cuda {

absl::Status CopyKvThroughStaging(const KvStagingRange& r, bool to_device, char* const stage[2],
                                  size_t staging_bytes, char* const host[2],
                                  const KvStagedCopy& copy, const KvStagedWait& wait) {
  if (r.row_bytes == 0 || staging_bytes < r.row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV staging of ", staging_bytes, " bytes holds no row of ", r.row_bytes, " bytes"));
  }
  std::string error;
  // The whole range first: nothing is copied for a bad one.
  (void)SplitKvCopyRuns(r.block_table, r.layer, r.layer_blocks, r.max_block, r.block_size,
                        r.token_start, r.count, &error);
  if (!error.empty()) return absl::InvalidArgumentError(error);
  const size_t rb = r.row_bytes;
  const int32_t chunk =
      static_cast<int32_t>(std::min<size_t>(staging_bytes / rb, static_cast<size_t>(r.count)));
  for (int32_t done = 0; done < r.count;) {
    const int32_t n = std::min(chunk, r.count - done);
    const std::vector<KvCopyRun> runs =
        SplitKvCopyRuns(r.block_table, r.layer, r.layer_blocks, r.max_block, r.block_size,
                        r.token_start + done, n, &error);
    if (!error.empty()) return absl::InternalError(error);  // validated above
    const size_t host_offset = static_cast<size_t>(done) * rb;
    const size_t chunk_bytes = static_cast<size_t>(n) * rb;
    if (to_device) {
      for (int kv = 0; kv < 2; ++kv) std::memcpy(stage[kv], host[kv] + host_offset, chunk_bytes);
    }
    for (const KvCopyRun& run : runs) {
      for (int kv = 0; kv < 2; ++kv) {
        copy(kv, static_cast<size_t>(run.pool_row) * rb, static_cast<size_t>(run.buffer_row) * rb,
             static_cast<size_t>(run.rows) * rb);
      }
    }
    // The staging is reused by the next chunk; a writer's caller may free
    // its rows once this returns.
    wait();
    if (!to_device) {
      for (int kv = 0; kv < 2; ++kv) std::memcpy(host[kv] + host_offset, stage[kv], chunk_bytes);
    }
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace tandem::backend::cuda
