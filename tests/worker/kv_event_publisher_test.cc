// KvEventPublisher: sequence numbers, the snapshot and its sequence, event
// batches in order, a slow subscriber cut off (a gap) without blocking
// Publish, and the KvEvents.Watch service over a real in-process server.
#include "worker/kv_event_publisher.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

kv::KvCacheEvent Stored(uint64_t hi, uint64_t lo) {
  return {kv::KvCacheEvent::Kind::kStored, kv::BlockHash{hi, lo}};
}
kv::KvCacheEvent Removed(uint64_t hi, uint64_t lo) {
  return {kv::KvCacheEvent::Kind::kRemoved, kv::BlockHash{hi, lo}};
}

// Records what the publisher writes; `queued` stands for batches a slow
// client has not taken yet.
class FakeOutlet : public KvEventOutlet {
 public:
  bool Write(const v1::KvEventBatch& batch) override {
    if (finished || closed) return false;
    batches.push_back(batch);
    ++queued;
    return true;
  }
  size_t Queued() override { return queued; }
  void Finish(const grpc::Status& status) override {
    finished = true;
    finish_status = status;
  }
  std::vector<v1::KvEventBatch> batches;
  size_t queued = 0;
  bool closed = false;  // the client left: Write answers false
  bool finished = false;
  grpc::Status finish_status;
};

// "S:hi:lo" / "R:hi:lo" per event, for exact comparisons.
std::vector<std::string> Events(const v1::KvEventBatch& b) {
  std::vector<std::string> out;
  for (const v1::KvBlockEvent& e : b.events()) {
    out.push_back((e.kind() == v1::KvBlockEvent::STORED ? "S:" : "R:") +
                  std::to_string(e.hash().hi()) + ":" + std::to_string(e.hash().lo()));
  }
  return out;
}

TEST(KvEventPublisherTest, RandomNonZeroInstanceIdsDiffer) {
  KvEventPublisher a(KvEventPublisherOptions{16});
  KvEventPublisher b(KvEventPublisherOptions{16});
  EXPECT_NE(a.instance_id(), 0u);
  EXPECT_NE(a.instance_id(), b.instance_id());
  KvEventPublisher fixed(KvEventPublisherOptions{16, 77});
  EXPECT_EQ(fixed.instance_id(), 77u);
}

TEST(KvEventPublisherTest, SnapshotThenNumberedBatchesInOrder) {
  KvEventPublisher pub(KvEventPublisherOptions{8, 42});
  pub.Publish({Stored(1, 1), Stored(2, 2), Stored(3, 3)});  // sequences 1..3
  pub.Publish({});                                           // nothing
  pub.Publish({Removed(2, 2)});                              // 4
  EXPECT_EQ(pub.last_sequence(), 4u);
  EXPECT_EQ(pub.num_cached(), 2u);

  auto outlet = std::make_shared<FakeOutlet>();
  pub.Subscribe(outlet);
  ASSERT_EQ(outlet->batches.size(), 1u);
  const v1::KvEventBatch& snap = outlet->batches[0];
  EXPECT_TRUE(snap.snapshot());
  EXPECT_EQ(snap.instance_id(), 42u);
  EXPECT_EQ(snap.block_size(), 8u);
  EXPECT_EQ(snap.sequence(), 4u);  // reflects events 1..4
  std::vector<std::string> hashes = Events(snap);
  std::sort(hashes.begin(), hashes.end());
  EXPECT_THAT(hashes, ::testing::ElementsAre("S:1:1", "S:3:3"));

  pub.Publish({Stored(4, 4), Removed(1, 1)});  // 5, 6
  pub.Publish({Stored(1, 1)});                 // 7
  ASSERT_EQ(outlet->batches.size(), 3u);
  EXPECT_FALSE(outlet->batches[1].snapshot());
  EXPECT_EQ(outlet->batches[1].sequence(), 5u);
  EXPECT_EQ(outlet->batches[1].instance_id(), 42u);
  EXPECT_EQ(outlet->batches[1].block_size(), 8u);
  EXPECT_THAT(Events(outlet->batches[1]), ::testing::ElementsAre("S:4:4", "R:1:1"));
  EXPECT_EQ(outlet->batches[2].sequence(), 7u);
  EXPECT_THAT(Events(outlet->batches[2]), ::testing::ElementsAre("S:1:1"));
  EXPECT_EQ(pub.num_cached(), 3u);
}

TEST(KvEventPublisherTest, SlowSubscriberIsCutOffOthersKeepEverything) {
  KvEventPublisher pub(KvEventPublisherOptions{4, 1, /*max_queued_batches=*/3});
  auto slow = std::make_shared<FakeOutlet>();
  auto fast = std::make_shared<FakeOutlet>();
  pub.Subscribe(slow);
  pub.Subscribe(fast);
  for (uint64_t i = 1; i <= 5; ++i) {
    pub.Publish({Stored(i, i)});
    fast->queued = 0;  // the fast client takes everything at once
  }
  // slow: snapshot + batches 1, 2 fill its 3 slots; batch 3 finds it full:
  // its stream ends (RESOURCE_EXHAUSTED) and it never sees 3..5.
  ASSERT_EQ(slow->batches.size(), 3u);
  EXPECT_EQ(slow->batches[2].sequence(), 2u);
  EXPECT_TRUE(slow->finished);
  EXPECT_EQ(slow->finish_status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(slow->finish_status.error_message(), ::testing::HasSubstr("sequence 3"));
  ASSERT_EQ(fast->batches.size(), 6u);
  for (uint64_t i = 1; i <= 5; ++i) EXPECT_EQ(fast->batches[i].sequence(), i);
  EXPECT_FALSE(fast->finished);
  EXPECT_EQ(pub.num_subscribers(), 1u);

  // A client that left is pruned on the next batch.
  fast->closed = true;
  pub.Publish({Stored(9, 9)});
  EXPECT_EQ(pub.num_subscribers(), 0u);
}

TEST(KvEventPublisherTest, WatchStreamsSnapshotThenEvents) {
  KvEventPublisher pub(KvEventPublisherOptions{16, 5});
  pub.Publish({Stored(7, 8)});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(pub.service());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = v1::KvEvents::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto reader = stub->Watch(&ctx, v1::WatchKvEventsRequest());
  v1::KvEventBatch batch;
  ASSERT_TRUE(reader->Read(&batch));
  EXPECT_TRUE(batch.snapshot());
  EXPECT_EQ(batch.instance_id(), 5u);
  EXPECT_EQ(batch.sequence(), 1u);
  EXPECT_THAT(Events(batch), ::testing::ElementsAre("S:7:8"));
  // The subscriber is attached once the snapshot went out.
  pub.Publish({Removed(7, 8), Stored(9, 10)});
  ASSERT_TRUE(reader->Read(&batch));
  EXPECT_FALSE(batch.snapshot());
  EXPECT_EQ(batch.sequence(), 2u);
  EXPECT_THAT(Events(batch), ::testing::ElementsAre("R:7:8", "S:9:10"));
  ctx.TryCancel();
  while (reader->Read(&batch)) {
  }
  reader->Finish();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace tandem
