// The KV connection's control plane for a device transport, end to end
// over real sockets on 127.0.0.1: a KvSendQueue (P) announces frames as
// FRAME_DESC, a KvReceiver (D) checks them and hands them to a host-memory
// KvDataReceiver (fake_data_receiver.h, standing in for NCCL / CUDA IPC),
// and D ACKs once FINAL checked out and every Receive is done. Also the
// refusals (transport mismatch, no device KV, a failed OpenTransfer), a
// failed Receive, cancel / takeover / shutdown mid-transfer (CloseTransfer,
// then `done` only after `quiesced`), and FRAME on a device transfer.
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/send_queue.h"
#include "kvtransfer/wire.h"
#include "tests/kvtransfer/fake_data_receiver.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using testing::DeviceWriter;
using testing::DoneRecorder;
using testing::FakeDataReceiver;
using testing::LogPos;
using testing::OneSample;
using testing::RawPeer;
using testing::RefKv;
using testing::TestLayout;
using testing::VectorKvWriter;
using testing::WaitQueueResult;
using Id = KvSendQueue::TransferId;

constexpr KvTransport kNccl = KvTransport::kNccl;
constexpr KvTransport kTcp = KvTransport::kTcp;

class KvTransportDescriptorTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kHit = 2;
  static constexpr uint32_t kLen = 6;

  KvTransportDescriptorTest()
      : layout_(TestLayout(2, 2, 4)),
        ref_(layout_, kLen, 7),
        writer_(layout_, kLen),
        fake_(kNccl, &ref_, &writer_.rows) {}

  void StartReceiver(std::vector<KvTransport> transports = {kNccl, kTcp}) {
    KvReceiver::Options o;
    o.handshake_timeout_ms = 3000;
    o.transfer_timeout_ms = 3000;
    o.transports = std::move(transports);
    o.data_receivers = {&fake_};
    auto r = KvReceiver::Start(o, layout_);
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = *std::move(r);
    auto q = KvSendQueue::Start({1 << 20, 3000});
    ASSERT_TRUE(q.ok()) << q.status();
    queue_ = *std::move(q);
  }
  std::string Endpoint() const { return absl::StrCat("127.0.0.1:", receiver_->port()); }
  // Expects "r1" attempt 1 over [kHit, kLen) into the device writer; `done`
  // logs "done" into the fake's log.
  void Expect(KvWriter* writer = nullptr) {
    ASSERT_TRUE(receiver_
                    ->Expect("r1", 1, kHit, kLen, writer != nullptr ? writer : &writer_,
                             done_.Callback([this] { fake_.Log("done"); }))
                    .ok());
  }
  // Opens (r1, attempt) over nccl; notify logs "P result r1/<attempt>".
  Id Open(uint32_t attempt, const std::string& setup = "setup-1") {
    auto id = queue_->OpenWithTransport(Endpoint(), "r1", attempt, layout_,
                                        testing::kTestBitExactClass, kNccl, setup,
                                        [this, attempt] {
                                          fake_.Log(absl::StrCat("P result r1/", attempt));
                                        });
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }
  // Announces [kHit, kLen) of both layers in 2-token chunks, chunk-major:
  // (0,2) (1,2) (0,4) (1,4), comm_seq 100.., locator "loc<i>".
  std::vector<FrameDescriptor> AnnounceAll(Id id, uint32_t attempt) {
    std::vector<FrameDescriptor> sent;
    for (uint32_t start = kHit; start < kLen; start += 2) {
      for (uint32_t layer = 0; layer < 2; ++layer) {
        const uint64_t i = sent.size();
        sent.push_back({"r1", attempt, layer, start, 2, 100 + i, absl::StrCat("loc", i)});
        EXPECT_TRUE(queue_->EnqueueDescriptor(id, sent.back()).ok());
      }
    }
    return sent;
  }

  KvLayout layout_;
  RefKv ref_;
  DeviceWriter writer_;
  FakeDataReceiver fake_;
  DoneRecorder done_;
  std::unique_ptr<KvReceiver> receiver_;  // destroyed before the fake
  std::unique_ptr<KvSendQueue> queue_;    // destroyed first
};

