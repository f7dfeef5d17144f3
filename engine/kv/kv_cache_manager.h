// KV cache manager: per-sequence block tables over a BlockPool, with a
// prefix cache of full blocks keyed by a 128-bit hash chain (vLLM v1's
// KVCacheManager + BlockPool; DESIGN.md, Engine: Prefix cache).
//
// Owns: which blocks each sequence holds, block ref counts, the prefix
// cache (hash -> block) and the eviction order of free cached blocks.
// Does not touch: KV memory contents (BlockPool), scheduling decisions
// (the scheduler asks; this class answers yes/no), request lifecycles.
// Threads: not thread-safe; the owning engine thread calls it.
//
// Block hash of full block i of a token sequence (block_size tokens):
//   h_i = XXH3-128(h_{i-1} (16 bytes, big-endian hi then lo) ||
//                  token ids of block i (int32 little-endian) ||
//                  model fingerprint bytes),  h_{-1} = 0.
// Only full blocks are cached, and a block is published (made findable)
// only once every layer's K/V for all its tokens is written
// (CommitComputed). Free cached blocks (ref 0) stay findable until evicted,
// least recently freed first; a sequence's blocks are freed tail first, so
// a prefix's last block is evicted before its first.
#ifndef TANDEM_ENGINE_KV_KV_CACHE_MANAGER_H_
#define TANDEM_ENGINE_KV_KV_CACHE_MANAGER_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv/block_pool.h"
#include "engine/kv/kv_storage.h"

namespace tandem::kv {

struct BlockHash {
  uint64_t hi = 0;
  uint64_t lo = 0;
  bool operator==(const BlockHash& o) const { return hi == o.hi && lo == o.lo; }
};

// Hash of block i given h_{i-1} (`parent`; {0, 0} for block 0) and its
// block_size token ids, per the layout above.
BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> block_tokens,
                    const std::string& model_fingerprint);

// Hashes of the full blocks of `tokens` (tokens.size() / block_size of
// them), chained as described above.
std::vector<BlockHash> HashFullBlocks(std::span<const int32_t> tokens, int32_t block_size,
                                      const std::string& model_fingerprint);

struct KvCacheManagerOptions {
  // false: FindCachedPrefix never hits, nothing is published, and freed
  // blocks go straight back to the pool's free list. Default true.
  bool enable_prefix_caching = true;
  // Mixed into every block hash, so K/V from another model (or another
  // numerics) never matches. Default empty.
  std::string model_fingerprint;
  // Tokens per block (> 0). Default 16.
  int32_t block_size = 16;
  // true: every block published into the prefix cache (a kStored event)
  // and every cached block evicted (kRemoved) is recorded, in order, until
  // the owner takes them (TakeEvents). Default false: nothing is recorded
  // (and nothing is, whatever this says, without enable_prefix_caching).
  bool record_events = false;
};

// A change of the prefix cache's set of findable hashes (KV events,
// docs/architecture.md "KV events and the router's prefix index").
// kStored: `hash` became findable (CommitComputed published a block; a
// duplicate of a hash already cached records nothing). kRemoved: the block
// holding `hash` was evicted (AllocateSlots reused it). Replaying a
// manager's events in order over an empty set gives CachedHashes().
struct KvCacheEvent {
  enum class Kind { kStored, kRemoved };
  Kind kind = Kind::kStored;
  BlockHash hash;
  bool operator==(const KvCacheEvent& o) const { return kind == o.kind && hash == o.hash; }
};

// Counters of FindCachedPrefix since construction (vLLM's
// PrefixCacheStats): one lookup per call, tokens asked for (the cap) and
// tokens found.
struct PrefixCacheStats {
  uint64_t lookups = 0;
  uint64_t queried_tokens = 0;
  uint64_t hit_tokens = 0;
};

// A prefix of the prompt found in the cache: `blocks` hold tokens
// [0, num_tokens), num_tokens a multiple of block_size.
struct PrefixHit {
  std::vector<int32_t> blocks;
  int32_t num_tokens = 0;
};

class KvCacheManager {
 public:
  // `pool` (the free list) must outlive the manager, start with every
  // block free, and have no other user.
  KvCacheManager(BlockPool* pool, const KvCacheManagerOptions& options);

  // Longest cached prefix of `prompt` (whole blocks, hash chain match),
  // capped at max_hit_tokens (rounded down to a block multiple). Callers cap
  // so the last prompt token is always computed: local prefill
  // floor((L-1)/bs)*bs; a decode worker's remote hit may cover all full
  // blocks of L. Takes no references. Counts one lookup in
  // prefix_cache_stats().
  PrefixHit FindCachedPrefix(std::span<const int32_t> prompt, int32_t max_hit_tokens) const;

  // Creates sequence `seq_id`'s block table starting with `hit`'s blocks,
  // taking one reference on each (a free cached block leaves the eviction
  // queue). seq_id must not be live (aborts: a caller bug). `hit` must come
  // from FindCachedPrefix with no AllocateSlots in between (which may evict).
  void StartSequence(int64_t seq_id, const PrefixHit& hit);

