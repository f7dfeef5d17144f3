// KvReceiver's two threads serve every connection: hundreds of concurrent
// transfers without a thread each, a slow-loris sender that stalls nobody,
// a slow `done` that stalls no I/O, CancelAttempt, a superseded attempt,
// a bad frame sent a byte at a time, and Options::log.
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/wire.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using namespace std::chrono_literals;
using testing::DoneRecorder;
using testing::OneSample;
using testing::RawPeer;
using testing::RefKv;
using testing::SendRange;
using testing::TestLayout;
using testing::VectorKvWriter;

// Threads of this process (/proc/self/status "Threads:"); -1 if unreadable.
int ThreadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    int n = 0;
    if (absl::StartsWith(line, "Threads:") &&
        absl::SimpleAtoi(line.substr(8), &n)) {
      return n;
    }
  }
  return -1;
}

// Collects Options::log lines.
class LogLines {
 public:
  std::function<void(std::string_view)> Sink() {
    return [this](std::string_view line) {
      absl::MutexLock l(&mu_);
      lines_.emplace_back(line);
    };
  }
  std::vector<std::string> lines() const {
    absl::MutexLock l(&mu_);
    return lines_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

class KvMultiplexTest : public testing::ReceiverTest {
 protected:
  // FRAME of tokens [start, start + count) of `layer` from `ref`.
  std::string Frame(const std::string& id, uint32_t attempt, uint32_t layer,
                    uint32_t start, uint32_t count, const RefKv& ref) {
    auto f = wire::EncodeFrame({id, attempt, layer, start, count},
                               ref.K(layer, start), ref.V(layer, start),
                               count * ref.row_bytes());
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? *f : std::string();
  }
  static std::string Final(uint64_t frames, uint64_t kv_bytes, int32_t token) {
    TransferResult r;
    r.samples = OneSample(token);
    r.frames = frames;
    r.kv_bytes = kv_bytes;
    return wire::EncodeFinal(r);
  }
  // A raw peer whose HELLO for (id, attempt) was ACCEPTed.
  RawPeer Accepted(const std::string& id, uint32_t attempt) {
    auto peer = RawPeer::Connect(receiver_->port());
    EXPECT_TRUE(peer.ok()) << peer.status();
    auto verdict = peer->Hello(id, attempt, layout_);
    EXPECT_TRUE(verdict.ok() && verdict->code == absl::StatusCode::kOk)
        << (verdict.ok() ? verdict->ToStatus() : verdict.status());
    return std::move(*peer);
  }
};

TEST_F(KvMultiplexTest, TwoHundredConcurrentTransfersUseTwoThreads) {
  // 2 layers, kv_dim 4, f32: a row is 16 bytes. Each transfer sends 8
  // tokens per layer in one frame: 2 frames of 2 x 8 x 16 = 256 bytes, 512
  // bytes in all; 200 transfers: 102,400 bytes.
  constexpr int kTransfers = 200;
  const int before = ThreadCount();
  ASSERT_GT(before, 0);
  Start(TestLayout(2, 1, 4));
  const int with_receiver = ThreadCount();
  EXPECT_EQ(with_receiver, before + 2);  // the I/O and completion threads

  std::vector<std::unique_ptr<VectorKvWriter>> writers;
  std::vector<std::unique_ptr<DoneRecorder>> dones;
  std::vector<std::unique_ptr<RefKv>> refs;
  std::vector<RawPeer> peers;
  for (int i = 0; i < kTransfers; ++i) {
    const std::string id = absl::StrCat("req-", i);
    writers.push_back(std::make_unique<VectorKvWriter>(layout_, 8));
    dones.push_back(std::make_unique<DoneRecorder>());
    refs.push_back(std::make_unique<RefKv>(layout_, 8, 1000 + i));
    ASSERT_TRUE(receiver_->Expect(id, 1, 0, 8, writers.back().get(),
                                  dones.back()->Callback()).ok());
    auto peer = RawPeer::Connect(receiver_->port());
    ASSERT_TRUE(peer.ok()) << peer.status();
    peers.push_back(std::move(*peer));
  }
  // Every HELLO goes out before any verdict is read: 200 connections are
  // open and waiting at once.
  for (int i = 0; i < kTransfers; ++i) {
    wire::Hello hello;
    hello.request_id = absl::StrCat("req-", i);
    hello.attempt = 1;
    hello.layout = layout_;
    hello.bit_exact_class = testing::kTestBitExactClass;
    ASSERT_TRUE(peers[i].Send(wire::EncodeHello(hello)).ok());
  }
  for (int i = 0; i < kTransfers; ++i) {
    auto verdict = peers[i].ReadVerdict();
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    ASSERT_EQ(verdict->code, absl::StatusCode::kOk) << verdict->ToStatus();
  }
  EXPECT_EQ(receiver_->transfers_in_flight(), 200u);
  EXPECT_EQ(ThreadCount(), with_receiver);
  // Layer 0 of every transfer, then layer 1, then every FINAL.
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (int i = 0; i < kTransfers; ++i) {
      ASSERT_TRUE(peers[i].Send(Frame(absl::StrCat("req-", i), 1, layer, 0, 8,
                                      *refs[i])).ok());
    }
  }
  EXPECT_EQ(ThreadCount(), with_receiver);
  for (int i = 0; i < kTransfers; ++i) {
    ASSERT_TRUE(peers[i].Send(Final(2, 512, i)).ok());
  }
  for (int i = 0; i < kTransfers; ++i) {
    ASSERT_TRUE(dones[i]->Wait()) << "transfer " << i;
    ASSERT_TRUE(dones[i]->status().ok()) << dones[i]->status();
    EXPECT_EQ(dones[i]->result().frames, 2u);
    EXPECT_EQ(dones[i]->result().kv_bytes, 512u);
    EXPECT_EQ(dones[i]->result().samples[0].token, i);
    for (uint32_t layer = 0; layer < 2; ++layer) {
      EXPECT_EQ(std::memcmp(writers[i]->K(layer, 0), refs[i]->K(layer, 0), 128), 0)
          << "transfer " << i << " layer " << layer;
      EXPECT_EQ(std::memcmp(writers[i]->V(layer, 0), refs[i]->V(layer, 0), 128), 0)
          << "transfer " << i << " layer " << layer;
    }
  }
  EXPECT_EQ(receiver_->kv_bytes_received_total(), 102400u);
  EXPECT_EQ(receiver_->transfers_in_flight(), 0u);
  EXPECT_EQ(ThreadCount(), with_receiver);
}

TEST_F(KvMultiplexTest, SlowLorisSendersTimeOutAndStallNobody) {
  // One sender stops after half a FRAME header, another after half a HELLO
  // header; a third transfer runs start to finish meanwhile.
  Start(TestLayout(1, 1, 4), /*handshake_ms=*/1500, /*transfer_ms=*/1500);
  VectorKvWriter writer_loris(layout_, 4), writer_ok(layout_, 4);
  DoneRecorder done_loris, done_ok;
  ASSERT_TRUE(receiver_->Expect("req-loris", 1, 0, 4, &writer_loris,
                                done_loris.Callback()).ok());
  ASSERT_TRUE(receiver_->Expect("req-ok", 1, 0, 4, &writer_ok,
                                done_ok.Callback()).ok());
  RawPeer loris = Accepted("req-loris", 1);
  const std::string frame_header =
      Frame("req-loris", 1, 0, 0, 4, RefKv(layout_, 4, 1)).substr(0, 4);
  ASSERT_TRUE(loris.Send(frame_header).ok());
  auto mute = RawPeer::Connect(receiver_->port());
  ASSERT_TRUE(mute.ok()) << mute.status();
  ASSERT_TRUE(mute->Send(wire::EncodeAccept().substr(0, 4)).ok());

  const RefKv ref(layout_, 4, 2);
  auto sender = Connect("req-ok", 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(SendRange(**sender, ref, 1, 0, 4, 1).ok());  // 4 frames
  ASSERT_TRUE((*sender)->SendFinal(OneSample(5)).ok());
  ASSERT_TRUE(done_ok.Wait());
  EXPECT_TRUE(done_ok.status().ok()) << done_ok.status();
  EXPECT_EQ(std::memcmp(writer_ok.K(0, 0), ref.K(0, 0), 4 * 16), 0);
  EXPECT_EQ(done_loris.calls(), 0);  // its 1.5 s of silence are not over

  ASSERT_TRUE(done_loris.Wait(3s));
  EXPECT_EQ(done_loris.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StartsWith(done_loris.status().message(),
                               "KV transfer for request req-loris stalled for 1500 ms: "))
      << done_loris.status();
  const absl::Status stalled = done_loris.status();
  auto verdict = loris.ReadVerdict();
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(verdict->ToStatus(), stalled);
  verdict = mute->ReadVerdict();
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(verdict->ToStatus(),
            absl::DeadlineExceededError(
                "no complete KV HELLO within 1500 ms of connecting"));
  EXPECT_EQ(writer_loris.writes_started(), 0);
}

TEST_F(KvMultiplexTest, SlowDoneDoesNotStallIo) {
  // `done` of transfer A blocks until released; transfer B still moves all
  // its bytes into its writer meanwhile (its own `done` queues behind A's).
  Start(TestLayout(1, 1, 4));
  VectorKvWriter writer_a(layout_, 4), writer_b(layout_, 4);
  absl::Mutex gate_mu;
  bool release = false;
  DoneRecorder done_a, done_b;
  ASSERT_TRUE(receiver_->Expect("req-a", 1, 0, 4, &writer_a, done_a.Callback([&] {
    absl::MutexLock l(&gate_mu);
    gate_mu.Await(absl::Condition(&release));
  })).ok());
  ASSERT_TRUE(receiver_->Expect("req-b", 1, 0, 4, &writer_b, done_b.Callback()).ok());
  receiver_->Cancel("req-a");  // its `done` now blocks the completion thread

  const RefKv ref(layout_, 4, 7);
  auto sender = Connect("req-b", 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(SendRange(**sender, ref, 1, 0, 4, 1).ok());
  ASSERT_TRUE((*sender)->SendFinal(OneSample()).ok());
  // All 4 frames are written, and B is no longer in flight, while A's
  // `done` still runs.
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (receiver_->transfers_in_flight() != 0 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(receiver_->transfers_in_flight(), 0u);
  EXPECT_EQ(writer_b.writes_finished(), 4);
  EXPECT_EQ(receiver_->kv_bytes_received_total(), 4u * 2 * 16);
  EXPECT_EQ(done_a.calls(), 0);
  EXPECT_EQ(done_b.calls(), 0);
  {
    absl::MutexLock l(&gate_mu);
    release = true;
  }
  ASSERT_TRUE(done_b.Wait());
  EXPECT_TRUE(done_b.status().ok()) << done_b.status();
  EXPECT_EQ(done_a.status().code(), absl::StatusCode::kCancelled);
}

TEST_F(KvMultiplexTest, CancelAttemptEndsOnlyThatLiveAttempt) {
  LogLines log;
  Start(TestLayout(1, 1, 4), 2000, 2000, log.Sink());
  VectorKvWriter writer(layout_, 8);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-ca", 1, 0, 8, &writer, done.Callback()).ok());
  EXPECT_EQ(receiver_->CancelAttempt("req-ca", 2, "wrong attempt"),
            absl::NotFoundError("no live KV transfer for request req-ca attempt 2"));
  EXPECT_EQ(receiver_->CancelAttempt("req-none", 1, "unknown"),
            absl::NotFoundError("no live KV transfer for request req-none attempt 1"));
  EXPECT_EQ(receiver_->transfers_in_flight(), 1u);

  RawPeer peer = Accepted("req-ca", 1);
  const RefKv ref(layout_, 8, 3);
  ASSERT_TRUE(peer.Send(Frame("req-ca", 1, 0, 0, 4, ref)).ok());
  // The frame is written before the cancel, so the cancel meets RECEIVING.
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (writer.writes_finished() < 1 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(writer.writes_finished(), 1);
  ASSERT_TRUE(receiver_->CancelAttempt("req-ca", 1, "prefill worker p0 failed").ok());
  const absl::Status cancelled = absl::CancelledError(
      "KV transfer for request req-ca attempt 1 cancelled: prefill worker p0 failed");
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.status(), cancelled);
  auto verdict = peer.ReadVerdict();
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(verdict->ToStatus(), cancelled);
  EXPECT_EQ(receiver_->transfers_in_flight(), 0u);
  EXPECT_EQ(receiver_->CancelAttempt("req-ca", 1, "again"),
            absl::NotFoundError("no live KV transfer for request req-ca attempt 1"));
  EXPECT_EQ(done.calls(), 1);
  EXPECT_EQ(log.lines(),
            std::vector<std::string>{
                "KV receiver: transfer for request req-ca attempt 1 failed: "
                "CANCELLED: KV transfer for request req-ca attempt 1 "
                "cancelled: prefill worker p0 failed"});
}

TEST_F(KvMultiplexTest, CancelAttemptBeforeHelloAndLateHelloIsRefused) {
  LogLines log;
  Start(TestLayout(1, 1, 4), 2000, 2000, log.Sink());
  VectorKvWriter writer(layout_, 4);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-early", 3, 0, 4, &writer, done.Callback()).ok());
  ASSERT_TRUE(receiver_->CancelAttempt("req-early", 3, "router gave up").ok());
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.status(),
            absl::CancelledError("KV transfer for request req-early attempt 3 "
                                 "cancelled: router gave up"));
  auto peer = RawPeer::Connect(receiver_->port());
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto verdict = peer->Hello("req-early", 3, layout_);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  const absl::Status late = absl::AbortedError(
      "KV transfer for request req-early attempt 3 already finished (CANCELLED)");
  EXPECT_EQ(verdict->ToStatus(), late);
  EXPECT_EQ(writer.writes_started(), 0);
  // One line for the failed transfer, one for the refused connection (its
  // port is the peer's ephemeral one).
  const std::vector<std::string> lines = log.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0],
            "KV receiver: transfer for request req-early attempt 3 failed: "
            "CANCELLED: KV transfer for request req-early attempt 3 cancelled: "
            "router gave up");
  EXPECT_TRUE(absl::StartsWith(lines[1], "KV receiver: refused connection from 127.0.0.1:"))
      << lines[1];
  EXPECT_TRUE(absl::EndsWith(lines[1], absl::StrCat(": ", late.ToString())))
      << lines[1];
}

TEST_F(KvMultiplexTest, SupersededAttemptIsRejectedAndItsKeyIsNoLongerLive) {
  // 2 layers x 8 tokens, kv_dim 4 f32: a full-layer frame is 2 x 8 x 16 =
  // 256 bytes. Attempt 1 sends one (counted, then discarded), attempt 2
  // both: 768 bytes received in all, 512 in the result.
  LogLines log;
  Start(TestLayout(2, 1, 4), 2000, 2000, log.Sink());
  VectorKvWriter writer(layout_, 8);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-sup", 1, 0, 8, &writer, done.Callback()).ok());
  const RefKv stale(layout_, 8, 1), fresh(layout_, 8, 2);
  RawPeer first = Accepted("req-sup", 1);
  ASSERT_TRUE(first.Send(Frame("req-sup", 1, 0, 0, 8, stale)).ok());
  RawPeer second = Accepted("req-sup", 2);
  const absl::Status superseded = absl::AbortedError(
      "KV transfer for request req-sup attempt 1 superseded by attempt 2");
  auto verdict = first.ReadVerdict();
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(verdict->ToStatus(), superseded);
  EXPECT_EQ(receiver_->CancelAttempt("req-sup", 1, "late"),
            absl::NotFoundError("no live KV transfer for request req-sup attempt 1"));

  ASSERT_TRUE(second.Send(Frame("req-sup", 2, 0, 0, 8, fresh) +
                          Frame("req-sup", 2, 1, 0, 8, fresh) + Final(2, 512, 9))
                  .ok());
  ASSERT_TRUE(done.Wait());
  ASSERT_TRUE(done.status().ok()) << done.status();
  EXPECT_EQ(done.result().frames, 2u);
  EXPECT_EQ(done.result().kv_bytes, 512u);
  for (uint32_t layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(std::memcmp(writer.K(layer, 0), fresh.K(layer, 0), 128), 0);
    EXPECT_EQ(std::memcmp(writer.V(layer, 0), fresh.V(layer, 0), 128), 0);
  }
  EXPECT_EQ(receiver_->kv_bytes_received_total(), 768u);
  const std::vector<std::string> lines = log.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(lines[0], "KV receiver: closed connection from 127.0.0.1:"))
      << lines[0];
  EXPECT_TRUE(absl::EndsWith(lines[0], absl::StrCat(": ", superseded.ToString())))
      << lines[0];
}