TEST_F(KvTransportDescriptorTest, DescriptorsReachReceiveInOrderAndAckFollowsTheLast) {
  StartReceiver();
  Expect();
  fake_.Hold();
  const Id id = Open(1);
  const std::vector<FrameDescriptor> sent = AnnounceAll(id, 1);
  ASSERT_TRUE(queue_->EnqueueFinal(id, OneSample(42, -0.5f, 1)).ok());
  ASSERT_TRUE(fake_.WaitFrames(4));
  // No Receive has finished: neither end may have succeeded.
  EXPECT_FALSE(queue_->Result(id).has_value());
  EXPECT_EQ(done_.calls(), 0);
  fake_.Release();
  std::optional<absl::Status> result = WaitQueueResult(*queue_, id);
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->ok()) << *result;
  ASSERT_TRUE(done_.Wait());
  ASSERT_TRUE(done_.status().ok()) << done_.status();
  EXPECT_EQ(done_.result().samples[0].token, 42);
  EXPECT_EQ(done_.result().frames, 4u);
  EXPECT_EQ(done_.result().kv_bytes, 512u);  // 4 frames x FrameBytes(2) = 2 x 2 x 32

  const std::vector<FrameDescriptor> got = fake_.frames();
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].request_id, "r1") << i;
    EXPECT_EQ(got[i].attempt, 1u) << i;
    EXPECT_EQ(got[i].layer, sent[i].layer) << i;
    EXPECT_EQ(got[i].token_start, sent[i].token_start) << i;
    EXPECT_EQ(got[i].token_count, 2u) << i;
    EXPECT_EQ(got[i].comm_seq, 100 + i) << i;
    EXPECT_EQ(got[i].locator, absl::StrCat("loc", i)) << i;
  }
  EXPECT_EQ(fake_.setups(), std::vector<std::string>{"setup-1"});
  EXPECT_EQ(fake_.last_target(), writer_.device_target());
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (uint32_t t = kHit; t < kLen; ++t) {
      EXPECT_EQ(std::memcmp(writer_.rows.K(layer, t), ref_.K(layer, t), ref_.row_bytes()), 0);
      EXPECT_EQ(std::memcmp(writer_.rows.V(layer, t), ref_.V(layer, t), ref_.row_bytes()), 0);
    }
  }
  // P heard the ACK after the last Receive; D closed the transfer after
  // it too and ran `done` only after `quiesced`.
  const std::vector<std::string> log = fake_.log();
  const int last_received = LogPos(log, "received r1/1 #3 OK");
  ASSERT_GE(last_received, 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_LT(LogPos(log, absl::StrCat("received r1/1 #", i, " OK")), last_received);
  }
  EXPECT_GT(LogPos(log, "P result r1/1"), last_received);
  EXPECT_GT(LogPos(log, "close r1/1"), last_received);
  EXPECT_GT(LogPos(log, "quiesced r1/1"), LogPos(log, "close r1/1"));
  EXPECT_GT(LogPos(log, "done"), LogPos(log, "quiesced r1/1"));
  EXPECT_EQ(fake_.closes(), 1);
  EXPECT_EQ(receiver_->kv_bytes_received(kNccl), 512u);
  EXPECT_EQ(receiver_->kv_bytes_received(kTcp), 0u);
  EXPECT_EQ(receiver_->kv_bytes_received_total(), 512u);
  EXPECT_EQ(receiver_->transfers_completed_total(), 1u);
  EXPECT_GE(receiver_->transfer_seconds_total(), 0.0);
}

TEST_F(KvTransportDescriptorTest, TransportMismatchRejectNamesBoth) {
  StartReceiver({kTcp});
  Expect();
  const Id id = Open(1);
  std::optional<absl::Status> result = WaitQueueResult(*queue_, id);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->code(), absl::StatusCode::kFailedPrecondition) << *result;
  const std::string want =
      "KV transport mismatch: the prefill worker chose nccl, this decode worker offers tcp";
  EXPECT_NE(result->message().find(want), std::string::npos) << *result;
  ASSERT_TRUE(done_.Wait());
  EXPECT_EQ(done_.status(), absl::FailedPreconditionError(
                                absl::StrCat("KV receiver rejects request r1 attempt 1: ", want)));
  EXPECT_EQ(LogPos(fake_.log(), "open r1/1"), -1);  // never opened
}

