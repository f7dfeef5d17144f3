// Protocol v2 over real sockets on 127.0.0.1 (ephemeral ports): a HELLO
// with another protocol version or an unknown dtype is refused with
// FAILED_PRECONDITION naming the value, a dtype mismatch names both dtypes,
// the bit-exact class is reported but not enforced, and an f16 layout moves
// 2-byte elements byte-exact. Byte counts are worked out in the comments.
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/wire.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using testing::DoneRecorder;
using testing::kTestBitExactClass;
using testing::RefKv;
using testing::SendRange;
using testing::TestLayout;
using testing::VectorKvWriter;

using testing::kSenderTimeoutMs;

using KvProtocolV2Test = testing::ReceiverTest;

// Sends the whole of [0, prompt_len) for `id` with a KvSender of `layout`
// and `cls`, then FINAL; returns the first error.
absl::Status SendAll(const std::string& endpoint, const std::string& id,
                     const KvLayout& layout, const std::string& cls,
                     uint32_t prompt_len, const RefKv& ref) {
  auto sender =
      KvSender::Connect(endpoint, id, 1, layout, cls, kSenderTimeoutMs);
  if (!sender.ok()) return sender.status();
  absl::Status s =
      SendRange(**sender, ref, layout.n_layers, 0, prompt_len, prompt_len);
  if (!s.ok()) return s;
  return (*sender)->SendFinal(testing::OneSample());
}

