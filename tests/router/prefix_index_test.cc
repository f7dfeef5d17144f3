// PrefixIndex (snapshot, events, gap and instance rules, the longest-chain
// count with the worker's block size) and KvEventWatchers against a real
// KvEventPublisher served in-process (snapshot then events, entries dropped
// when the stream ends, a new instance's snapshot after a restart).
#include "router/prefix_index.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "worker/kv_event_publisher.h"
#include "engine/kv/kv_cache_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/kv_event_watcher.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

constexpr char kFp[] = "model-fp";

std::vector<int32_t> Tokens(int32_t first, int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

void Add(v1::KvEventBatch* b, v1::KvBlockEvent::Kind kind, const kv::BlockHash& h) {
  v1::KvBlockEvent* e = b->add_events();
  e->set_kind(kind);
  e->mutable_hash()->set_hi(h.hi);
  e->mutable_hash()->set_lo(h.lo);
}

v1::KvEventBatch Snapshot(uint64_t instance, uint32_t bs, uint64_t seq,
                          const std::vector<kv::BlockHash>& hashes) {
  v1::KvEventBatch b;
  b.set_instance_id(instance);
  b.set_block_size(bs);
  b.set_snapshot(true);
  b.set_sequence(seq);
  for (const kv::BlockHash& h : hashes) Add(&b, v1::KvBlockEvent::STORED, h);
  return b;
}

v1::KvEventBatch Batch(uint64_t instance, uint32_t bs, uint64_t seq) {
  v1::KvEventBatch b;
  b.set_instance_id(instance);
  b.set_block_size(bs);
  b.set_sequence(seq);
  return b;
}

struct Lines {
  absl::Mutex mu;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> Fn() {
    return [this](const std::string& l) {
      absl::MutexLock lock(&mu);
      lines.push_back(l);
    };
  }
  std::vector<std::string> Get() {
    absl::MutexLock lock(&mu);
    return lines;
  }
};

TEST(PrefixIndexTest, SnapshotThenEventsAndLongestChain) {
  Lines log;
  PrefixIndex index(kFp, log.Fn());
  const std::vector<int32_t> prompt = Tokens(10, 4 * 4 + 3);  // 4 full blocks of 4 + 3
  const std::vector<kv::BlockHash> h = kv::HashFullBlocks(prompt, 4, kFp);
  ASSERT_EQ(h.size(), 4u);
  EXPECT_EQ(index.CachedPrefixTokens("d0", prompt), 0);  // unknown worker

  ASSERT_TRUE(index.Apply("d0", Snapshot(7, 4, 10, {h[0], h[1]})));
  EXPECT_EQ(index.NumBlocks("d0"), 2u);
  EXPECT_EQ(index.CachedPrefixTokens("d0", prompt), 8);
  EXPECT_EQ(index.CachedPrefixTokens("d1", prompt), 0);

  v1::KvEventBatch b = Batch(7, 4, 11);
  Add(&b, v1::KvBlockEvent::STORED, h[2]);
  Add(&b, v1::KvBlockEvent::STORED, h[3]);
  ASSERT_TRUE(index.Apply("d0", b));  // sequences 11, 12
  EXPECT_EQ(index.CachedPrefixTokens("d0", prompt), 16);
  // Only full blocks count; a shorter prompt stops at its own last full block.
  EXPECT_EQ(index.CachedPrefixTokens("d0", std::vector<int32_t>(prompt.begin(),
                                                                prompt.begin() + 11)),
            8);

  // A missing middle block ends the chain even though later ones are held.
  v1::KvEventBatch r = Batch(7, 4, 13);
  Add(&r, v1::KvBlockEvent::REMOVED, h[1]);
  ASSERT_TRUE(index.Apply("d0", r));
  EXPECT_EQ(index.NumBlocks("d0"), 3u);
  EXPECT_EQ(index.CachedPrefixTokens("d0", prompt), 4);
  // Another first block: nothing, whatever follows.
  std::vector<int32_t> other = prompt;
  other[0] = 999;
  EXPECT_EQ(index.CachedPrefixTokens("d0", other), 0);
  // Another fingerprint's index never matches these hashes.
  PrefixIndex foreign("other-fp");
  ASSERT_TRUE(foreign.Apply("d0", Snapshot(7, 4, 0, h)));
  EXPECT_EQ(foreign.CachedPrefixTokens("d0", prompt), 0);
  EXPECT_TRUE(log.Get().empty());
}

TEST(PrefixIndexTest, BlockSizeComesFromTheWorker) {
  PrefixIndex index(kFp);
  const std::vector<int32_t> prompt = Tokens(0, 40);
  const std::vector<kv::BlockHash> h16 = kv::HashFullBlocks(prompt, 16, kFp);
  const std::vector<kv::BlockHash> h8 = kv::HashFullBlocks(prompt, 8, kFp);
  ASSERT_TRUE(index.Apply("a", Snapshot(1, 16, 0, h16)));  // 2 blocks of 16
  ASSERT_TRUE(index.Apply("b", Snapshot(2, 8, 0, h8)));    // 5 blocks of 8
  EXPECT_EQ(index.CachedPrefixTokens("a", prompt), 32);
  EXPECT_EQ(index.CachedPrefixTokens("b", prompt), 40);
  // Hashes of another block size are not this worker's.
  ASSERT_TRUE(index.Apply("c", Snapshot(3, 16, 0, h8)));
  EXPECT_EQ(index.CachedPrefixTokens("c", prompt), 0);
}

TEST(PrefixIndexTest, GapDropsEntriesUntilTheNextSnapshot) {
  Lines log;
  PrefixIndex index(kFp, log.Fn());
  const std::vector<int32_t> prompt = Tokens(0, 8);
  const std::vector<kv::BlockHash> h = kv::HashFullBlocks(prompt, 4, kFp);
  ASSERT_TRUE(index.Apply("d0", Snapshot(7, 4, 5, {h[0], h[1]})));
  v1::KvEventBatch skip = Batch(7, 4, 7);  // 6 is missing
  Add(&skip, v1::KvBlockEvent::REMOVED, h[1]);
  EXPECT_FALSE(index.Apply("d0", skip));
  EXPECT_EQ(index.NumBlocks("d0"), 0u);
  EXPECT_EQ(index.CachedPrefixTokens("d0", prompt), 0);
  ASSERT_EQ(log.Get().size(), 1u);
  EXPECT_THAT(log.Get()[0],
              HasSubstr("worker d0: 2 blocks dropped (gap: expected sequence 6, got 7)"));
  // Batches are refused until a snapshot; the refusal of an empty entry is not logged again.
  EXPECT_FALSE(index.Apply("d0", Batch(7, 4, 6)));
  EXPECT_EQ(log.Get().size(), 1u);
  ASSERT_TRUE(index.Apply("d0", Snapshot(7, 4, 9, {h[0]})));
  EXPECT_EQ(index.CachedPrefixTokens("d0", prompt), 4);
  EXPECT_TRUE(index.Apply("d0", Batch(7, 4, 10)));  // an empty batch is no gap
}

TEST(PrefixIndexTest, InstanceChangeDropsEntries) {
  Lines log;
  PrefixIndex index(kFp, log.Fn());
  const std::vector<kv::BlockHash> h = kv::HashFullBlocks(Tokens(0, 8), 4, kFp);
  ASSERT_TRUE(index.Apply("d0", Snapshot(7, 4, 3, h)));
  v1::KvEventBatch b = Batch(8, 4, 4);  // right sequence, another instance
  EXPECT_FALSE(index.Apply("d0", b));
  EXPECT_EQ(index.NumBlocks("d0"), 0u);
  ASSERT_EQ(log.Get().size(), 1u);
  EXPECT_THAT(log.Get()[0], HasSubstr("instance changed from 7 to 8"));
  // A restarted worker's snapshot is taken and its restart logged once.
  ASSERT_TRUE(index.Apply("d0", Snapshot(9, 4, 0, {})));
  ASSERT_EQ(log.Get().size(), 2u);
  EXPECT_THAT(log.Get()[1], HasSubstr("worker d0 is a new instance (7 -> 9)"));
  EXPECT_EQ(index.NumBlocks("d0"), 0u);
}

TEST(PrefixIndexTest, DropAndEraseForgetTheWorker) {
  Lines log;
  PrefixIndex index(kFp, log.Fn());
  const std::vector<kv::BlockHash> h = kv::HashFullBlocks(Tokens(0, 8), 4, kFp);
  index.Drop("d0", "never seen");  // nothing to drop: not logged
  ASSERT_TRUE(index.Apply("d0", Snapshot(7, 4, 3, h)));
  index.Drop("d0", "event stream ended: boom");
  EXPECT_EQ(index.NumBlocks("d0"), 0u);
  index.Drop("d0", "again");  // already empty: not logged
  ASSERT_EQ(log.Get().size(), 1u);
  EXPECT_THAT(log.Get()[0], HasSubstr("worker d0: 2 blocks dropped (event stream ended: boom)"));
  ASSERT_TRUE(index.Apply("d0", Snapshot(7, 4, 3, h)));
  index.Erase("d0", "dropped from the registry");
  EXPECT_EQ(index.NumBlocks("d0"), 0u);
  EXPECT_EQ(log.Get().size(), 2u);
}

// A KvEventPublisher served on 127.0.0.1 (port 0 the first time, then the
// same port again to play a restarted worker).
struct FakeWorker {
  explicit FakeWorker(int port_wanted, uint64_t instance)
      : publisher(KvEventPublisherOptions{4, instance}) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port_wanted),
                             grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(publisher.service());
    server = builder.BuildAndStart();
  }
  ~FakeWorker() { server->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  KvEventPublisher publisher;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

bool WaitBlocks(const PrefixIndex& index, const std::string& w, uint32_t n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (index.NumBlocks(w) == n) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

kv::KvCacheEvent Stored(const kv::BlockHash& h) { return {kv::KvCacheEvent::Kind::kStored, h}; }

TEST(KvEventWatchersTest, FollowsAWorkerAcrossARestart) {
  Lines log;
  PrefixIndex index(kFp, log.Fn());
  const std::vector<int32_t> prompt = Tokens(0, 12);
  const std::vector<kv::BlockHash> h = kv::HashFullBlocks(prompt, 4, kFp);
  auto worker = std::make_unique<FakeWorker>(0, 11);
  ASSERT_NE(worker->server, nullptr);
  const int port = worker->port;
  worker->publisher.Publish({Stored(h[0])});  // before the watch: in the snapshot
  {
    KvEventWatchers watchers(&index, KvEventWatcherOptions{50});
    watchers.Watch("d0", worker->address());
    ASSERT_TRUE(WaitBlocks(index, "d0", 1));
    worker->publisher.Publish({Stored(h[1]), Stored(h[2])});
    ASSERT_TRUE(WaitBlocks(index, "d0", 3));
    EXPECT_EQ(index.CachedPrefixTokens("d0", prompt), 12);

    // The worker goes away: its entries go with its stream.
    worker.reset();
    ASSERT_TRUE(WaitBlocks(index, "d0", 0));
    EXPECT_EQ(index.CachedPrefixTokens("d0", prompt), 0);
    // It comes back (same address, a new instance, an empty cache), then
    // caches one block.
    worker = std::make_unique<FakeWorker>(port, 12);
    ASSERT_NE(worker->server, nullptr);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (worker->publisher.num_subscribers() == 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(worker->publisher.num_subscribers(), 1u);
    EXPECT_EQ(index.NumBlocks("d0"), 0u);
    worker->publisher.Publish({Stored(h[0])});
    ASSERT_TRUE(WaitBlocks(index, "d0", 1));
    EXPECT_EQ(index.CachedPrefixTokens("d0", prompt), 4);

    watchers.Stop("d0", "dropped from the registry");
    EXPECT_EQ(index.NumBlocks("d0"), 0u);
  }  // the destructor waits for every stream to end
  const std::vector<std::string> lines = log.Get();
  ASSERT_GE(lines.size(), 3u);
  EXPECT_THAT(lines[0], HasSubstr("worker d0: 3 blocks dropped (event stream ended"));
  EXPECT_THAT(lines[1], HasSubstr("worker d0 is a new instance (11 -> 12)"));
  EXPECT_THAT(lines.back(), HasSubstr("worker d0: 1 blocks dropped (dropped from the registry)"));
}

}  // namespace
}  // namespace tandem::router
