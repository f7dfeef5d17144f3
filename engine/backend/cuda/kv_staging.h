// The chunked staging loop of CudaKvStorage::ReadTokens / WriteTokens
// (the TCP-staged KV path: a CUDA worker's rows cross to and from the
// transfer's host buffers through pinned staging), as host logic with the
// device copies and the wait passed in, so that it is unit-tested on the
// CPU with a host-memory stand-in (tests/cuda/kv_transport_tcp_staged_test)
// and CudaKvStorage runs exactly this loop.
//
// A range of tokens is copied in chunks of the rows the staging holds
// (staging_bytes / row_bytes per pool); each chunk is split into
// contiguous runs (kv_copy_runs.h), one `copy` per run and pool, then
// `wait` (the copies of the chunk are done), so the staging is reused by
// the next chunk only after it. Reading: pools -> staging (copy), wait,
// staging -> host rows (memcpy). Writing: host rows -> staging (memcpy),
// staging -> pools (copy), wait.
// Threads: a pure function of its arguments (the callbacks run on the
// caller's thread).
#ifndef TANDEM_ENGINE_BACKEND_CUDA_KV_STAGING_H_
#define TANDEM_ENGINE_BACKEND_CUDA_KV_STAGING_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "absl/status/status.h"

namespace tandem::backend::cuda {

// Where the rows of one staged copy are.
struct KvStagingRange {
  std::span<const int32_t> block_table;  // the sequence's blocks
  int32_t layer = 0;
  int32_t layer_blocks = 0;  // the pools' blocks per layer (layer stride)
  int32_t max_block = 0;     // block ids must lie in [0, max_block)
  int32_t block_size = 0;    // tokens per block
  int32_t token_start = 0;
  int32_t count = 0;     // tokens
  size_t row_bytes = 0;  // one token's K (or V) row
};

// One device copy of `bytes` between pool `kv` (0: K, 1: V) at byte
// `pool_offset` (from the pool base: row * row_bytes) and staging half
// `kv` at byte `stage_offset`; pools -> staging when reading, staging ->
// pools when writing. May be asynchronous until the next `wait`.
using KvStagedCopy =
    std::function<void(int kv, size_t pool_offset, size_t stage_offset, size_t bytes)>;
// Returns once every copy issued since the last wait is done.
using KvStagedWait = std::function<void()>;

// Copies range `r` between the host rows host[0] (K) and host[1] (V)
// (count * row_bytes bytes each, token after token; only read when
// `to_device`) and the pools, through stage[0] / stage[1] (staging_bytes
// each). Validates the whole range before any copy. Errors (nothing
// copied): INVALID_ARGUMENT for a range the table does not cover, a block
// id outside [0, max_block), a negative start or count, or a staging
// smaller than one row (naming it). count 0 copies nothing.
[[nodiscard]] absl::Status CopyKvThroughStaging(const KvStagingRange& r, bool to_device,
                                                char* const stage[2], size_t staging_bytes,
                                                char* const host[2], const KvStagedCopy& copy,
                                                const KvStagedWait& wait);

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_KV_STAGING_H_