TEST_F(KvProtocolV2Test, UnknownProtocolVersionIsRejectedAndReceiverKeepsServing) {
  Start(TestLayout(2, 2, 4));
  VectorKvWriter writer(layout_, 6);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-ver", 1, 0, 6, &writer, done.Callback()).ok());
  for (uint32_t version : {1u, 2u, 3u, 7u}) {
    // Otherwise a perfect HELLO for the expected request: the version alone
    // refuses it, and the receiver reads nothing after it.
    wire::Hello hello;
    hello.protocol_version = version;
    hello.request_id = "req-ver";
    hello.attempt = 1;
    hello.layout = layout_;
    hello.bit_exact_class = kTestBitExactClass;
    auto peer = testing::RawPeer::Connect(receiver_->port());
    ASSERT_TRUE(peer.ok()) << peer.status();
    auto verdict = peer->Hello(hello);
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    EXPECT_EQ(verdict->code, absl::StatusCode::kFailedPrecondition)
        << verdict->ToStatus();
    EXPECT_EQ(verdict->reason,
              absl::StrCat("KV protocol version ", version,
                           " is not supported (this worker speaks 4)"));
  }
  {
    // A v1 HELLO, bytes as v1 laid them out (str request_id first): its
    // first u32 is the id's length, 7, refused as version 7.
    std::string v1 = std::string("\x07\0\0\0", 4) + "req-ver" +
                     std::string("\x01\0\0\0", 4);
    std::string msg(wire::kHeaderBytes, '\0');
    wire::PutHeader(wire::MessageType::kHello, static_cast<uint32_t>(v1.size()),
                    msg.data());
    auto peer = testing::RawPeer::Connect(receiver_->port());
    ASSERT_TRUE(peer.ok()) << peer.status();
    ASSERT_TRUE(peer->Send(msg + v1).ok());
    auto verdict = peer->ReadVerdict();
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    EXPECT_EQ(verdict->code, absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(verdict->reason.find("KV protocol version 7 is not supported"),
              std::string::npos) << verdict->reason;
  }
  // Nothing was for a transfer the receiver could name: it is untouched and
  // a v2 sender completes it.
  EXPECT_EQ(done.calls(), 0);
  EXPECT_EQ(receiver_->transfers_in_flight(), 1u);
  const RefKv ref(layout_, 6, 31);
  ASSERT_TRUE(SendAll(Endpoint(), "req-ver", layout_, kTestBitExactClass, 6, ref)
                  .ok());
  ASSERT_TRUE(done.Wait());
  EXPECT_TRUE(done.status().ok()) << done.status();
  EXPECT_EQ(std::memcmp(writer.K(1, 0), ref.K(1, 0), 6 * 8 * 4), 0);
}

TEST_F(KvProtocolV2Test, UnknownDtypeEndsTheExpectedTransfer) {
  Start(TestLayout(2, 2, 4));
  VectorKvWriter writer(layout_, 6);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-dt", 1, 0, 6, &writer, done.Callback()).ok());
  KvLayout odd = layout_;
  odd.dtype = static_cast<KvDtype>(99);
  {
    // Not expected: still refused for the dtype (not NOT_FOUND).
    auto peer = testing::RawPeer::Connect(receiver_->port());
    ASSERT_TRUE(peer.ok()) << peer.status();
    auto verdict = peer->Hello("req-nobody", 1, odd);
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    EXPECT_EQ(verdict->code, absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(verdict->reason.find("unknown KV dtype 99"), std::string::npos)
        << verdict->reason;
  }
  EXPECT_EQ(done.calls(), 0);
  {
    // An older attempt must not end the transfer: refused, nothing ended.
    auto peer = testing::RawPeer::Connect(receiver_->port());
    ASSERT_TRUE(peer.ok()) << peer.status();
    auto verdict = peer->Hello("req-dt", 0, odd);
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    EXPECT_EQ(verdict->code, absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(verdict->reason.find("unknown KV dtype 99"), std::string::npos)
        << verdict->reason;
  }
  EXPECT_EQ(done.calls(), 0);
  EXPECT_EQ(receiver_->transfers_in_flight(), 1u);
  auto peer = testing::RawPeer::Connect(receiver_->port());
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto verdict = peer->Hello("req-dt", 1, odd);
  ASSERT_TRUE(verdict.ok()) << verdict.status();
  EXPECT_EQ(verdict->code, absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(verdict->reason,
            "KV receiver rejects request req-dt attempt 1: unknown KV dtype 99");
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(done.status().message().find("unknown KV dtype 99"),
            std::string::npos) << done.status();
  EXPECT_EQ(receiver_->transfers_in_flight(), 0u);
  EXPECT_EQ(writer.writes_started(), 0);
}

TEST_F(KvProtocolV2Test, DtypeMismatchIsRefusedNamingBoth) {
  Start(TestLayout(2, 2, 4));  // f32
  VectorKvWriter writer(layout_, 6);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-f16", 1, 0, 6, &writer, done.Callback()).ok());
  auto sender = KvSender::Connect(Endpoint(), "req-f16", 1,
                                  TestLayout(2, 2, 4, KvDtype::kF16),
                                  kTestBitExactClass, kSenderTimeoutMs);
  ASSERT_FALSE(sender.ok());
  EXPECT_EQ(sender.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(sender.status().message().find(
                "KV layout mismatch in field 'dtype': local f32, remote f16"),
            std::string::npos) << sender.status();
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(done.status().message().find("'dtype': local f32, remote f16"),
            std::string::npos) << done.status();
  EXPECT_EQ(receiver_->transfers_in_flight(), 0u);
}

TEST_F(KvProtocolV2Test, OtherBitExactClassStillTransfers) {
  // The class is reported, not enforced: equal layout ids are enough.
  Start(TestLayout(2, 2, 4));
  VectorKvWriter writer(layout_, 6);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-cls", 1, 0, 6, &writer, done.Callback()).ok());
  const RefKv ref(layout_, 6, 17);
  ASSERT_TRUE(
      SendAll(Endpoint(), "req-cls", layout_, "tandem-cpu/avx2/v2", 6, ref).ok());
  ASSERT_TRUE(done.Wait());
  ASSERT_TRUE(done.status().ok()) << done.status();
  EXPECT_EQ(done.result().peer_bit_exact_class, "tandem-cpu/avx2/v2");
  EXPECT_EQ(done.result().frames, 2u);
  EXPECT_EQ(done.result().kv_bytes, 768u);  // 2 layers x 6 x 2 x 8 x 4
  for (uint32_t layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(std::memcmp(writer.K(layer, 0), ref.K(layer, 0), 6 * 8 * 4), 0);
    EXPECT_EQ(std::memcmp(writer.V(layer, 0), ref.V(layer, 0), 6 * 8 * 4), 0);
  }
}

TEST_F(KvProtocolV2Test, RetryWithOtherClassReportsTheNewerClass) {
  // The class reported is that of the attempt that delivered the KV.
  Start(TestLayout(1, 1, 4));
  VectorKvWriter writer(layout_, 4);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-cls2", 1, 0, 4, &writer, done.Callback()).ok());
  auto first = KvSender::Connect(Endpoint(), "req-cls2", 1, layout_, "class-a",
                                 kSenderTimeoutMs);
  ASSERT_TRUE(first.ok()) << first.status();
  const RefKv ref(layout_, 4, 2);
  auto second = KvSender::Connect(Endpoint(), "req-cls2", 2, layout_, "class-b",
                                  kSenderTimeoutMs);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(SendRange(**second, ref, 1, 0, 4, 4).ok());
  ASSERT_TRUE((*second)->SendFinal(testing::OneSample()).ok());
  ASSERT_TRUE(done.Wait());
  ASSERT_TRUE(done.status().ok()) << done.status();
  EXPECT_EQ(done.result().peer_bit_exact_class, "class-b");
}

TEST_F(KvProtocolV2Test, F16LayoutEndToEndIsByteExact) {
  // 3 layers, kv_dim 2 x 4 = 8, f16: a row is 8 x 2 = 16 bytes. Prompt 21,
  // D holds 3, P sends [3, 21) = 18 tokens in chunks 8, 8, 2: 9 frames,
  // 3 x 18 x 2 x 16 = 1,728 bytes (half of f32's 3,456).
  Start(TestLayout(3, 2, 4, KvDtype::kF16));
  ASSERT_EQ(layout_.RowBytes(), 16u);
  VectorKvWriter writer(layout_, 21);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-f16", 1, 3, 21, &writer, done.Callback()).ok());
  const RefKv ref(layout_, 21, 77);
  auto sender = Connect("req-f16", 1);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ASSERT_TRUE(SendRange(**sender, ref, 3, 3, 21, 8).ok());
  EXPECT_EQ((*sender)->bytes_sent(), 1728u);
  EXPECT_EQ((*sender)->frames_sent(), 9u);
  ASSERT_TRUE((*sender)->SendFinal(testing::OneSample(5, -0.5f, 1)).ok());
  ASSERT_TRUE(done.Wait());
  ASSERT_TRUE(done.status().ok()) << done.status();
  EXPECT_EQ(done.result().kv_bytes, 1728u);
  EXPECT_EQ(done.result().frames, 9u);
  EXPECT_EQ(receiver_->kv_bytes_received_total(), 1728u);
  const std::string zeros(3 * 16, '\0');
  for (uint32_t layer = 0; layer < 3; ++layer) {
    EXPECT_EQ(std::memcmp(writer.K(layer, 0), zeros.data(), 3 * 16), 0);
    EXPECT_EQ(std::memcmp(writer.K(layer, 3), ref.K(layer, 3), 18 * 16), 0)
        << layer;
    EXPECT_EQ(std::memcmp(writer.V(layer, 3), ref.V(layer, 3), 18 * 16), 0)
        << layer;
  }
}

TEST_F(KvProtocolV2Test, F16ReceiverRefusesF32SizedFrame) {
  // One f16 token of kv_dim 4 is 2 x 4 x 2 = 16 K+V bytes; f32's 32 are
  // DATA_LOSS, and so is the maximum frame length checked in f16 terms.
  Start(TestLayout(1, 1, 4, KvDtype::kF16));
  VectorKvWriter writer(layout_, 4);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("req-f16s", 1, 0, 4, &writer, done.Callback()).ok());
  auto peer = testing::RawPeer::Connect(receiver_->port());
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto verdict = peer->Hello("req-f16s", 1, layout_);
  ASSERT_TRUE(verdict.ok() && verdict->code == absl::StatusCode::kOk);
  const std::string k(16, 'k'), v(16, 'v');
  auto frame = wire::EncodeFrame({"req-f16s", 1, 0, 0, 1}, k.data(), v.data(), 16);
  ASSERT_TRUE(frame.ok());
  ASSERT_TRUE(peer->Send(*frame).ok());
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(done.status().message().find(
                "K+V payload is 32 bytes, expected 16 for 1 tokens"),
            std::string::npos) << done.status();
  auto rejected = peer->ReadVerdict();
  ASSERT_TRUE(rejected.ok()) << rejected.status();
  EXPECT_EQ(rejected->code, absl::StatusCode::kDataLoss);
  EXPECT_EQ(writer.writes_started(), 0);
}

TEST(KvReceiverStartTest, LayoutIsValidated) {
  KvReceiver::Options o;
  auto zero = KvReceiver::Start(o, TestLayout(0, 2, 4));
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  KvLayout odd = TestLayout(1, 2, 4);
  odd.dtype = static_cast<KvDtype>(99);
  auto unknown = KvReceiver::Start(o, odd);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("dtype 99"), std::string::npos)
      << unknown.status();
  for (KvDtype d : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16}) {
    auto r = KvReceiver::Start(o, TestLayout(1, 2, 4, d));
    EXPECT_TRUE(r.ok()) << KvDtypeName(d) << ": " << r.status();
  }
}

TEST(KvSenderTest, UnknownDtypeOrHugeHelloIsInvalidArgument) {
  // Checked before connecting: no listener needed.
  KvLayout odd = TestLayout(1, 1, 4);
  odd.dtype = static_cast<KvDtype>(99);
  auto s = KvSender::Connect("127.0.0.1:1", "r", 1, odd, kTestBitExactClass,
                             1000);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  auto huge = KvSender::Connect("127.0.0.1:1", "r", 1, TestLayout(1, 1, 4),
                                std::string(wire::kMaxControlPayload, 'c'),
                                1000);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument)
      << huge.status();
}

}  // namespace
}  // namespace tandem::kvtransfer
