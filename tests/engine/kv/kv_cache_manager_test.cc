// KvCacheManager tests. Expected block ids, ref counts and orders follow
// from the documented policy (BlockPool: FIFO free list; manager: free
// blocks before evicting, least recently freed cached block evicted first,
// sequences released tail first); expected hashes are computed here
// straight from the documented byte layout with xxHash.
#include "engine/kv/kv_cache_manager.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::kv {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int32_t kBs = 4;

// n consecutive token ids from `first`.
std::vector<int32_t> Tokens(int32_t first, int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int32_t LocalCap(size_t len) { return static_cast<int32_t>((len - 1) / kBs * kBs); }
int32_t RemoteCap(size_t len) { return static_cast<int32_t>(len); }

// Reference for one link of the chain, from the header's layout.
BlockHash RefHash(const BlockHash& parent, const std::vector<int32_t>& block,
                  const std::string& fp) {
  std::vector<uint8_t> b;
  for (int i = 7; i >= 0; --i) b.push_back(static_cast<uint8_t>(parent.hi >> (8 * i)));
  for (int i = 7; i >= 0; --i) b.push_back(static_cast<uint8_t>(parent.lo >> (8 * i)));
  for (int32_t t : block) {
    const uint32_t u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(u >> (8 * i)));
  }
  for (char c : fp) b.push_back(static_cast<uint8_t>(c));
  const XXH128_hash_t h = XXH3_128bits(b.data(), b.size());
  return BlockHash{h.high64, h.low64};
}

class KvCacheManagerTest : public ::testing::Test {
 protected:
  void Init(int32_t num_blocks, bool caching = true, bool events = false) {
    pool_ = std::make_unique<BlockPool>(num_blocks);
    KvCacheManagerOptions options;
    options.enable_prefix_caching = caching;
    options.record_events = events;
    options.model_fingerprint = "test-model";
    options.block_size = kBs;
    mgr_ = std::make_unique<KvCacheManager>(pool_.get(), options);
  }

  // Admits `prompt` as seq `id` with the hit found under `cap`, allocates
  // its slots and commits it as fully computed. Returns the hit.
  PrefixHit Run(int64_t id, const std::vector<int32_t>& prompt, int32_t cap) {
    PrefixHit hit = mgr_->FindCachedPrefix(prompt, cap);
    mgr_->StartSequence(id, hit);
    EXPECT_TRUE(mgr_->AllocateSlots(id, static_cast<int32_t>(prompt.size())));
    mgr_->CommitComputed(id, prompt, static_cast<int32_t>(prompt.size()));
    return hit;
  }

  std::vector<int32_t> Found(const std::vector<int32_t>& prompt, int32_t cap) {
    return mgr_->FindCachedPrefix(prompt, cap).blocks;
  }

  void ExpectCounts(int32_t in_use, int32_t cached, int32_t available) {
    EXPECT_EQ(mgr_->num_blocks_in_use(), in_use);
    EXPECT_EQ(mgr_->num_blocks_cached(), cached);
    EXPECT_EQ(mgr_->num_blocks_available(), available);
  }

  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<KvCacheManager> mgr_;
};

