// Malformed input over a raw socket (frames built with the wire encoder):
// every bad frame or byte stream ends the transfer with DATA_LOSS naming
// the check, the peer gets REJECT(DATA_LOSS), and the receiver keeps
// serving other transfers.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/wire.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using namespace std::chrono_literals;
using testing::DoneRecorder;
using testing::kTestBitExactClass;
using testing::RawPeer;
using testing::RefKv;
using testing::SendRange;
using testing::TestLayout;
using testing::VectorKvWriter;

// Transfer "req" attempt 1 expects [4, 12) of a 12-token prompt over 2
// layers with kv_dim 4.
constexpr uint32_t kHit = 4;
constexpr uint32_t kPromptLen = 12;

class KvBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = TestLayout(2, 1, 4);
    KvReceiver::Options o;
    o.handshake_timeout_ms = 2000;
    o.transfer_timeout_ms = 2000;
    auto r = KvReceiver::Start(o, layout_);
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
    writer_ = std::make_unique<VectorKvWriter>(layout_, kPromptLen);
    ASSERT_TRUE(receiver_->Expect("req", 1, kHit, kPromptLen, writer_.get(),
                                  done_.Callback()).ok());
  }

  // Connects a raw peer that has been ACCEPTed for ("req", 1).
  RawPeer Accepted() {
    auto peer = RawPeer::Connect(receiver_->port());
    EXPECT_TRUE(peer.ok()) << peer.status();
    auto verdict = peer->Hello("req", 1, layout_);
    EXPECT_TRUE(verdict.ok() && verdict->code == absl::StatusCode::kOk)
        << (verdict.ok() ? verdict->ToStatus() : verdict.status());
    return std::move(*peer);
  }

  // A FRAME with `floats_each` f32 elements of K and of V (zeros).
  static std::string Frame(const wire::FrameHeader& h, size_t floats_each) {
    std::vector<float> zeros(floats_each, 0.0f);
    auto msg = wire::EncodeFrame(h, zeros.data(), zeros.data(),
                                 floats_each * sizeof(float));
    EXPECT_TRUE(msg.ok());
    return *msg;
  }

  // Sends `bytes` after HELLO; expects done(DATA_LOSS) whose message
  // contains `needle`, a REJECT(DATA_LOSS) to the peer, and no write.
  void ExpectDataLoss(const std::string& bytes, const std::string& needle) {
    RawPeer peer = Accepted();
    ASSERT_TRUE(peer.Send(bytes).ok());
    ASSERT_TRUE(done_.Wait());
    EXPECT_EQ(done_.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(done_.status().message().find(needle), std::string::npos)
        << done_.status();
    auto verdict = peer.ReadVerdict();
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    EXPECT_EQ(verdict->code, absl::StatusCode::kDataLoss);
    EXPECT_EQ(writer_->writes_started(), 0);
    EXPECT_EQ(receiver_->kv_bytes_received_total(), 0u);
    ExpectStillServing();
  }

  // A fresh, well-formed transfer still goes through.
  void ExpectStillServing() {
    VectorKvWriter writer(layout_, 4);
    DoneRecorder done;
    ASSERT_TRUE(receiver_->Expect("req-ok", 1, 0, 4, &writer, done.Callback()).ok());
    const RefKv ref(layout_, 4, 11);
    auto sender = KvSender::Connect(absl::StrCat("127.0.0.1:", receiver_->port()),
                                    "req-ok", 1, layout_, kTestBitExactClass,
                                    2000);
    ASSERT_TRUE(sender.ok()) << sender.status();
    ASSERT_TRUE(SendRange(**sender, ref, 2, 0, 4, 4).ok());
    ASSERT_TRUE((*sender)->SendFinal(testing::OneSample()).ok());
    ASSERT_TRUE(done.Wait());
    EXPECT_TRUE(done.status().ok()) << done.status();
  }

  KvLayout layout_;
  std::unique_ptr<VectorKvWriter> writer_;
  DoneRecorder done_;
  // Declared last, destroyed first: its destructor runs done_ for a
  // transfer still pending, so writer_ and done_ must outlive it.
  std::unique_ptr<KvReceiver> receiver_;
};

TEST_F(KvBadInputTest, TokenStartBeforeHit) {
  ExpectDataLoss(Frame({"req", 1, 0, kHit - 1, 2}, 2 * 4),
                 "token_start 3 < hit_tokens 4");
}

TEST_F(KvBadInputTest, EndPastPromptLength) {
  ExpectDataLoss(Frame({"req", 1, 0, 10, 3}, 3 * 4),
                 "token_start 10 + token_count 3 = 13 > prompt_len 12");
}