TEST_F(KvTransportDescriptorTest, HostKvWriterIsRefusedForNccl) {
  StartReceiver();
  VectorKvWriter host(layout_, kLen);  // no device_target(): tcp only
  Expect(&host);
  const Id id = Open(1);
  std::optional<absl::Status> result = WaitQueueResult(*queue_, id);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->code(), absl::StatusCode::kFailedPrecondition) << *result;
  EXPECT_NE(result->message().find("this decode worker's KV cache is not on a device"),
            std::string::npos)
      << *result;
  ASSERT_TRUE(done_.Wait());
  EXPECT_EQ(done_.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(LogPos(fake_.log(), "open r1/1"), -1);  // never opened
}

TEST_F(KvTransportDescriptorTest, OpenTransferErrorIsTheReject) {
  StartReceiver();
  fake_.FailOpen(absl::UnavailableError("no communicator"));
  Expect();
  const Id id = Open(1);
  std::optional<absl::Status> result = WaitQueueResult(*queue_, id);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->code(), absl::StatusCode::kUnavailable) << *result;
  EXPECT_NE(result->message().find("no communicator"), std::string::npos) << *result;
  ASSERT_TRUE(done_.Wait());
  EXPECT_EQ(done_.status(),
            absl::UnavailableError("KV receiver rejects request r1 attempt 1: no communicator"));
  EXPECT_EQ(fake_.closes(), 0);  // a transfer that did not open is not closed
}

TEST_F(KvTransportDescriptorTest, FailedReceiveFailsTheTransfer) {
  StartReceiver();
  fake_.FailFrame(1, absl::DataLossError("bad locator"));
  Expect();
  const Id id = Open(1);
  AnnounceAll(id, 1);
  ASSERT_TRUE(queue_->EnqueueFinal(id, OneSample()).ok());
  std::optional<absl::Status> result = WaitQueueResult(*queue_, id);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->code(), absl::StatusCode::kDataLoss) << *result;
  EXPECT_NE(result->message().find("bad locator"), std::string::npos) << *result;
  ASSERT_TRUE(done_.Wait());
  EXPECT_EQ(done_.status(),
            absl::DataLossError("KV transfer for request r1 attempt 1: receiving a frame on "
                                "nccl failed: bad locator"));
  const std::vector<std::string> log = fake_.log();
  EXPECT_EQ(fake_.closes(), 1);
  EXPECT_GT(LogPos(log, "close r1/1"), LogPos(log, "received r1/1 #1 DATA_LOSS"));
  EXPECT_GT(LogPos(log, "done"), LogPos(log, "quiesced r1/1"));
  EXPECT_EQ(receiver_->transfers_completed_total(), 0u);
}

TEST_F(KvTransportDescriptorTest, CancelClosesThenDoneRunsOnlyAfterQuiesced) {
  StartReceiver();
  Expect();
  fake_.Hold();
  const Id id = Open(1);
  ASSERT_TRUE(queue_->EnqueueDescriptor(id, {"r1", 1, 0, kHit, 2, 0, ""}).ok());
  ASSERT_TRUE(queue_->EnqueueDescriptor(id, {"r1", 1, 1, kHit, 2, 1, ""}).ok());
  ASSERT_TRUE(fake_.WaitFrames(2));
  receiver_->Cancel("r1");
  ASSERT_TRUE(fake_.WaitCloses(1));
  // The data path still holds the frames: not quiesced, so no `done`.
  EXPECT_EQ(done_.calls(), 0);
  EXPECT_EQ(receiver_->transfers_in_flight(), 1u);
  fake_.Release();
  ASSERT_TRUE(done_.Wait());
  EXPECT_EQ(done_.status(), absl::CancelledError("KV transfer for request r1 cancelled"));
  const std::vector<std::string> log = fake_.log();
  EXPECT_LT(LogPos(log, "close r1/1"), LogPos(log, "received r1/1 #0 CANCELLED"));
  EXPECT_LT(LogPos(log, "received r1/1 #1 CANCELLED"), LogPos(log, "quiesced r1/1"));
  EXPECT_LT(LogPos(log, "quiesced r1/1"), LogPos(log, "done"));
  std::optional<absl::Status> result = WaitQueueResult(*queue_, id);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->code(), absl::StatusCode::kCancelled) << *result;
  EXPECT_EQ(receiver_->kv_bytes_received(kNccl), 0u);
}

