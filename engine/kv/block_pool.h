// The free list of KV blocks (vLLM v1's BlockPool): which of the
// num_blocks() block ids are free, handed out in FIFO order.
//
// Owns: which blocks are free. Does not touch: KV memory (a backend's
// KvStorage holds the bytes of block b), which sequence owns a block
// (KvCacheManager's block tables), scheduling.
// Threads: not thread-safe; the owning engine loop serializes calls.
#ifndef TANDEM_ENGINE_KV_BLOCK_POOL_H_
#define TANDEM_ENGINE_KV_BLOCK_POOL_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "engine/kv/kv_storage.h"

namespace tandem::kv {

class BlockPool {
 public:
  // Blocks 0 .. num_blocks - 1, all free, in ascending order.
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_in_use() const { return num_blocks_ - num_free(); }
  // Whether block b (0 <= b < num_blocks()) is on the free list.
  bool IsFree(int32_t block) const { return !in_use_[static_cast<size_t>(block)]; }

  // Takes n blocks from the head of the free list (FIFO order), or nullopt
  // (taking nothing) when fewer than n are free. Not an error: the caller
  // queues or preempts.
  std::optional<std::vector<int32_t>> Allocate(int32_t n);
  // Returns blocks to the tail of the free list, in the given order. Each
  // must be in use: freeing a free or out-of-range block is a caller bug
  // (double free) and aborts, even in release builds.
  void Free(const std::vector<int32_t>& blocks);

 private:
  int32_t num_blocks_;
  std::deque<int32_t> free_;
  std::vector<bool> in_use_;
};

}  // namespace tandem::kv

#endif  // TANDEM_ENGINE_KV_BLOCK_POOL_H_