TEST(BlockHashTest, ChainMatchesDocumentedLayout) {
  const std::vector<int32_t> t = {1, -2, 300000, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<BlockHash> h = HashFullBlocks(t, kBs, "fp");
  ASSERT_EQ(h.size(), 3u);
  const BlockHash r0 = RefHash(BlockHash{}, {1, -2, 300000, 4}, "fp");
  const BlockHash r1 = RefHash(r0, {5, 6, 7, 8}, "fp");
  const BlockHash r2 = RefHash(r1, {9, 10, 11, 12}, "fp");
  EXPECT_EQ(h[0], r0);
  EXPECT_EQ(h[1], r1);
  EXPECT_EQ(h[2], r2);
  EXPECT_EQ(HashBlock(r0, std::vector<int32_t>{5, 6, 7, 8}, "fp"), r1);
}

TEST(BlockHashTest, SamePrefixSameHashesAnyDifferenceChangesTheRest) {
  const std::vector<int32_t> a = Tokens(0, 12);
  const std::vector<BlockHash> ha = HashFullBlocks(a, kBs, "m");
  // Same prefix, different partial tail: the full blocks hash the same.
  EXPECT_THAT(HashFullBlocks(Concat(a, {99, 98}), kBs, "m"),
              ElementsAre(ha[0], ha[1], ha[2]));
  EXPECT_THAT(HashFullBlocks(Tokens(0, 10), kBs, "m"), ElementsAre(ha[0], ha[1]));
  EXPECT_THAT(HashFullBlocks(Tokens(0, 3), kBs, "m"), IsEmpty());

  // Another fingerprint: every hash differs.
  const std::vector<BlockHash> hf = HashFullBlocks(a, kBs, "n");
  for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(hf[i] == ha[i]) << i;

  // A token of block 0 differs: block 0 and every later hash change.
  std::vector<int32_t> b = a;
  b[1] = 1000;
  const std::vector<BlockHash> hb = HashFullBlocks(b, kBs, "m");
  for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(hb[i] == ha[i]) << i;

  // A token of block 1 differs: block 0 keeps its hash, 1 and 2 change.
  std::vector<int32_t> c = a;
  c[5] = 1000;
  const std::vector<BlockHash> hc = HashFullBlocks(c, kBs, "m");
  EXPECT_EQ(hc[0], ha[0]);
  EXPECT_FALSE(hc[1] == ha[1]);
  EXPECT_FALSE(hc[2] == ha[2]);
}

TEST_F(KvCacheManagerTest, SecondSequenceReusesSharedThreeBlockPrefix) {
  Init(10);
  const std::vector<int32_t> a = Tokens(0, 14);  // 3 full blocks + 2
  EXPECT_THAT(Run(1, a, LocalCap(a.size())).blocks, IsEmpty());
  EXPECT_THAT(mgr_->BlockTable(1), ElementsAre(0, 1, 2, 3));
  ExpectCounts(/*in_use=*/4, /*cached=*/3, /*available=*/6);

  const std::vector<int32_t> b = Concat(Tokens(0, 12), Tokens(100, 5));  // 17 tokens
  const PrefixHit hit = mgr_->FindCachedPrefix(b, LocalCap(b.size()));
  EXPECT_THAT(hit.blocks, ElementsAre(0, 1, 2));
  EXPECT_EQ(hit.num_tokens, 12);
  EXPECT_EQ(mgr_->RefCount(0), 1);  // Find takes no reference
  mgr_->StartSequence(2, hit);
  ASSERT_TRUE(mgr_->AllocateSlots(2, 17));
  EXPECT_THAT(mgr_->BlockTable(2), ElementsAre(0, 1, 2, 4, 5));
  EXPECT_EQ(mgr_->RefCount(0), 2);
  EXPECT_EQ(mgr_->RefCount(1), 2);
  EXPECT_EQ(mgr_->RefCount(2), 2);
  EXPECT_EQ(mgr_->RefCount(3), 1);
  EXPECT_EQ(mgr_->RefCount(4), 1);
  EXPECT_EQ(mgr_->RefCount(5), 1);
  ExpectCounts(6, 3, 4);
  mgr_->CommitComputed(2, b, 17);  // publishes b's block 3 (block id 4)
  ExpectCounts(6, 4, 4);
  EXPECT_THAT(Found(b, 16), ElementsAre(0, 1, 2, 4));

  mgr_->FreeSequence(2);  // 5 -> free list, 4 -> eviction queue, 0..2 ref 1
  ExpectCounts(4, 4, 6);
  EXPECT_EQ(mgr_->RefCount(2), 1);
  mgr_->FreeSequence(1);  // 3 -> free list; 2, 1, 0 -> eviction queue
  ExpectCounts(0, 4, 10);
  // Free list is now 6 7 8 9 5 3, eviction queue 4 2 1 0.
  mgr_->StartSequence(3, {});
  ASSERT_TRUE(mgr_->AllocateSlots(3, 40));
  EXPECT_THAT(mgr_->BlockTable(3), ElementsAre(6, 7, 8, 9, 5, 3, 4, 2, 1, 0));
  ExpectCounts(10, 0, 0);
}

TEST_F(KvCacheManagerTest, ExactBlockMultiplePromptStillComputesLastToken) {
  Init(8);
  const std::vector<int32_t> p = Tokens(50, 3 * kBs);  // k = 3
  Run(1, p, LocalCap(p.size()));
  EXPECT_THAT(mgr_->BlockTable(1), ElementsAre(0, 1, 2));
  mgr_->FreeSequence(1);  // eviction queue 2 1 0
  ExpectCounts(0, 3, 8);

  // Local cap floor((L-1)/bs)*bs = 8: k-1 blocks, the last token is recomputed.
  const PrefixHit local = mgr_->FindCachedPrefix(p, LocalCap(p.size()));
  EXPECT_THAT(local.blocks, ElementsAre(0, 1));
  EXPECT_EQ(local.num_tokens, 8);
  // A remote decode hit may cover all of L.
  const PrefixHit remote = mgr_->FindCachedPrefix(p, RemoteCap(p.size()));
  EXPECT_THAT(remote.blocks, ElementsAre(0, 1, 2));
  EXPECT_EQ(remote.num_tokens, 12);

  mgr_->StartSequence(2, local);
  ASSERT_TRUE(mgr_->AllocateSlots(2, 12));
  EXPECT_THAT(mgr_->BlockTable(2), ElementsAre(0, 1, 3));
  mgr_->CommitComputed(2, p, 12);
  // Block 3 holds the same hash as cached block 2: block 2 stays the cached one.
  ExpectCounts(3, 3, 5);
  EXPECT_FALSE(mgr_->IsCached(3));
  EXPECT_THAT(Found(p, 12), ElementsAre(0, 1, 2));
  mgr_->FreeSequence(2);  // 3 -> free list tail; 1, 0 -> eviction queue
  ExpectCounts(0, 3, 8);
  mgr_->StartSequence(3, {});
  ASSERT_TRUE(mgr_->AllocateSlots(3, 32));
  EXPECT_THAT(mgr_->BlockTable(3), ElementsAre(4, 5, 6, 7, 3, 2, 1, 0));
}

TEST_F(KvCacheManagerTest, PromptShorterThanOneBlockIsNeverCached) {
  Init(4);
  const std::vector<int32_t> p = Tokens(7, 3);
  EXPECT_THAT(Run(1, p, RemoteCap(p.size())).blocks, IsEmpty());
  EXPECT_THAT(mgr_->BlockTable(1), ElementsAre(0));
  ExpectCounts(1, 0, 3);
  mgr_->FreeSequence(1);
  ExpectCounts(0, 0, 4);
  EXPECT_THAT(Found(p, RemoteCap(p.size())), IsEmpty());
  mgr_->StartSequence(2, {});
  ASSERT_TRUE(mgr_->AllocateSlots(2, 16));
  EXPECT_THAT(mgr_->BlockTable(2), ElementsAre(1, 2, 3, 0));
}

TEST_F(KvCacheManagerTest, PartialBlockIsNeverPublished) {
  Init(6);
  const std::vector<int32_t> p = Tokens(0, 10);  // 2.5 blocks
  Run(1, p, LocalCap(p.size()));
  EXPECT_THAT(mgr_->BlockTable(1), ElementsAre(0, 1, 2));
  ExpectCounts(3, 2, 3);
  EXPECT_TRUE(mgr_->IsCached(0));
  EXPECT_TRUE(mgr_->IsCached(1));
  EXPECT_FALSE(mgr_->IsCached(2));
  // Even a prompt that continues the same tokens finds only the 2 full blocks.
  EXPECT_THAT(Found(Tokens(0, 16), 16), ElementsAre(0, 1));
  mgr_->FreeSequence(1);
  ExpectCounts(0, 2, 6);
}

TEST_F(KvCacheManagerTest, BlockIsFindableOnlyOnceCommitted) {
  Init(8);
  const std::vector<int32_t> p = Tokens(0, 12);
  mgr_->StartSequence(1, {});
  ASSERT_TRUE(mgr_->AllocateSlots(1, 12));
  EXPECT_THAT(mgr_->BlockTable(1), ElementsAre(0, 1, 2));
  EXPECT_THAT(Found(p, 12), IsEmpty());
  mgr_->CommitComputed(1, p, 3);
  EXPECT_THAT(Found(p, 12), IsEmpty());
  mgr_->CommitComputed(1, p, 5);
  EXPECT_THAT(Found(p, 12), ElementsAre(0));
  mgr_->CommitComputed(1, p, 11);
  EXPECT_THAT(Found(p, 12), ElementsAre(0, 1));
  ExpectCounts(3, 2, 5);
  mgr_->CommitComputed(1, p, 12);
  EXPECT_THAT(Found(p, 12), ElementsAre(0, 1, 2));
  ExpectCounts(3, 3, 5);
}

TEST_F(KvCacheManagerTest, EvictsLeastRecentlyFreedAndSequenceTailFirst) {
  Init(6);
  const std::vector<int32_t> a = Tokens(0, 8);
  const std::vector<int32_t> b = Tokens(100, 8);
  Run(1, a, 8);
  Run(2, b, 8);
  EXPECT_THAT(mgr_->BlockTable(1), ElementsAre(0, 1));
  EXPECT_THAT(mgr_->BlockTable(2), ElementsAre(2, 3));
  mgr_->FreeSequence(1);  // eviction queue 1 0
  mgr_->FreeSequence(2);  // eviction queue 1 0 3 2
  ExpectCounts(0, 4, 6);

  // Free blocks 4 5 first, then one eviction: a's tail block 1.
  mgr_->StartSequence(3, {});
  ASSERT_TRUE(mgr_->AllocateSlots(3, 12));
  EXPECT_THAT(mgr_->BlockTable(3), ElementsAre(4, 5, 1));
  ExpectCounts(3, 3, 3);
  EXPECT_FALSE(mgr_->IsCached(1));
  EXPECT_THAT(Found(a, 8), ElementsAre(0));  // a's head still hits
  EXPECT_THAT(Found(b, 8), ElementsAre(2, 3));

  mgr_->StartSequence(4, {});
  ASSERT_TRUE(mgr_->AllocateSlots(4, 8));
  EXPECT_THAT(mgr_->BlockTable(4), ElementsAre(0, 3));
  ExpectCounts(5, 1, 1);
  EXPECT_THAT(Found(a, 8), IsEmpty());
  EXPECT_THAT(Found(b, 8), ElementsAre(2));
}

TEST_F(KvCacheManagerTest, EvictionNeverTouchesReferencedBlocks) {
  Init(5);
  const std::vector<int32_t> a = Tokens(0, 8);
  const std::vector<int32_t> b = Tokens(100, 8);
  Run(1, a, 8);  // [0 1], held
  Run(2, b, 8);  // [2 3]
  mgr_->FreeSequence(2);  // eviction queue 3 2; free list 4
  ExpectCounts(2, 4, 3);

  mgr_->StartSequence(3, {});
  EXPECT_FALSE(mgr_->AllocateSlots(3, 16));  // needs 4 of 3 obtainable
  // Nothing changed.
  EXPECT_THAT(mgr_->BlockTable(3), IsEmpty());
  ExpectCounts(2, 4, 3);
  EXPECT_EQ(mgr_->RefCount(0), 1);
  EXPECT_EQ(mgr_->RefCount(1), 1);
  EXPECT_THAT(Found(b, 8), ElementsAre(2, 3));

  ASSERT_TRUE(mgr_->AllocateSlots(3, 12));
  EXPECT_THAT(mgr_->BlockTable(3), ElementsAre(4, 3, 2));
  ExpectCounts(5, 2, 0);
  EXPECT_THAT(Found(a, 8), ElementsAre(0, 1));
  EXPECT_THAT(Found(b, 8), IsEmpty());
  EXPECT_TRUE(mgr_->AllocateSlots(3, 9));  // already covered
  EXPECT_FALSE(mgr_->AllocateSlots(3, 13));
  EXPECT_THAT(mgr_->BlockTable(3), ElementsAre(4, 3, 2));
  ExpectCounts(5, 2, 0);
}

TEST_F(KvCacheManagerTest, PinKeepsBlocksFromEviction) {
  Init(3);
  const std::vector<int32_t> a = Tokens(0, 8);
  Run(1, a, 8);  // [0 1]
  mgr_->Pin({0, 1});
  EXPECT_EQ(mgr_->RefCount(0), 2);
  mgr_->FreeSequence(1);
  EXPECT_EQ(mgr_->RefCount(0), 1);
  EXPECT_EQ(mgr_->RefCount(1), 1);
  ExpectCounts(2, 2, 1);
  mgr_->StartSequence(2, {});
  EXPECT_FALSE(mgr_->AllocateSlots(2, 8));
  mgr_->Unpin({0, 1});  // released 1 then 0: eviction queue 1 0
  ExpectCounts(0, 2, 3);

  // Pinning a free cached block takes it out of the eviction queue.
  mgr_->Pin({1});
  ExpectCounts(1, 2, 2);
  ASSERT_TRUE(mgr_->AllocateSlots(2, 8));
  EXPECT_THAT(mgr_->BlockTable(2), ElementsAre(2, 0));
  ExpectCounts(3, 1, 0);
  EXPECT_TRUE(mgr_->IsCached(1));
  EXPECT_THAT(Found(a, 8), IsEmpty());  // the chain breaks at evicted block 0
  mgr_->Unpin({1});
  ExpectCounts(2, 1, 1);
  EXPECT_EQ(mgr_->RefCount(1), 0);
}

TEST_F(KvCacheManagerTest, DisabledCachingNeverFindsAndFreesStraightBack) {
  Init(3, /*caching=*/false);
  const std::vector<int32_t> a = Tokens(0, 8);
  EXPECT_THAT(Run(1, a, 8).blocks, IsEmpty());
  EXPECT_THAT(mgr_->BlockTable(1), ElementsAre(0, 1));
  ExpectCounts(2, 0, 1);
  EXPECT_THAT(Found(a, 8), IsEmpty());
  mgr_->FreeSequence(1);  // free list 2 1 0
  ExpectCounts(0, 0, 3);
  EXPECT_THAT(Run(2, a, 8).blocks, IsEmpty());
  EXPECT_THAT(mgr_->BlockTable(2), ElementsAre(2, 1));
  EXPECT_FALSE(mgr_->IsCached(2));
}

TEST_F(KvCacheManagerTest, FreeingUnknownSequenceIsANoOp) {
  Init(4);
  Run(1, Tokens(0, 5), 4);
  ExpectCounts(2, 1, 2);
  mgr_->FreeSequence(99);
  ExpectCounts(2, 1, 2);
  EXPECT_FALSE(mgr_->HasSequence(99));
  EXPECT_THAT(mgr_->BlockTable(99), IsEmpty());
  mgr_->FreeSequence(1);
  mgr_->FreeSequence(1);  // second time: unknown
  EXPECT_FALSE(mgr_->HasSequence(1));
  ExpectCounts(0, 1, 4);
}

TEST_F(KvCacheManagerTest, SharedHitSurvivesBothHoldersAndHitsAgain) {
  Init(6);
  const std::vector<int32_t> a = Tokens(0, 12);
  Run(1, a, LocalCap(a.size()));
  const PrefixHit hit = mgr_->FindCachedPrefix(a, RemoteCap(a.size()));
  EXPECT_THAT(hit.blocks, ElementsAre(0, 1, 2));
  mgr_->StartSequence(2, hit);
  ASSERT_TRUE(mgr_->AllocateSlots(2, 13));
  EXPECT_THAT(mgr_->BlockTable(2), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(mgr_->RefCount(0), 2);
  EXPECT_EQ(mgr_->RefCount(2), 2);
  ExpectCounts(4, 3, 2);
  mgr_->FreeSequence(1);
  ExpectCounts(4, 3, 2);
  EXPECT_EQ(mgr_->RefCount(1), 1);
  mgr_->FreeSequence(2);  // 3 -> free list; 2 1 0 -> eviction queue
  ExpectCounts(0, 3, 6);

  const PrefixHit again = mgr_->FindCachedPrefix(a, RemoteCap(a.size()));
  EXPECT_THAT(again.blocks, ElementsAre(0, 1, 2));
  mgr_->StartSequence(3, again);
  EXPECT_EQ(mgr_->RefCount(0), 1);
  ExpectCounts(3, 3, 3);
  mgr_->StartSequence(4, {});
  ASSERT_TRUE(mgr_->AllocateSlots(4, 12));
  EXPECT_THAT(mgr_->BlockTable(4), ElementsAre(4, 5, 3));
}

// ---------------------------------------------------------------------------
// Randomized consistency: a scheduler-like driver with a shadow of what each
// block holds (token id written into K at the token's slot).

struct LiveSeq {
  std::vector<int32_t> tokens;
  int32_t computed = 0;
};

class RandomDriver {
 public:
  RandomDriver() : pool_(kBlocks), mgr_(&pool_, Options()), rng_(20240611) {
    std::uniform_int_distribution<int32_t> tok(0, 49);
    for (auto& base : bases_) {
      for (int32_t i = 0; i < 20; ++i) base.push_back(tok(rng_));
    }
  }

  void Step() {
    const int op = Rand(0, 99);
    if (op < 25) {
      Admit();
    } else if (op < 65) {
      Compute();
    } else if (op < 75) {
      Decode();
    } else if (op < 88) {
      if (!live_.empty()) Drop(PickLive());
    } else if (op < 94) {
      PinSomething();
    } else if (op < 99) {
      if (!pins_.empty()) {
        const size_t i = static_cast<size_t>(Rand(0, static_cast<int32_t>(pins_.size()) - 1));
        mgr_.Unpin(pins_[i]);
        pins_.erase(pins_.begin() + static_cast<std::ptrdiff_t>(i));
      }
    } else {
      mgr_.FreeSequence(-1);
    }
    CheckInvariants();
  }

  int hits = 0, evictions = 0, failed_allocations = 0;

 private:
  static constexpr int32_t kBlocks = 24;
  static KvCacheManagerOptions Options() {
    KvCacheManagerOptions o;
    o.model_fingerprint = "rand";
    o.block_size = kBs;
    return o;
  }
  int32_t Rand(int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng_);
  }
  int64_t PickLive() {
    auto it = live_.begin();
    std::advance(it, Rand(0, static_cast<int32_t>(live_.size()) - 1));
    return it->first;
  }

  std::vector<int32_t> RandomPrompt() {
    const auto& base = bases_[static_cast<size_t>(Rand(0, 2))];
    std::vector<int32_t> p(base.begin(), base.begin() + Rand(0, 20));
    const int32_t tail = Rand(p.empty() ? 1 : 0, 10);
    for (int32_t i = 0; i < tail; ++i) p.push_back(Rand(0, 3));
    return p;
  }

  // Every hit block must hold exactly the prompt's tokens.
  void CheckHit(const std::vector<int32_t>& prompt, const PrefixHit& hit, int32_t cap) {
    ASSERT_EQ(hit.num_tokens, static_cast<int32_t>(hit.blocks.size()) * kBs);
    ASSERT_LE(hit.num_tokens, cap);
    for (int32_t t = 0; t < hit.num_tokens; ++t) {
      const int32_t b = hit.blocks[static_cast<size_t>(t / kBs)];
      ASSERT_TRUE(mgr_.IsCached(b));
      ASSERT_EQ(memory_.K(b, 0)[t % kBs], static_cast<float>(prompt[static_cast<size_t>(t)]));
    }
  }

  void Admit() {
    if (live_.size() >= 6) return;
    const std::vector<int32_t> p = RandomPrompt();
    const int32_t cap = Rand(0, 1) ? LocalCap(p.size()) : RemoteCap(p.size());
    const PrefixHit hit = mgr_.FindCachedPrefix(p, cap);
    CheckHit(p, hit, cap);
    hits += hit.blocks.empty() ? 0 : 1;
    const int64_t id = next_id_++;
    mgr_.StartSequence(id, hit);
    ASSERT_THAT(mgr_.BlockTable(id), ::testing::ContainerEq(hit.blocks));
    const int32_t cached_before = mgr_.num_blocks_cached();
    const int32_t free_before = pool_.num_free();
    if (!mgr_.AllocateSlots(id, static_cast<int32_t>(p.size()) + 1)) {
      ++failed_allocations;
      ASSERT_THAT(mgr_.BlockTable(id), ::testing::ContainerEq(hit.blocks));
      ASSERT_EQ(mgr_.num_blocks_cached(), cached_before);
      mgr_.FreeSequence(id);
      return;
    }
    const int32_t taken = static_cast<int32_t>(mgr_.BlockTable(id).size() - hit.blocks.size());
    evictions += taken - (free_before - pool_.num_free());
    live_[id] = LiveSeq{p, hit.num_tokens};
  }

  void Compute() {
    if (live_.empty()) return;
    const int64_t id = PickLive();
    LiveSeq& s = live_[id];
    const int32_t len = static_cast<int32_t>(s.tokens.size());
    if (s.computed >= len) return;
    const int32_t end = std::min(len, s.computed + Rand(1, 9));
    const std::vector<int32_t>& table = mgr_.BlockTable(id);
    for (int32_t t = s.computed; t < end; ++t) {
      const int32_t b = table[static_cast<size_t>(t / kBs)];
      // Only this sequence may write, and never into a published block.
      ASSERT_FALSE(mgr_.IsCached(b)) << "write into published block " << b;
      ASSERT_EQ(mgr_.RefCount(b), 1 + PinCount(b));
      memory_.K(b, 0)[t % kBs] = static_cast<float>(s.tokens[static_cast<size_t>(t)]);
    }
    s.computed = end;
    mgr_.CommitComputed(id, s.tokens, end);
  }

  // A fully computed sequence appends a generated token (may be preempted).
  void Decode() {
    if (live_.empty()) return;
    const int64_t id = PickLive();
    LiveSeq& s = live_[id];
    if (s.computed < static_cast<int32_t>(s.tokens.size())) return;
    s.tokens.push_back(Rand(0, 3));
    if (!mgr_.AllocateSlots(id, static_cast<int32_t>(s.tokens.size()))) {
      ++failed_allocations;
      Drop(id);  // preempted
    }
  }

  void Drop(int64_t id) {
    mgr_.FreeSequence(id);
    live_.erase(id);
  }

  void PinSomething() {
    if (Rand(0, 1) && !live_.empty()) {
      const std::vector<int32_t>& table = mgr_.BlockTable(PickLive());
      if (table.empty()) return;
      std::vector<int32_t> head(table.begin(),
                                table.begin() + Rand(1, static_cast<int32_t>(table.size())));
      mgr_.Pin(head);
      pins_.push_back(head);
    } else {  // an accepted hit: may pin free cached blocks
      const std::vector<int32_t> p = RandomPrompt();
      const PrefixHit hit = mgr_.FindCachedPrefix(p, RemoteCap(p.size()));
      CheckHit(p, hit, RemoteCap(p.size()));
      if (hit.blocks.empty()) return;
      mgr_.Pin(hit.blocks);
      pins_.push_back(hit.blocks);
    }
  }

  int32_t PinCount(int32_t b) const {
    int32_t n = 0;
    for (const auto& v : pins_) n += static_cast<int32_t>(std::count(v.begin(), v.end(), b));
    return n;
  }

  void CheckInvariants() {
    std::vector<int32_t> refs(kBlocks, 0), tables(kBlocks, 0);
    for (const auto& [id, s] : live_) {
      ASSERT_TRUE(mgr_.HasSequence(id));
      const std::vector<int32_t>& table = mgr_.BlockTable(id);
      ASSERT_GE(static_cast<int32_t>(table.size()) * kBs, static_cast<int32_t>(s.tokens.size()));
      for (int32_t b : table) ++tables[static_cast<size_t>(b)];
    }
    for (const auto& v : pins_) {
      for (int32_t b : v) ++refs[static_cast<size_t>(b)];
    }
    int32_t free = 0, in_use = 0, evictable = 0, cached = 0;
    for (int32_t b = 0; b < kBlocks; ++b) {
      const size_t i = static_cast<size_t>(b);
      const int32_t ref = mgr_.RefCount(b);
      const bool is_free = pool_.IsFree(b), is_cached = mgr_.IsCached(b);
      ASSERT_EQ(ref, refs[i] + tables[i]) << "block " << b;
      const int states = (is_free ? 1 : 0) + (ref > 0 ? 1 : 0) + (ref == 0 && is_cached ? 1 : 0);
      ASSERT_EQ(states, 1) << "block " << b;
      ASSERT_FALSE(is_free && is_cached) << "block " << b;
      ASSERT_TRUE(tables[i] <= 1 || is_cached) << "block " << b << " shared but not cached";
      free += is_free ? 1 : 0;
      in_use += ref > 0 ? 1 : 0;
      evictable += (ref == 0 && is_cached) ? 1 : 0;
      cached += is_cached ? 1 : 0;
    }
    ASSERT_EQ(free + in_use + evictable, mgr_.num_blocks_total());
    ASSERT_EQ(free, pool_.num_free());
    ASSERT_EQ(in_use, mgr_.num_blocks_in_use());
    ASSERT_EQ(cached, mgr_.num_blocks_cached());
    ASSERT_EQ(free + evictable, mgr_.num_blocks_available());
  }
  // K of each token slot holds the token id written there (1 layer, dim 1).
  CpuKvStorage memory_{KvShape{1, 1, 1, kBs}, kBlocks};
  BlockPool pool_;
  KvCacheManager mgr_;
  std::mt19937 rng_;
  std::vector<int32_t> bases_[3];
  std::map<int64_t, LiveSeq> live_;
  std::vector<std::vector<int32_t>> pins_;
  int64_t next_id_ = 1;
};

TEST(KvCacheManagerRandomTest, InvariantsHoldOverRandomOperations) {
  RandomDriver driver;
  for (int i = 0; i < 20000; ++i) {
    driver.Step();
    if (::testing::Test::HasFatalFailure()) FAIL() << "at step " << i;
  }
  // The run must have exercised hits, evictions and running out.
  EXPECT_GT(driver.hits, 100);
  EXPECT_GT(driver.evictions, 100);
  EXPECT_GT(driver.failed_allocations, 10);
}

// vLLM's prefix-cache counters: every lookup counts, with the tokens it
// was allowed to match (the cap, at most the prompt) and those it did.
TEST_F(KvCacheManagerTest, PrefixCacheStatsCountLookupsAndTokens) {
  Init(16);
  const std::vector<int32_t> prompt = Tokens(100, 10);  // two full blocks + 2
  EXPECT_EQ(mgr_->prefix_cache_stats().lookups, 0u);
  Run(1, prompt, LocalCap(prompt.size()));  // misses: caps 8
  mgr_->FreeSequence(1);
  EXPECT_EQ(mgr_->FindCachedPrefix(prompt, RemoteCap(prompt.size())).num_tokens, 8);
  EXPECT_EQ(mgr_->FindCachedPrefix(prompt, 4).num_tokens, 4);
  const PrefixCacheStats& stats = mgr_->prefix_cache_stats();
  EXPECT_EQ(stats.lookups, 3u);
  EXPECT_EQ(stats.queried_tokens, 8u + 10u + 4u);
  EXPECT_EQ(stats.hit_tokens, 0u + 8u + 4u);
}

}  // namespace
// ForkSequence shares the parent's first blocks by reference (caching on
// or off) and carries their hash chain, so the child's later blocks chain
// from the right parent hash.
TEST_F(KvCacheManagerTest, ForkSharesBlocksByReferenceWithTheirHashChain) {
  for (const bool caching : {false, true}) {
    SCOPED_TRACE(caching);
    Init(16, caching);
    std::vector<int32_t> prompt;
    for (int32_t i = 0; i < 2 * kBs + 1; ++i) prompt.push_back(100 + i);
    mgr_->StartSequence(1, PrefixHit{});
    ASSERT_TRUE(mgr_->AllocateSlots(1, static_cast<int32_t>(prompt.size())));
    mgr_->CommitComputed(1, prompt, static_cast<int32_t>(prompt.size()));
    const std::vector<int32_t> parent = mgr_->BlockTable(1);
    ASSERT_EQ(parent.size(), 3u);

    mgr_->ForkSequence(1, 2, 2);
    EXPECT_EQ(mgr_->BlockTable(2), std::vector<int32_t>(parent.begin(), parent.begin() + 2));
    EXPECT_EQ(mgr_->RefCount(parent[0]), 2);
    EXPECT_EQ(mgr_->RefCount(parent[2]), 1);
    EXPECT_EQ(mgr_->num_blocks_in_use(), 3);
    // The child's own third block: its tokens differ from the parent's.
    std::vector<int32_t> child_tokens(prompt.begin(), prompt.begin() + 2 * kBs);
    for (int32_t i = 0; i < kBs; ++i) child_tokens.push_back(900 + i);
    ASSERT_TRUE(mgr_->AllocateSlots(2, 3 * kBs));
    mgr_->CommitComputed(2, child_tokens, 3 * kBs);
    EXPECT_EQ(mgr_->num_blocks_in_use(), 4);
    if (caching) {
      // Published under the chain through the parent's first two blocks.
      const std::vector<BlockHash> hashes = HashFullBlocks(child_tokens, kBs, "test-model");
      const PrefixHit hit = mgr_->FindCachedPrefix(child_tokens, 3 * kBs);
      EXPECT_EQ(hit.num_tokens, 3 * kBs);
      EXPECT_EQ(hit.blocks[2], mgr_->BlockTable(2)[2]);
      EXPECT_EQ(hashes.size(), 3u);
    }
    mgr_->FreeSequence(1);
    EXPECT_EQ(mgr_->RefCount(parent[0]), 1);  // still the child's
    mgr_->FreeSequence(2);
    EXPECT_EQ(mgr_->num_blocks_in_use(), 0);
  }
}

}  // namespace tandem::kv

