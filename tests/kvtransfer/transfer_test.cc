// KvReceiver + KvSender over real sockets on 127.0.0.1 (ephemeral ports):
// full transfers, byte counts, handshake outcomes, timeouts, cancel and
// attempts. protocol_v2_test.cc (same binary) has the v2 handshake cases:
// protocol version, dtype, bit-exact class, f16 end to end. Expected byte counts are worked out by hand in the comments.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/cpu_kv_storage.h"
#include "gtest/gtest.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/wire.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using namespace std::chrono_literals;
using testing::StorageWriter;
using testing::DoneRecorder;
using testing::kTestBitExactClass;
using testing::OneSample;
using testing::RandomSamples;
using testing::SameSamples;
using testing::RefKv;
using testing::SendRange;
using testing::TestLayout;
using testing::VectorKvWriter;

using testing::kSenderTimeoutMs;

class KvTransferTest : public testing::ReceiverTest {
 protected:
  // Sends frames until one fails (the receiver ended the transfer), at most
  // for 3 s; returns the error (OK if none came).
  static absl::Status SendUntilError(KvSender& s, const RefKv& ref) {
    const auto until = std::chrono::steady_clock::now() + 3s;
    while (std::chrono::steady_clock::now() < until) {
      absl::Status st = s.SendFrame(0, 0, 1, ref.K(0, 0), ref.V(0, 0));
      if (!st.ok()) return st;
      std::this_thread::sleep_for(5ms);
    }
    return absl::OkStatus();
  }
};