  // Creates sequence `child`'s block table as the first `num_blocks` blocks
  // of live sequence `parent`'s (one more reference each; no copy), with
  // the parent's hash chain for them: parallel sampling (n > 1) shares a
  // prompt's full blocks this way whether or not prefix caching is on. A
  // live child, an unknown parent or num_blocks beyond the parent's table
  // aborts (caller bugs).
  void ForkSequence(int64_t parent, int64_t child, int32_t num_blocks);

  // Grows the sequence's block table to cover `num_tokens` tokens. Uses
  // free blocks first, then evicts free cached blocks (least recently freed
  // first). Returns false and changes nothing when not enough blocks can be
  // found: running out is a result for the scheduler, not an error.
  bool AllocateSlots(int64_t seq_id, int32_t num_tokens);

  // Records that K/V of tokens [0, num_computed) of the sequence (whose ids
  // are tokens[0, num_computed)) are written for every layer: publishes each
  // newly completed full block into the prefix cache (if another block
  // already holds that hash, the sequence keeps its own; nothing is
  // replaced).
  void CommitComputed(int64_t seq_id, std::span<const int32_t> tokens, int32_t num_computed);

  // Drops the sequence: one reference less on each of its blocks, tail
  // first. A block reaching ref 0 goes to the eviction queue if it is
  // cached, else back to the pool's free list. No-op for unknown ids.
  void FreeSequence(int64_t seq_id);

  // Extra references, e.g. to pin blocks of an ongoing KV send or of an
  // accepted remote hit. Each Pin needs one Unpin. Pin takes a block that
  // is in use or a free cached one (which leaves the eviction queue);
  // pinning a block on the pool's free list, or unpinning one at ref 0, is
  // a caller bug and aborts. Unpin releases blocks last to first, like
  // FreeSequence.
  void Pin(const std::vector<int32_t>& blocks);
  void Unpin(const std::vector<int32_t>& blocks);

  // The sequence's block table (token t lives in block t / block_size);
  // empty for unknown ids.
  const std::vector<int32_t>& BlockTable(int64_t seq_id) const;
  bool HasSequence(int64_t seq_id) const;

  int32_t block_size() const;
  int32_t num_blocks_total() const;
  // Blocks an AllocateSlots could obtain now: free + evictable cached.
  int32_t num_blocks_available() const;
  int32_t num_blocks_in_use() const;  // ref count > 0
  int32_t num_blocks_cached() const;  // findable in the prefix cache
  int32_t RefCount(int32_t block) const;
  // Whether `block` is published in the prefix cache (any ref count).
  bool IsCached(int32_t block) const;
  const PrefixCacheStats& prefix_cache_stats() const { return stats_; }

  // The events recorded since the last call, oldest first (empty unless
  // options.record_events); the list is cleared.
  std::vector<KvCacheEvent> TakeEvents();
  // Every hash findable in the prefix cache now, in no particular order
  // (num_blocks_cached() of them): the state the events taken so far plus
  // those still pending describe.
  std::vector<BlockHash> CachedHashes() const;

 private:
  struct BlockHashHasher {
    size_t operator()(const BlockHash& h) const {
      return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull));
    }
  };
  // Per-block bookkeeping, indexed by block id. A block is in exactly one
  // state: on the pool's free list (ref 0, not cached), in use (ref > 0),
  // or evictable (ref 0, cached, in lru_).
  struct BlockMeta {
    int32_t ref = 0;
    bool cached = false;
    bool in_lru = false;
    BlockHash hash;                        // valid when cached
    std::list<int32_t>::iterator lru_pos;  // valid when in_lru
  };
  struct Sequence {
    std::vector<int32_t> table;
    // Hash chain of blocks [0, hashes.size()) already handled by
    // CommitComputed (published, or left private as a duplicate).
    std::vector<BlockHash> hashes;
  };

  // One reference more; a ref-0 cached block leaves the eviction queue.
  void Acquire(int32_t block);
  // One reference less; at ref 0 a cached block joins the tail of the
  // eviction queue, an uncached one is appended to *to_pool.
  void Release(int32_t block, std::vector<int32_t>* to_pool);
  // Releases `blocks` last to first and returns the uncached ones to the pool.
  void ReleaseReversed(const std::vector<int32_t>& blocks);

  // Const after construction.
  BlockPool* const pool_;
  const KvCacheManagerOptions options_;
  const int32_t block_size_;

  std::vector<BlockMeta> meta_;
  std::list<int32_t> lru_;  // free cached blocks, least recently freed first
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> cache_;
  std::unordered_map<int64_t, Sequence> seqs_;
  int32_t num_in_use_ = 0;            // blocks with ref > 0
  mutable PrefixCacheStats stats_;    // FindCachedPrefix is a const query
  const bool record_events_;          // options.record_events && prefix caching
  std::vector<KvCacheEvent> events_;  // recorded, not yet taken
};

}  // namespace tandem::kv

#endif  // TANDEM_ENGINE_KV_KV_CACHE_MANAGER_H_