namespace tandem::kv {
namespace {

KvCacheEvent Stored(const BlockHash& h) { return {KvCacheEvent::Kind::kStored, h}; }
KvCacheEvent Removed(const BlockHash& h) { return {KvCacheEvent::Kind::kRemoved, h}; }

// Set of hashes from replaying `events` over `start`.
std::vector<std::pair<uint64_t, uint64_t>> Replay(const std::vector<KvCacheEvent>& events,
                                                  std::vector<BlockHash> start = {}) {
  std::set<std::pair<uint64_t, uint64_t>> set;
  for (const BlockHash& h : start) set.insert({h.hi, h.lo});
  for (const KvCacheEvent& e : events) {
    if (e.kind == KvCacheEvent::Kind::kStored) {
      EXPECT_TRUE(set.insert({e.hash.hi, e.hash.lo}).second) << "stored twice";
    } else {
      EXPECT_EQ(set.erase({e.hash.hi, e.hash.lo}), 1u) << "removed without being stored";
    }
  }
  return {set.begin(), set.end()};
}

std::vector<std::pair<uint64_t, uint64_t>> Sorted(const std::vector<BlockHash>& hashes) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const BlockHash& h : hashes) out.push_back({h.hi, h.lo});
  std::sort(out.begin(), out.end());
  return out;
}

