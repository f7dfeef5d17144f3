// Paged KV cache storage: a pool of fixed-size blocks plus free-list
// allocation (vLLM v1's BlockPool / PagedAttention, Kwon et al. 2023).
//
// Owns: the KV memory (F32) and which blocks are free. Does not touch:
// which sequence owns a block (the caller's block table), scheduling.
// Threads: not thread-safe; the owning worker serializes calls (engine loop
// thread, or under the worker's mutex).
//
// Memory layout, per block b and layer l (floats):
//   K(b, l): [block_size][n_kv_heads * head_dim]   then
//   V(b, l): [block_size][n_kv_heads * head_dim]
// Token t of a sequence lives in block block_table[t / block_size], slot
// t % block_size ("token addressing": any block size works with the wire
// format, which is per token).
#ifndef TANDEM_ENGINE_KV_BLOCK_POOL_H_
#define TANDEM_ENGINE_KV_BLOCK_POOL_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace tandem::kv {

struct KvShape {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;  // token slots per block
  int32_t kv_dim() const { return n_kv_heads * head_dim; }
};

class BlockPool {
 public:
  // Allocates num_blocks blocks of `shape` up front (zeroed).
  BlockPool(const KvShape& shape, int32_t num_blocks);

  const KvShape& shape() const { return shape_; }
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

  // Pointers to block b's K or V rows for `layer`: [block_size][kv_dim].
  float* K(int32_t block, int32_t layer);
  float* V(int32_t block, int32_t layer);
  const float* K(int32_t block, int32_t layer) const;
  const float* V(int32_t block, int32_t layer) const;

 private:
  KvShape shape_;
  int32_t num_blocks_;
  std::vector<float> storage_;
  std::deque<int32_t> free_;
  std::vector<bool> in_use_;
};

// Number of blocks needed to hold n_tokens: ceil(n_tokens / block_size).
int32_t BlocksForTokens(int32_t n_tokens, int32_t block_size);

// Copies K and V rows of tokens [token_start, token_start + count) of the
// sequence with `block_table` out of / into contiguous buffers of
// [count][kv_dim] floats each. Used by the KV sender and receiver. The
// table must cover token_start + count tokens (a caller bug otherwise).
void ReadKvRows(const BlockPool& pool, const std::vector<int32_t>& block_table,
                int32_t layer, int32_t token_start, int32_t count, float* k_out,
                float* v_out);
void WriteKvRows(BlockPool& pool, const std::vector<int32_t>& block_table,
                 int32_t layer, int32_t token_start, int32_t count,
                 const float* k, const float* v);

}  // namespace tandem::kv

#endif  // TANDEM_ENGINE_KV_BLOCK_POOL_H_