TEST_F(KvTransferTest, FullTransferIsBitExactInKvStorage) {
  // 3 layers, kv_dim 2 x 4 = 8. Prompt 37 tokens, D already holds 5, so P
  // sends [5, 37) = 32 tokens in chunks 13, 13, 6: 9 frames,
  // 3 x 32 x 2 x 8 x 4 = 6,144 bytes.
  Start(TestLayout(3, 2, 4));
  kv::CpuKvStorage pool(kv::KvShape{3, 2, 4, 16}, 8);
  kv::BlockPool ids(8);
  auto blocks = ids.Allocate(3);  // ceil(38 / 16)
  ASSERT_TRUE(blocks.has_value());
  StorageWriter writer(&pool, *blocks);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-full", 1, 5, 37, &writer, done.Callback()).ok());
  EXPECT_EQ(receiver_->transfers_in_flight(), 1u);

  const RefKv ref(layout_, 37, 1234);
  auto sender = Connect("req-full", 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(SendRange(**sender, ref, 3, 5, 37, 13).ok());
  EXPECT_EQ((*sender)->bytes_sent(), 6144u);
  EXPECT_EQ((*sender)->frames_sent(), 9u);
  // n = 2: token 0 of both samples, with 3 and 2 top logprobs.
  std::vector<FinalSample> samples(2);
  samples[0] = {42, -0.25f, 2, {{42, -0.25f}, {17, -1.5f}, {9, -3.0f}}};
  samples[1] = {-7, -0.75f, 0, {{3, -0.5f}, {-7, -0.75f}}};
  ASSERT_TRUE((*sender)->SendFinal(samples).ok());

  ASSERT_TRUE(done.Wait());
  ASSERT_TRUE(done.status().ok()) << done.status();
  const TransferResult r = done.result();
  ASSERT_EQ(r.samples.size(), 2u);
  EXPECT_EQ(r.samples[0].token, 42);
  EXPECT_EQ(r.samples[0].logprob, -0.25f);
  EXPECT_EQ(r.samples[0].finish_reason, 2u);
  ASSERT_EQ(r.samples[0].top_logprobs.size(), 3u);
  EXPECT_EQ(r.samples[0].top_logprobs[1].token_id, 17);
  EXPECT_EQ(r.samples[0].top_logprobs[1].logprob, -1.5f);
  EXPECT_EQ(r.samples[0].top_logprobs[2].token_id, 9);
  EXPECT_EQ(r.samples[0].top_logprobs[2].logprob, -3.0f);
  EXPECT_EQ(r.samples[1].token, -7);
  EXPECT_EQ(r.samples[1].logprob, -0.75f);
  EXPECT_EQ(r.samples[1].finish_reason, 0u);
  ASSERT_EQ(r.samples[1].top_logprobs.size(), 2u);
  EXPECT_EQ(r.samples[1].top_logprobs[0].token_id, 3);
  EXPECT_EQ(r.samples[1].top_logprobs[0].logprob, -0.5f);
  EXPECT_TRUE(SameSamples(r.samples, samples));
  EXPECT_EQ(r.frames, 9u);
  EXPECT_EQ(r.kv_bytes, 6144u);
  EXPECT_EQ(r.peer_bit_exact_class, kTestBitExactClass);  // from HELLO
  EXPECT_EQ(receiver_->kv_bytes_received_total(), 6144u);
  EXPECT_EQ(receiver_->transfers_in_flight(), 0u);

  std::vector<float> k(8), v(8);
  const std::vector<float> zeros(8, 0.0f);
  for (uint32_t layer = 0; layer < 3; ++layer) {
    for (uint32_t t = 0; t < 37; ++t) {
      kv::ReadKvRows(pool, *blocks, layer, t, 1, k.data(), v.data());
      const void* want_k = t < 5 ? static_cast<const void*>(zeros.data())
                                 : ref.K(layer, t);
      const void* want_v = t < 5 ? static_cast<const void*>(zeros.data())
                                 : ref.V(layer, t);
      ASSERT_EQ(std::memcmp(k.data(), want_k, 32), 0) << layer << " " << t;
      ASSERT_EQ(std::memcmp(v.data(), want_v, 32), 0) << layer << " " << t;
    }
  }
  ids.Free(*blocks);
  EXPECT_EQ(ids.num_in_use(), 0);
}

TEST_F(KvTransferTest, ByteCountsForReferenceShape) {
  // 313 tokens, 5 layers, 4 kv heads, head dim 8, f32, nothing cached:
  // 5 x 313 x 2 x 4 x 8 x 4 = 400,640 payload bytes, in chunks of 128
  // (128, 128, 57) x 5 layers = 15 frames.
  Start(TestLayout(5, 4, 8));
  VectorKvWriter writer(layout_, 313);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-313", 0, 0, 313, &writer, done.Callback()).ok());
  const RefKv ref(layout_, 313, 7);
  auto sender = Connect("req-313", 0);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(SendRange(**sender, ref, 5, 0, 313, 128).ok());
  ASSERT_TRUE((*sender)->SendFinal(OneSample(7, -1.0f, 0)).ok());
  EXPECT_EQ((*sender)->bytes_sent(), 400640u);
  ASSERT_TRUE(done.Wait());
  ASSERT_TRUE(done.status().ok()) << done.status();
  EXPECT_EQ(done.result().kv_bytes, 400640u);
  EXPECT_EQ(done.result().frames, 15u);
  EXPECT_EQ(receiver_->kv_bytes_received_total(), 400640u);
  for (uint32_t layer = 0; layer < 5; ++layer) {
    ASSERT_EQ(std::memcmp(writer.K(layer, 0), ref.K(layer, 0), 313 * 32 * 4), 0);
    ASSERT_EQ(std::memcmp(writer.V(layer, 0), ref.V(layer, 0), 313 * 32 * 4), 0);
  }
}

TEST_F(KvTransferTest, LayoutMismatchIsRefusedOnBothSides) {
  Start(TestLayout(2, 4, 8));
  VectorKvWriter writer(layout_, 10);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-layout", 1, 0, 10, &writer, done.Callback()).ok());
  KvLayout other = TestLayout(2, 4, 16);
  auto sender = KvSender::Connect(Endpoint(), "req-layout", 1, other,
                                  kTestBitExactClass, kSenderTimeoutMs);
  ASSERT_FALSE(sender.ok());
  EXPECT_EQ(sender.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(sender.status().message().find("'head_dim': local 8, remote 16"),
            std::string::npos) << sender.status();
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(done.status().message().find("head_dim"), std::string::npos);
  EXPECT_EQ(receiver_->transfers_in_flight(), 0u);
}

TEST_F(KvTransferTest, StalledSenderTimesOutAndBlocksCanBeFreed) {
  Start(TestLayout(2, 2, 4), /*handshake_ms=*/2000, /*transfer_ms=*/300);
  kv::CpuKvStorage pool(kv::KvShape{2, 2, 4, 4}, 16);
  kv::BlockPool ids(16);
  auto blocks = ids.Allocate(kv::BlocksForTokens(41, 4));
  ASSERT_TRUE(blocks.has_value());
  EXPECT_EQ(ids.num_in_use(), 11);
  StorageWriter writer(&pool, *blocks);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-stall", 1, 0, 40, &writer,
                                done.Callback()).ok());
  const RefKv ref(layout_, 40, 99);
  auto sender = Connect("req-stall", 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(SendRange(**sender, ref, 2, 0, 8, 8).ok());  // 2 frames, then silence
  const auto sent_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(done.Wait(300ms + 2s));
  EXPECT_LT(std::chrono::steady_clock::now() - sent_at, 300ms + 2s);
  EXPECT_EQ(done.status().code(), absl::StatusCode::kDeadlineExceeded);
  // Names the silence, that not even a KEEPALIVE came, and the config key.
  EXPECT_TRUE(absl::StartsWith(done.status().message(),
                               "KV transfer for request req-stall stalled for 300 ms: no byte "
                               "(not even a KEEPALIVE) from the prefill worker at 127.0.0.1:"))
      << done.status();
  EXPECT_TRUE(absl::EndsWith(done.status().message(), "(kv.transfer_timeout_ms)"))
      << done.status();
  // QUIESCED: nothing writes any more, so D frees the reservation.
  ids.Free(writer.block_table());
  EXPECT_EQ(ids.num_in_use(), 0);
  EXPECT_EQ(receiver_->transfers_in_flight(), 0u);
  EXPECT_EQ(receiver_->kv_bytes_received_total(), 2u * 8 * 2 * 8 * 4);
  // The sender learns it too.
  EXPECT_FALSE(SendUntilError(**sender, ref).ok());
}

TEST_F(KvTransferTest, SlowButSteadyFrameIsNotAStall) {
  // transfer_timeout bounds silence, not a whole message: one frame sent in
  // 8 pieces 100 ms apart (800 ms in all) with a 500 ms timeout arrives.
  Start(TestLayout(1, 1, 4), /*handshake_ms=*/2000, /*transfer_ms=*/500);
  VectorKvWriter writer(layout_, 4);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-slow", 1, 0, 4, &writer, done.Callback()).ok());
  auto peer = testing::RawPeer::Connect(receiver_->port());
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto verdict = peer->Hello("req-slow", 1, layout_);
  ASSERT_TRUE(verdict.ok() && verdict->code == absl::StatusCode::kOk);
  const RefKv ref(layout_, 4, 21);
  auto frame = wire::EncodeFrame({"req-slow", 1, 0, 0, 4}, ref.K(0, 0),
                                 ref.V(0, 0), 64);  // 4 tokens x 4 x 4 bytes
  ASSERT_TRUE(frame.ok());
  const size_t piece = (frame->size() + 7) / 8;
  for (size_t at = 0; at < frame->size(); at += piece) {
    ASSERT_TRUE(peer->Send(frame->substr(at, piece)).ok());
    std::this_thread::sleep_for(100ms);
  }
  TransferResult totals;
  totals.samples = OneSample(11);
  totals.frames = 1;
  totals.kv_bytes = 128;  // 4 tokens x 2 x 4 dims x 4 bytes
  ASSERT_TRUE(peer->Send(wire::EncodeFinal(totals)).ok());
  ASSERT_TRUE(done.Wait());
  EXPECT_TRUE(done.status().ok()) << done.status();
  EXPECT_TRUE(SameSamples(done.result().samples, OneSample(11)));
  EXPECT_EQ(std::memcmp(writer.K(0, 0), ref.K(0, 0), 64), 0);
}

TEST_F(KvTransferTest, HandshakeTimesOutWithoutSender) {
  Start(TestLayout(2, 2, 4), /*handshake_ms=*/300, /*transfer_ms=*/2000);
  VectorKvWriter writer(layout_, 10);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-nobody", 3, 0, 10, &writer, done.Callback()).ok());
  ASSERT_TRUE(done.Wait(300ms + 2s));
  EXPECT_EQ(done.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(done.status().message().find("req-nobody"), std::string::npos);
  EXPECT_EQ(receiver_->transfers_in_flight(), 0u);
  EXPECT_EQ(writer.writes_started(), 0);
}

TEST_F(KvTransferTest, CancelDuringTransferEndsOnceAndSenderSeesError) {
  Start(TestLayout(2, 2, 4));
  VectorKvWriter writer(layout_, 64);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-cancel", 1, 0, 64, &writer, done.Callback()).ok());
  const RefKv ref(layout_, 64, 5);
  auto sender = Connect("req-cancel", 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(SendRange(**sender, ref, 2, 0, 16, 8).ok());
  receiver_->Cancel("req-cancel");
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kCancelled);
  absl::Status st = SendUntilError(**sender, ref);
  EXPECT_FALSE(st.ok());
  receiver_->Cancel("req-cancel");  // unknown now: no-op
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(done.calls(), 1);
  EXPECT_EQ(receiver_->transfers_in_flight(), 0u);
}

TEST_F(KvTransferTest, CancelWaitsForWriteInFlight) {
  Start(TestLayout(1, 1, 4));
  VectorKvWriter writer(layout_, 8);
  DoneRecorder done;
  int finished_at_done = -1;
  ASSERT_TRUE(receiver_->Expect("req-gate", 1, 0, 8, &writer, done.Callback([&] {
    finished_at_done = writer.writes_finished();
  })).ok());
  writer.ArmGate();
  const RefKv ref(layout_, 8, 3);
  auto sender = Connect("req-gate", 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE((*sender)->SendFrame(0, 0, 4, ref.K(0, 0), ref.V(0, 0)).ok());
  ASSERT_TRUE(writer.WaitBlocked(3s));
  receiver_->Cancel("req-gate");  // ABORTING while WriteRows runs
  EXPECT_FALSE(done.Wait(100ms));
  EXPECT_EQ(receiver_->transfers_in_flight(), 1u);
  writer.Release();
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(finished_at_done, 1);  // the write had returned before done ran
  EXPECT_EQ(writer.writes_started(), 1);
  EXPECT_EQ(done.calls(), 1);
}

TEST_F(KvTransferTest, NewerAttemptReplacesOlderAndOlderIsRejected) {
  // 2 layers x 8 tokens: attempt 2 sends everything, 2 frames, 2 x 8 x 2 x 8
  // x 4 = 1,024 bytes; attempt 1's partial frame is discarded.
  Start(TestLayout(2, 2, 4));
  VectorKvWriter writer(layout_, 8);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-retry", 1, 0, 8, &writer, done.Callback()).ok());
  const RefKv stale(layout_, 8, 1);
  const RefKv fresh(layout_, 8, 2);
  auto first = Connect("req-retry", 1);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->SendFrame(0, 0, 8, stale.K(0, 0), stale.V(0, 0)).ok());

  auto second = Connect("req-retry", 2);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(SendUntilError(**first, stale).ok());  // closed by D

  auto older = Connect("req-retry", 1);
  ASSERT_FALSE(older.ok());
  EXPECT_EQ(older.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(older.status().message().find("older"), std::string::npos)
      << older.status();

  ASSERT_TRUE(SendRange(**second, fresh, 2, 0, 8, 8).ok());
  ASSERT_TRUE((*second)->SendFinal(OneSample(1)).ok());
  ASSERT_TRUE(done.Wait());
  ASSERT_TRUE(done.status().ok()) << done.status();
  EXPECT_EQ(done.result().frames, 2u);
  EXPECT_EQ(done.result().kv_bytes, 1024u);
  for (uint32_t layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(std::memcmp(writer.K(layer, 0), fresh.K(layer, 0), 8 * 8 * 4), 0);
    EXPECT_EQ(std::memcmp(writer.V(layer, 0), fresh.V(layer, 0), 8 * 8 * 4), 0);
  }
  EXPECT_EQ(done.calls(), 1);
}

TEST_F(KvTransferTest, UnknownRequestIsRejected) {
  Start(TestLayout(2, 2, 4));
  auto sender = Connect("req-unknown", 1);
  ASSERT_FALSE(sender.ok());
  EXPECT_EQ(sender.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(sender.status().message().find("req-unknown"), std::string::npos);
}

TEST_F(KvTransferTest, HelloForFinishedKeyIsRejected) {
  Start(TestLayout(1, 1, 4));
  VectorKvWriter writer(layout_, 4);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-done", 1, 0, 4, &writer, done.Callback()).ok());
  const RefKv ref(layout_, 4, 8);
  auto sender = Connect("req-done", 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(SendRange(**sender, ref, 1, 0, 4, 4).ok());
  ASSERT_TRUE((*sender)->SendFinal(OneSample()).ok());
  ASSERT_TRUE(done.Wait());
  ASSERT_TRUE(done.status().ok()) << done.status();
  auto again = Connect("req-done", 1);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(again.status().message().find("already finished"), std::string::npos)
      << again.status();
}

TEST_F(KvTransferTest, PeerClosingMidTransferIsUnavailable) {
  Start(TestLayout(1, 1, 4));
  VectorKvWriter writer(layout_, 8);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-gone", 1, 0, 8, &writer, done.Callback()).ok());
  const RefKv ref(layout_, 8, 4);
  auto sender = Connect("req-gone", 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(SendRange(**sender, ref, 1, 0, 4, 4).ok());
  sender->reset();
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(KvTransferTest, FinalWithMissingRowsIsDataLoss) {
  Start(TestLayout(2, 1, 4));
  VectorKvWriter writer(layout_, 8);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-short", 1, 2, 8, &writer, done.Callback()).ok());
  const RefKv ref(layout_, 8, 4);
  auto sender = Connect("req-short", 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  // Layer 1 only gets [2, 6) of [2, 8).
  ASSERT_TRUE((*sender)->SendFrame(0, 2, 6, ref.K(0, 2), ref.V(0, 2)).ok());
  ASSERT_TRUE((*sender)->SendFrame(1, 2, 4, ref.K(1, 2), ref.V(1, 2)).ok());
  ASSERT_TRUE((*sender)->SendFinal(OneSample()).ok());
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(done.status().message().find("layer 1 covers 4 of 6"),
            std::string::npos) << done.status();
}

// SendFinal refuses sample lists outside the FINAL's bounds without
// sending anything: the same connection then completes the transfer with
// a FINAL at the bounds (16 samples x 20 top logprobs), which D's `done`
// gets field for field.
TEST_F(KvTransferTest, SendFinalRefusesOutOfBoundsSamplesAndSendsNothing) {
  Start(TestLayout(1, 1, 4));
  VectorKvWriter writer(layout_, 4);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-fin", 1, 0, 4, &writer, done.Callback()).ok());
  const RefKv ref(layout_, 4, 6);
  auto sender = Connect("req-fin", 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(SendRange(**sender, ref, 1, 0, 4, 4).ok());

  EXPECT_EQ((*sender)->SendFinal({}),
            absl::InvalidArgumentError("KvSender::SendFinal: samples: must "
                                       "hold 1 to 16 samples, got 0"));
  EXPECT_EQ((*sender)->SendFinal(RandomSamples(std::vector<uint32_t>(17, 0), 1)),
            absl::InvalidArgumentError("KvSender::SendFinal: samples: must "
                                       "hold 1 to 16 samples, got 17"));
  EXPECT_EQ((*sender)->SendFinal(RandomSamples({0, 20, 21}, 2)),
            absl::InvalidArgumentError("KvSender::SendFinal: "
                                       "samples[2].top_logprobs: at most 20 "
                                       "entries, got 21"));
  // Nothing reached D: the transfer is still open.
  EXPECT_FALSE(done.Wait(100ms));
  EXPECT_EQ(receiver_->transfers_in_flight(), 1u);

  const std::vector<FinalSample> full = RandomSamples(std::vector<uint32_t>(16, 20), 3);
  ASSERT_TRUE((*sender)->SendFinal(full).ok());
  ASSERT_TRUE(done.Wait());
  ASSERT_TRUE(done.status().ok()) << done.status();
  EXPECT_TRUE(SameSamples(done.result().samples, full));
  EXPECT_EQ(done.result().frames, 1u);
  EXPECT_EQ(done.result().kv_bytes, 128u);  // 4 tokens x 2 x 4 dims x 4 bytes
  EXPECT_EQ(done.calls(), 1);
}

TEST_F(KvTransferTest, ExpectTwiceIsAlreadyExists) {
  Start(TestLayout(1, 1, 4));
  VectorKvWriter writer(layout_, 4);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-dup", 1, 0, 4, &writer, done.Callback()).ok());
  EXPECT_EQ(receiver_->Expect("req-dup", 2, 0, 4, &writer, done.Callback()).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(receiver_->transfers_in_flight(), 1u);
  receiver_.reset();  // runs `done` while writer and done still exist
  EXPECT_EQ(done.calls(), 1);
}

TEST_F(KvTransferTest, DestructorCancelsPendingTransfers) {
  Start(TestLayout(1, 1, 4));
  VectorKvWriter writer_a(layout_, 8), writer_b(layout_, 8);
  DoneRecorder done_a, done_b;
  ASSERT_TRUE(receiver_->Expect("req-a", 1, 0, 8, &writer_a, done_a.Callback()).ok());
  ASSERT_TRUE(receiver_->Expect("req-b", 1, 0, 8, &writer_b, done_b.Callback()).ok());
  const RefKv ref(layout_, 8, 4);
  auto sender = Connect("req-a", 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(SendRange(**sender, ref, 1, 0, 4, 4).ok());
  receiver_.reset();  // must not hang; both done before it returns
  EXPECT_EQ(done_a.calls(), 1);
  EXPECT_EQ(done_b.calls(), 1);
  EXPECT_EQ(done_a.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(done_b.status().code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(SendUntilError(**sender, ref).ok());
}

TEST(KvSenderTest, ConnectToClosedPortIsUnavailable) {
  // Bind a listener to get a free port, then close it.
  int port = 0;
  {
    auto fd = tcp::Listen("127.0.0.1", 0, &port);
    ASSERT_TRUE(fd.ok());
  }
  auto s = KvSender::Connect(absl::StrCat("127.0.0.1:", port), "r", 1,
                             TestLayout(1, 1, 4), kTestBitExactClass, 1000);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  auto bad = KvSender::Connect("no-port", "r", 1, TestLayout(1, 1, 4),
                               kTestBitExactClass, 1000);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::kvtransfer