TEST_F(KvMultiplexTest, BadFrameByteByByteEndsOnlyItsTransfer) {
  // A frame for layer 3 of a 2-layer layout, sent one byte per write while
  // another transfer is mid-way; the other one then completes.
  Start(TestLayout(2, 1, 4));
  VectorKvWriter writer_bad(layout_, 4), writer_ok(layout_, 4);
  DoneRecorder done_bad, done_ok;
  ASSERT_TRUE(receiver_->Expect("req-bad", 1, 0, 4, &writer_bad, done_bad.Callback()).ok());
  ASSERT_TRUE(receiver_->Expect("req-ok", 1, 0, 4, &writer_ok, done_ok.Callback()).ok());
  const RefKv ref(layout_, 4, 4);
  RawPeer ok = Accepted("req-ok", 1);
  ASSERT_TRUE(ok.Send(Frame("req-ok", 1, 0, 0, 4, ref)).ok());
  RawPeer bad = Accepted("req-bad", 1);
  std::vector<float> zeros(4 * 4, 0.0f);
  auto frame = wire::EncodeFrame({"req-bad", 1, 3, 0, 4}, zeros.data(),
                                 zeros.data(), zeros.size() * sizeof(float));
  ASSERT_TRUE(frame.ok());
  for (char byte : *frame) ASSERT_TRUE(bad.Send(std::string(1, byte)).ok());
  ASSERT_TRUE(done_bad.Wait());
  const absl::Status data_loss = absl::DataLossError(
      "bad KV frame for request req-bad attempt 1: layer 3 >= n_layers 2");
  EXPECT_EQ(done_bad.status(), data_loss);
  auto verdict = bad.ReadVerdict();
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(verdict->ToStatus(), data_loss);
  EXPECT_EQ(writer_bad.writes_started(), 0);

  ASSERT_TRUE(ok.Send(Frame("req-ok", 1, 1, 0, 4, ref) + Final(2, 256, 1)).ok());
  ASSERT_TRUE(done_ok.Wait());
  ASSERT_TRUE(done_ok.status().ok()) << done_ok.status();
  EXPECT_EQ(std::memcmp(writer_ok.V(1, 0), ref.V(1, 0), 64), 0);
  EXPECT_EQ(receiver_->kv_bytes_received_total(), 256u);
}

}  // namespace
}  // namespace tandem::kvtransfer