TEST_F(KvBadInputTest, LayerOutOfRange) {
  ExpectDataLoss(Frame({"req", 1, 2, kHit, 1}, 4), "layer 2 >= n_layers 2");
}

TEST_F(KvBadInputTest, ZeroTokenCount) {
  ExpectDataLoss(Frame({"req", 1, 0, kHit, 0}, 0), "token_count 0");
}

TEST_F(KvBadInputTest, WrongPayloadSize) {
  // 2 tokens x kv_dim 4 need 2 x 8 floats = 64 bytes; send 2 x 7 floats.
  ExpectDataLoss(Frame({"req", 1, 0, kHit, 2}, 7),
                 "K+V payload is 56 bytes, expected 64 for 2 tokens");
}

TEST_F(KvBadInputTest, FrameForOtherRequestOrAttempt) {
  ExpectDataLoss(Frame({"other", 1, 0, kHit, 1}, 4), "request_id 'other'");
}

TEST_F(KvBadInputTest, FrameWithOtherAttempt) {
  ExpectDataLoss(Frame({"req", 2, 0, kHit, 1}, 4), "attempt 2 != 1");
}

TEST_F(KvBadInputTest, HugeLengthPrefixMidTransfer) {
  std::string header(wire::kHeaderBytes, '\0');
  wire::PutHeader(wire::MessageType::kFrame, 0xfffffff0u, header.data());
  ExpectDataLoss(header, "declares 4294967280 payload bytes");
}

TEST_F(KvBadInputTest, UnexpectedMessageMidTransfer) {
  ExpectDataLoss(wire::EncodeHello({kKvProtocolVersion, "req", 1, layout_,
                                    kTestBitExactClass, {}, "tcp", ""}),
                 "unexpected KV message HELLO");
}

TEST_F(KvBadInputTest, TruncatedFinalPayload) {
  TransferResult final_msg;
  final_msg.samples = testing::OneSample();
  std::string msg = wire::EncodeFinal(final_msg);
  msg.resize(msg.size() - 3);
  wire::PutHeader(wire::MessageType::kFinal,
                  static_cast<uint32_t>(msg.size() - wire::kHeaderBytes),
                  msg.data());
  ExpectDataLoss(msg, "malformed KV FINAL message: field 'kv_bytes'");
}

TEST_F(KvBadInputTest, FinalWithTooManySamples) {
  TransferResult final_msg;
  final_msg.samples = testing::RandomSamples(std::vector<uint32_t>(17, 0), 1);
  ExpectDataLoss(wire::EncodeFinal(final_msg),
                 "field 'n_samples' 17 outside [1, 16]");
}

TEST_F(KvBadInputTest, FinalWithTooManyTopLogprobs) {
  TransferResult final_msg;
  final_msg.samples = testing::RandomSamples({1, 21}, 1);
  ExpectDataLoss(wire::EncodeFinal(final_msg),
                 "field 'samples[1].n_top' 21 outside [0, 20]");
}

TEST_F(KvBadInputTest, FinalTotalsDisagree) {
  TransferResult lie;
  lie.samples = testing::OneSample();
  lie.frames = 5;
  lie.kv_bytes = 123;
  ExpectDataLoss(wire::EncodeFinal(lie), "FINAL reports 5 frames / 123 bytes");
}

// Before HELLO there is no transfer to fail: the peer gets REJECT(DATA_LOSS)
// and the expected transfer is untouched.
TEST_F(KvBadInputTest, GarbageBeforeHello) {
  const std::vector<std::string> inputs = {
      std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),   // length "/ HT" huge
      std::string("\x09\0\0\0\x04\0\0\0abcd", 12),         // unknown type 9
      // v4 HELLO cut inside request_id's length.
      std::string("\x01\0\0\0\x05\0\0\0\x04\0\0\0\x01", 13),
      // v4 HELLO whose request_id length runs past the payload.
      std::string("\x01\0\0\0\x09\0\0\0\x04\0\0\0\xff\xff\xff\xff\x01", 17),
  };
  for (const std::string& bytes : inputs) {
    auto peer = RawPeer::Connect(receiver_->port());
    ASSERT_TRUE(peer.ok()) << peer.status();
    ASSERT_TRUE(peer->Send(bytes).ok());
    auto verdict = peer->ReadVerdict();
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    EXPECT_EQ(verdict->code, absl::StatusCode::kDataLoss)
        << verdict->ToStatus();
  }
  EXPECT_EQ(done_.calls(), 0);
  EXPECT_EQ(receiver_->transfers_in_flight(), 1u);
  ExpectStillServing();
}

}  // namespace
}  // namespace tandem::kvtransfer