TEST_F(KvTransportDescriptorTest, NewerAttemptClosesTheOlderOneAndDoneWaitsForBoth) {
  StartReceiver();
  Expect();
  fake_.Hold();
  const Id first = Open(1);
  ASSERT_TRUE(queue_->EnqueueDescriptor(first, {"r1", 1, 0, kHit, 2, 0, ""}).ok());
  ASSERT_TRUE(fake_.WaitFrames(1));
  const Id second = Open(2, "setup-2");
  ASSERT_TRUE(fake_.WaitCloses(1));  // attempt 1, at attempt 2's HELLO
  std::optional<absl::Status> old = WaitQueueResult(*queue_, first);
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->code(), absl::StatusCode::kAborted) << *old;
  AnnounceAll(second, 2);
  ASSERT_TRUE(queue_->EnqueueFinal(second, OneSample(5)).ok());
  ASSERT_TRUE(fake_.WaitFrames(5));
  fake_.Release();
  std::optional<absl::Status> result = WaitQueueResult(*queue_, second);
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->ok()) << *result;
  ASSERT_TRUE(done_.Wait());
  EXPECT_TRUE(done_.status().ok()) << done_.status();
  EXPECT_EQ(fake_.setups(), (std::vector<std::string>{"setup-1", "setup-2"}));
  const std::vector<std::string> log = fake_.log();
  EXPECT_EQ(fake_.closes(), 2);
  EXPECT_GE(LogPos(log, "received r1/1 #0 CANCELLED"), 0);
  EXPECT_LT(LogPos(log, "quiesced r1/1"), LogPos(log, "done"));
  EXPECT_LT(LogPos(log, "quiesced r1/2"), LogPos(log, "done"));
}

TEST_F(KvTransportDescriptorTest, ReceiverDestroyedMidTransferWaitsForQuiesced) {
  StartReceiver();
  Expect();
  fake_.Hold();
  const Id id = Open(1);
  ASSERT_TRUE(queue_->EnqueueDescriptor(id, {"r1", 1, 0, kHit, 2, 0, ""}).ok());
  ASSERT_TRUE(fake_.WaitFrames(1));
  std::thread stop([this] { receiver_.reset(); });
  ASSERT_TRUE(fake_.WaitCloses(1));
  EXPECT_EQ(done_.calls(), 0);
  fake_.Release();
  stop.join();
  ASSERT_EQ(done_.calls(), 1);
  EXPECT_EQ(done_.status().code(), absl::StatusCode::kCancelled);
  const std::vector<std::string> log = fake_.log();
  EXPECT_LT(LogPos(log, "quiesced r1/1"), LogPos(log, "done"));
}

TEST_F(KvTransportDescriptorTest, FrameOnDeviceTransferIsDataLoss) {
  StartReceiver();
  Expect();
  auto peer = RawPeer::Connect(receiver_->port());
  ASSERT_TRUE(peer.ok()) << peer.status();
  wire::Hello hello{kKvProtocolVersion, "r1", 1, layout_, testing::kTestBitExactClass,
                    {},                 "nccl", "s"};
  auto verdict = peer->Hello(hello);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  ASSERT_EQ(verdict->code, absl::StatusCode::kOk) << verdict->ToStatus();
  const uint64_t half = 2 * layout_.RowBytes();
  auto frame = wire::EncodeFrame({"r1", 1, 0, kHit, 2}, ref_.K(0, kHit), ref_.V(0, kHit), half);
  ASSERT_TRUE(frame.ok());
  ASSERT_TRUE(peer->Send(*frame).ok());
  verdict = peer->ReadVerdict();
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  const std::string want =
      "bad KV frame for request r1 attempt 1: FRAME on a nccl transfer (its frames come as "
      "FRAME_DESC)";
  EXPECT_EQ(verdict->ToStatus(), absl::DataLossError(want));
  ASSERT_TRUE(done_.Wait());
  EXPECT_EQ(done_.status(), absl::DataLossError(want));
  EXPECT_EQ(fake_.closes(), 1);
}

TEST_F(KvTransportDescriptorTest, FrameDescOutsideTheRangeIsDataLoss) {
  StartReceiver();
  Expect();
  auto peer = RawPeer::Connect(receiver_->port());
  ASSERT_TRUE(peer.ok()) << peer.status();
  wire::Hello hello{kKvProtocolVersion, "r1", 1, layout_, testing::kTestBitExactClass,
                    {},                 "nccl", ""};
  auto verdict = peer->Hello(hello);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  ASSERT_EQ(verdict->code, absl::StatusCode::kOk) << verdict->ToStatus();
  ASSERT_TRUE(peer->Send(wire::EncodeFrameDesc({"r1", 1, 0, kHit - 1, 2, 0, ""})).ok());
  verdict = peer->ReadVerdict();
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  const absl::Status want =
      absl::DataLossError("bad KV frame for request r1 attempt 1: token_start 1 < hit_tokens 2");
  EXPECT_EQ(verdict->ToStatus(), want);
  ASSERT_TRUE(done_.Wait());
  EXPECT_EQ(done_.status(), want);
  EXPECT_TRUE(fake_.frames().empty());  // never reached the data path
  EXPECT_EQ(fake_.closes(), 1);
}