TEST_F(KvCacheManagerTest, EventsStoredOnPublishInChainOrder) {
  Init(10, true, true);
  const std::vector<int32_t> prompt = Tokens(0, 10);  // 2 full blocks + 2 tokens
  const std::vector<BlockHash> h = HashFullBlocks(prompt, kBs, "test-model");
  mgr_->StartSequence(1, PrefixHit{});
  ASSERT_TRUE(mgr_->AllocateSlots(1, 10));
  mgr_->CommitComputed(1, prompt, 5);  // block 0 only
  EXPECT_THAT(mgr_->TakeEvents(), ElementsAre(Stored(h[0])));
  EXPECT_THAT(mgr_->TakeEvents(), IsEmpty());  // taken once
  mgr_->CommitComputed(1, prompt, 10);  // block 1; the partial block never
  EXPECT_THAT(mgr_->TakeEvents(), ElementsAre(Stored(h[1])));
  EXPECT_EQ(Sorted(mgr_->CachedHashes()), Sorted({h[0], h[1]}));
  // Freeing keeps the blocks findable: no event.
  mgr_->FreeSequence(1);
  EXPECT_THAT(mgr_->TakeEvents(), IsEmpty());
}

TEST_F(KvCacheManagerTest, DuplicateAndHitBlocksAreNotStoredAgain) {
  Init(20, true, true);
  const std::vector<int32_t> prompt = Tokens(0, 9);
  const std::vector<BlockHash> h = HashFullBlocks(prompt, kBs, "test-model");
  // Two sequences compute the same prompt side by side: the first commit
  // publishes, the second is a private duplicate.
  mgr_->StartSequence(1, PrefixHit{});
  mgr_->StartSequence(2, PrefixHit{});
  ASSERT_TRUE(mgr_->AllocateSlots(1, 9));
  ASSERT_TRUE(mgr_->AllocateSlots(2, 9));
  mgr_->CommitComputed(1, prompt, 9);
  mgr_->CommitComputed(2, prompt, 9);
  EXPECT_THAT(mgr_->TakeEvents(), ElementsAre(Stored(h[0]), Stored(h[1])));
  // A third reaches them through a hit: nothing new.
  Run(3, prompt, LocalCap(prompt.size()));
  EXPECT_THAT(mgr_->TakeEvents(), IsEmpty());
}

