#include "engine/kv/kv_cache_manager.h"

#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <optional>

namespace tandem::kv {
namespace {

void PutU64BigEndian(uint64_t v, std::vector<uint8_t>* out) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<uint8_t>(v >> shift));
}

void PutI32LittleEndian(int32_t v, std::vector<uint8_t>* out) {
  const uint32_t u = static_cast<uint32_t>(v);
  for (int shift = 0; shift < 32; shift += 8) out->push_back(static_cast<uint8_t>(u >> shift));
}

}  // namespace

BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> block_tokens,
                    const std::string& model_fingerprint) {
  // Explicit byte order, so the hash (and any index built on it) is the
  // same on every host.
  std::vector<uint8_t> bytes;
  bytes.reserve(16 + 4 * block_tokens.size() + model_fingerprint.size());
  PutU64BigEndian(parent.hi, &bytes);
  PutU64BigEndian(parent.lo, &bytes);
  for (int32_t t : block_tokens) PutI32LittleEndian(t, &bytes);
  bytes.insert(bytes.end(), model_fingerprint.begin(), model_fingerprint.end());
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return BlockHash{h.high64, h.low64};
}

std::vector<BlockHash> HashFullBlocks(std::span<const int32_t> tokens, int32_t block_size,
                                      const std::string& model_fingerprint) {
  assert(block_size > 0);
  const size_t bs = static_cast<size_t>(block_size);
  std::vector<BlockHash> out;
  out.reserve(tokens.size() / bs);
  BlockHash parent;
  for (size_t i = 0; (i + 1) * bs <= tokens.size(); ++i) {
    parent = HashBlock(parent, tokens.subspan(i * bs, bs), model_fingerprint);
    out.push_back(parent);
  }
  return out;
}

KvCacheManager::KvCacheManager(BlockPool* pool, const KvCacheManagerOptions& options)
    : pool_(pool),
      options_(options),
      block_size_(options.block_size),
      meta_(static_cast<size_t>(pool->num_blocks())),
      record_events_(options.record_events && options.enable_prefix_caching) {
  // The manager is the pool's only user, so it must start with every block free.
  assert(pool->num_free() == pool->num_blocks() && options.block_size > 0);
}

PrefixHit KvCacheManager::FindCachedPrefix(std::span<const int32_t> prompt,
                                           int32_t max_hit_tokens) const {
  PrefixHit hit;
  ++stats_.lookups;
  stats_.queried_tokens += static_cast<uint64_t>(
      std::max<int64_t>(0, std::min<int64_t>(static_cast<int64_t>(prompt.size()), max_hit_tokens)));
  if (!options_.enable_prefix_caching || max_hit_tokens < block_size_) return hit;
  const size_t bs = static_cast<size_t>(block_size_);
  const size_t max_blocks = std::min(prompt.size(), static_cast<size_t>(max_hit_tokens)) / bs;
  BlockHash parent;
  for (size_t i = 0; i < max_blocks; ++i) {
    parent = HashBlock(parent, prompt.subspan(i * bs, bs), options_.model_fingerprint);
    const auto it = cache_.find(parent);
    if (it == cache_.end()) break;
    hit.blocks.push_back(it->second);
  }
  hit.num_tokens = static_cast<int32_t>(hit.blocks.size()) * block_size_;
  stats_.hit_tokens += static_cast<uint64_t>(hit.num_tokens);
  return hit;
}

void KvCacheManager::StartSequence(int64_t seq_id, const PrefixHit& hit) {
  // Restarting a live sequence would drop its references: caller bug.
  if (seqs_.contains(seq_id)) std::abort();
  Sequence& seq = seqs_[seq_id];
  seq.table = hit.blocks;
  seq.hashes.reserve(hit.blocks.size());
  for (int32_t b : hit.blocks) {
    // A hit is only valid until the next call that may evict; taking it
    // later is a caller bug.
    assert(meta_[static_cast<size_t>(b)].cached);
    Acquire(b);
    seq.hashes.push_back(meta_[static_cast<size_t>(b)].hash);
  }
}

void KvCacheManager::ForkSequence(int64_t parent, int64_t child, int32_t num_blocks) {
  const auto it = seqs_.find(parent);
  if (it == seqs_.end() || seqs_.contains(child) || num_blocks < 0 ||
      static_cast<size_t>(num_blocks) > it->second.table.size()) {
    std::abort();
  }
  const Sequence& from = it->second;
  Sequence fork;
  fork.table.assign(from.table.begin(), from.table.begin() + num_blocks);
  fork.hashes.assign(from.hashes.begin(),
                     from.hashes.begin() + std::min<size_t>(from.hashes.size(), num_blocks));
  for (int32_t b : fork.table) Acquire(b);
  seqs_.emplace(child, std::move(fork));
}

bool KvCacheManager::AllocateSlots(int64_t seq_id, int32_t num_tokens) {
  const auto it = seqs_.find(seq_id);
  assert(it != seqs_.end());
  if (it == seqs_.end()) return false;
  std::vector<int32_t>& table = it->second.table;
  const int32_t need =
      BlocksForTokens(num_tokens, block_size_) - static_cast<int32_t>(table.size());
  if (need <= 0) return true;
  if (need > num_blocks_available()) return false;

  // Never-cached free blocks first: evicting throws away a possible hit.
  const int32_t from_pool = std::min(need, pool_->num_free());
  std::optional<std::vector<int32_t>> fresh = pool_->Allocate(from_pool);
  assert(fresh.has_value());
  for (int32_t b : *fresh) {
    meta_[static_cast<size_t>(b)].ref = 1;
    table.push_back(b);
  }
  num_in_use_ += from_pool;
  for (int32_t i = from_pool; i < need; ++i) {
    const int32_t b = lru_.front();
    BlockMeta& m = meta_[static_cast<size_t>(b)];
    lru_.pop_front();
    m.in_lru = false;
    cache_.erase(m.hash);
    if (record_events_) events_.push_back({KvCacheEvent::Kind::kRemoved, m.hash});
    m.cached = false;
    m.hash = BlockHash{};
    m.ref = 1;
    ++num_in_use_;
    table.push_back(b);
  }
  return true;
}