// A receiver that offers nccl still takes tcp transfers as before: FRAMEs,
// no ACK, counted under tcp.
TEST_F(KvTransportDescriptorTest, TcpTransferStillWorksAndCountsUnderTcp) {
  StartReceiver();
  VectorKvWriter host(layout_, kLen);
  Expect(&host);
  auto id = queue_->Open(Endpoint(), "r1", 1, layout_, testing::kTestBitExactClass, nullptr);
  ASSERT_TRUE(id.ok()) << id.status();
  for (uint32_t layer = 0; layer < 2; ++layer) {
    auto queued = queue_->EnqueueFrame(*id, layer, kHit, kLen - kHit, ref_.K(layer, kHit),
                                       ref_.V(layer, kHit));
    ASSERT_TRUE(queued.ok() && *queued);
  }
  ASSERT_TRUE(queue_->EnqueueFinal(*id, OneSample()).ok());
  std::optional<absl::Status> result = WaitQueueResult(*queue_, *id);
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->ok()) << *result;
  ASSERT_TRUE(done_.Wait());
  EXPECT_TRUE(done_.status().ok()) << done_.status();
  EXPECT_EQ(receiver_->kv_bytes_received(kTcp), 512u);  // 2 layers x FrameBytes(4) = 2 x 4 x 32
  EXPECT_EQ(receiver_->kv_bytes_received(kNccl), 0u);
  EXPECT_EQ(receiver_->transfers_completed_total(), 1u);
  EXPECT_EQ(LogPos(fake_.log(), "open r1/1"), -1);  // the data path is not used
}

TEST_F(KvTransportDescriptorTest, FrameDescOnTcpTransferIsDataLoss) {
  StartReceiver();
  VectorKvWriter host(layout_, kLen);
  Expect(&host);
  auto peer = RawPeer::Connect(receiver_->port());
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto verdict = peer->Hello("r1", 1, layout_);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  ASSERT_EQ(verdict->code, absl::StatusCode::kOk) << verdict->ToStatus();
  ASSERT_TRUE(peer->Send(wire::EncodeFrameDesc({"r1", 1, 0, kHit, 2, 0, ""})).ok());
  verdict = peer->ReadVerdict();
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(verdict->ToStatus(),
            absl::DataLossError("bad KV frame for request r1 attempt 1: FRAME_DESC on a tcp "
                                "transfer"));
  ASSERT_TRUE(done_.Wait());
  EXPECT_EQ(done_.status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(KvTransportDescriptorTest, V2HelloIsRefused) {
  StartReceiver();
  Expect();
  auto peer = RawPeer::Connect(receiver_->port());
  ASSERT_TRUE(peer.ok()) << peer.status();
  wire::Hello hello{2, "r1", 1, layout_, testing::kTestBitExactClass, {}, "tcp", ""};
  auto verdict = peer->Hello(hello);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(verdict->ToStatus(),
            absl::FailedPreconditionError(
                "KV protocol version 2 is not supported (this worker speaks 4)"));
  EXPECT_EQ(done_.calls(), 0);  // names no transfer it could end
  EXPECT_EQ(receiver_->transfers_in_flight(), 1u);
}

TEST_F(KvTransportDescriptorTest, StartNeedsADataReceiverPerDeviceTransport) {
  KvReceiver::Options o;
  o.transports = {kNccl, kTcp};
  EXPECT_EQ(KvReceiver::Start(o, layout_).status(),
            absl::InvalidArgumentError("KvReceiver: transports offers nccl but data_receivers "
                                       "has no KvDataReceiver for it"));
  o.data_receivers = {nullptr};
  o.transports = {kTcp};
  EXPECT_EQ(KvReceiver::Start(o, layout_).status(),
            absl::InvalidArgumentError("KvReceiver: data_receivers holds a null entry"));
}

}  // namespace
}  // namespace tandem::kvtransfer