TEST_F(KvCacheManagerTest, EvictionRecordsRemovedAndEventsReplayToCachedHashes) {
  Init(4, true, true);
  const std::vector<int32_t> a = Tokens(0, 8);
  const std::vector<int32_t> b = Tokens(100, 8);
  const std::vector<BlockHash> ha = HashFullBlocks(a, kBs, "test-model");
  const std::vector<BlockHash> hb = HashFullBlocks(b, kBs, "test-model");
  Run(1, a, LocalCap(a.size()));
  mgr_->FreeSequence(1);  // a's blocks evictable, tail first
  std::vector<KvCacheEvent> all = mgr_->TakeEvents();
  EXPECT_THAT(all, ElementsAre(Stored(ha[0]), Stored(ha[1])));
  // b takes the 2 free blocks, then 1 more evicts a's tail block.
  mgr_->StartSequence(2, PrefixHit{});
  ASSERT_TRUE(mgr_->AllocateSlots(2, 12));
  mgr_->CommitComputed(2, Concat(b, Tokens(200, 4)), 12);
  const std::vector<BlockHash> hb3 = HashFullBlocks(Concat(b, Tokens(200, 4)), kBs, "test-model");
  std::vector<KvCacheEvent> more = mgr_->TakeEvents();
  EXPECT_THAT(more, ElementsAre(Removed(ha[1]), Stored(hb[0]), Stored(hb[1]), Stored(hb3[2])));
  all.insert(all.end(), more.begin(), more.end());
  EXPECT_EQ(Replay(all), Sorted(mgr_->CachedHashes()));
  EXPECT_EQ(mgr_->CachedHashes().size(), 4u);
}