void KvCacheManager::CommitComputed(int64_t seq_id, std::span<const int32_t> tokens,
                                    int32_t num_computed) {
  if (!options_.enable_prefix_caching) return;
  const auto it = seqs_.find(seq_id);
  assert(it != seqs_.end());
  if (it == seqs_.end()) return;
  Sequence& seq = it->second;
  assert(num_computed >= 0 && static_cast<size_t>(num_computed) <= tokens.size());
  const size_t bs = static_cast<size_t>(block_size_);
  // Never past the tokens given or the blocks held (caller bugs, asserted above).
  const size_t full = std::min({static_cast<size_t>(std::max(num_computed, 0)), tokens.size(),
                                seq.table.size() * bs}) /
                      bs;
  for (size_t i = seq.hashes.size(); i < full; ++i) {
    const BlockHash parent = i == 0 ? BlockHash{} : seq.hashes[i - 1];
    const BlockHash h = HashBlock(parent, tokens.subspan(i * bs, bs), options_.model_fingerprint);
    seq.hashes.push_back(h);
    const int32_t b = seq.table[i];
    BlockMeta& m = meta_[static_cast<size_t>(b)];
    if (m.cached) continue;  // reached through a hit: already published
    // First writer wins: a duplicate stays private to this sequence and
    // returns to the free list when released.
    if (cache_.try_emplace(h, b).second) {
      m.cached = true;
      m.hash = h;
      if (record_events_) events_.push_back({KvCacheEvent::Kind::kStored, h});
    }
  }
}

void KvCacheManager::FreeSequence(int64_t seq_id) {
  const auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  ReleaseReversed(it->second.table);
  seqs_.erase(it);
}

void KvCacheManager::Pin(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    const BlockMeta& m = meta_.at(static_cast<size_t>(b));
    // A block on the free list holds nothing worth keeping: caller bug.
    if (m.ref == 0 && !m.cached) std::abort();
    Acquire(b);
  }
}

void KvCacheManager::Unpin(const std::vector<int32_t>& blocks) { ReleaseReversed(blocks); }

const std::vector<int32_t>& KvCacheManager::BlockTable(int64_t seq_id) const {
  static const std::vector<int32_t> kEmpty;
  const auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? kEmpty : it->second.table;
}

bool KvCacheManager::HasSequence(int64_t seq_id) const { return seqs_.contains(seq_id); }

int32_t KvCacheManager::block_size() const { return block_size_; }

int32_t KvCacheManager::num_blocks_total() const { return pool_->num_blocks(); }

int32_t KvCacheManager::num_blocks_available() const {
  return pool_->num_free() + static_cast<int32_t>(lru_.size());
}

int32_t KvCacheManager::num_blocks_in_use() const { return num_in_use_; }

int32_t KvCacheManager::num_blocks_cached() const { return static_cast<int32_t>(cache_.size()); }

int32_t KvCacheManager::RefCount(int32_t block) const {
  return meta_.at(static_cast<size_t>(block)).ref;
}

bool KvCacheManager::IsCached(int32_t block) const {
  return meta_.at(static_cast<size_t>(block)).cached;
}

std::vector<KvCacheEvent> KvCacheManager::TakeEvents() {
  std::vector<KvCacheEvent> out;
  out.swap(events_);
  return out;
}

std::vector<BlockHash> KvCacheManager::CachedHashes() const {
  std::vector<BlockHash> out;
  out.reserve(cache_.size());
  for (const auto& [hash, block] : cache_) out.push_back(hash);
  return out;
}

void KvCacheManager::Acquire(int32_t block) {
  BlockMeta& m = meta_[static_cast<size_t>(block)];
  if (m.ref == 0) {
    assert(m.in_lru);
    lru_.erase(m.lru_pos);
    m.in_lru = false;
    ++num_in_use_;
  }
  ++m.ref;
}

void KvCacheManager::Release(int32_t block, std::vector<int32_t>* to_pool) {
  BlockMeta& m = meta_.at(static_cast<size_t>(block));
  // Releasing a block nobody holds (an unbalanced Unpin) is a caller bug:
  // stop rather than corrupt the free list, as BlockPool::Free does.
  if (m.ref <= 0) std::abort();
  if (--m.ref > 0) return;
  --num_in_use_;
  if (m.cached) {
    m.lru_pos = lru_.insert(lru_.end(), block);
    m.in_lru = true;
  } else {
    to_pool->push_back(block);
  }
}

void KvCacheManager::ReleaseReversed(const std::vector<int32_t>& blocks) {
  // Tail first: a prefix's last block becomes evictable before its first,
  // so a partly evicted prefix still hits on its head.
  std::vector<int32_t> to_pool;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) Release(*it, &to_pool);
  pool_->Free(to_pool);
}

}  // namespace tandem::kv