TEST_F(KvCacheManagerTest, EventsOffByDefaultAndWithoutPrefixCaching) {
  Init(4);  // record_events defaults to false
  Run(1, Tokens(0, 8), 0);
  mgr_->FreeSequence(1);
  Run(2, Tokens(50, 16), 0);  // evicts
  EXPECT_THAT(mgr_->TakeEvents(), IsEmpty());
  EXPECT_EQ(mgr_->CachedHashes().size(), 4u);

  Init(4, /*caching=*/false, /*events=*/true);
  Run(1, Tokens(0, 8), 0);
  EXPECT_THAT(mgr_->TakeEvents(), IsEmpty());
  EXPECT_THAT(mgr_->CachedHashes(), IsEmpty());
}

TEST(KvCacheManagerRandomTest, EventsReplayToCachedHashesOverRandomOperations) {
  BlockPool pool(12);
  KvCacheManagerOptions options;
  options.model_fingerprint = "fp";
  options.block_size = kBs;
  options.record_events = true;
  KvCacheManager mgr(&pool, options);
  std::mt19937 rng(7);
  std::vector<KvCacheEvent> all;
  std::vector<int64_t> live;
  for (int64_t id = 1; id <= 400; ++id) {
    // Prompts from a few shared prefixes, so hits, duplicates and evictions mix.
    std::vector<int32_t> prompt = Tokens(static_cast<int32_t>(rng() % 3) * 1000,
                                         static_cast<int32_t>(4 + rng() % 12));
    if (rng() % 2) prompt.back() = static_cast<int32_t>(rng() % 50);
    if (!live.empty() && (live.size() > 2 || rng() % 2)) {
      const size_t i = rng() % live.size();
      mgr.FreeSequence(live[i]);
      live.erase(live.begin() + static_cast<ptrdiff_t>(i));
    }
    PrefixHit hit = mgr.FindCachedPrefix(prompt, static_cast<int32_t>(prompt.size()) - 1);
    mgr.StartSequence(id, hit);
    if (!mgr.AllocateSlots(id, static_cast<int32_t>(prompt.size()))) {
      mgr.FreeSequence(id);
      continue;
    }
    live.push_back(id);
    mgr.CommitComputed(id, prompt, static_cast<int32_t>(prompt.size()));
    std::vector<KvCacheEvent> ev = mgr.TakeEvents();
    all.insert(all.end(), ev.begin(), ev.end());
    ASSERT_EQ(Replay(all), Sorted(mgr.CachedHashes())) << "after sequence " << id;
  }
  EXPECT_GT(all.size(), 20u);
}

}  // namespace
}  // namespace tandem::kv
