// The KV HELLO's cluster-secret authentication (kvtransfer/hello_auth.h)
// over real sockets on 127.0.0.1: a secured pair transfers; a sender with
// another secret, or none, is refused UNAUTHENTICATED and leaves the
// expected transfer untouched; a replayed HELLO is refused; a receiver
// with another secret, or none, cannot take KV from a secured sender (the
// sender fails before any frame); KvSendQueue (the prefill worker's
// sender) does the same. Plus the wire form of the credential and answer.
#include "kvtransfer/hello_auth.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/send_queue.h"
#include "kvtransfer/wire.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using testing::DoneRecorder;
using testing::kSenderTimeoutMs;
using testing::kTestBitExactClass;
using testing::OneSample;
using testing::RawPeer;
using testing::RefKv;
using testing::SendRange;
using testing::TestLayout;
using testing::VectorKvWriter;

std::unique_ptr<auth::ClusterAuth> Auth(char fill) {
  if (fill == 0) return std::make_unique<auth::ClusterAuth>(auth::ClusterAuth::Options{});
  auth::ClusterAuth::Options o;
  o.secret = std::string(40, fill);
  return std::make_unique<auth::ClusterAuth>(std::move(o));
}

TEST(HelloAuthWireTest, CredentialAndAnswerRoundTrip) {
  auto a = Auth('a');
  wire::Hello h{kKvProtocolVersion, "req", 3, TestLayout(2, 2, 4), "cls", {}, "tcp", ""};
  const std::string plain = wire::EncodeHello(h);
  SignHello(a.get(), &h);
  ASSERT_TRUE(h.auth.has_value());
  const std::string signed_msg = wire::EncodeHello(h);
  // The credential trails the v2 fields: u64 ts, str nonce (32), str sig (64).
  EXPECT_EQ(signed_msg.size(), plain.size() + 8 + 4 + 32 + 4 + 64);
  EXPECT_EQ(wire::HelloSignedBytes(h), plain.substr(wire::kHeaderBytes));
  absl::StatusOr<wire::Hello> back = wire::DecodeHello(signed_msg.substr(wire::kHeaderBytes));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->auth.has_value());
  EXPECT_EQ(back->auth->nonce, h.auth->nonce);
  EXPECT_EQ(back->auth->sig, h.auth->sig);
  EXPECT_TRUE(VerifyHello(a.get(), *back).ok());
  // Any other field changed: bad signature.
  wire::Hello tampered = *back;
  tampered.attempt = 4;
  EXPECT_EQ(VerifyHello(Auth('a').get(), tampered).code(), absl::StatusCode::kUnauthenticated);
  // ACCEPT: empty, or the answer.
  std::string answer = "x";
  EXPECT_TRUE(wire::DecodeAccept(wire::EncodeAccept().substr(wire::kHeaderBytes), &answer).ok());
  EXPECT_EQ(answer, "");
  const std::string proof = AcceptAnswer(a.get(), h);
  EXPECT_EQ(proof.size(), 64u);
  EXPECT_TRUE(
      wire::DecodeAccept(wire::EncodeAccept(proof).substr(wire::kHeaderBytes), &answer).ok());
  EXPECT_EQ(answer, proof);
  EXPECT_TRUE(CheckAcceptAnswer(a.get(), h, answer).ok());
  absl::Status wrong = CheckAcceptAnswer(a.get(), h, AcceptAnswer(Auth('b').get(), h));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(wrong.message(),
            "the KV receiver did not prove the cluster secret (wrong ACCEPT answer: another "
            "cluster secret); no KV sent");
  // Open ends: no credential, no answer, nothing checked.
  wire::Hello open_hello{kKvProtocolVersion, "req", 3, TestLayout(2, 2, 4), "cls", {}, "tcp", ""};
  SignHello(Auth(0).get(), &open_hello);
  EXPECT_FALSE(open_hello.auth.has_value());
  EXPECT_TRUE(VerifyHello(Auth(0).get(), open_hello).ok());
  EXPECT_TRUE(CheckAcceptAnswer(nullptr, open_hello, "").ok());
}

// A receiver with `receiver_auth`, one expected transfer, senders with
// any auth.
class HelloAuthTest : public ::testing::Test {
 protected:
  // The receiver's secret: 40 x `fill`, or none (open) for 0.
  void Start(char fill) {
    receiver_auth_ = Auth(fill);
    KvReceiver::Options o;
    o.host = "127.0.0.1";
    o.auth = receiver_auth_.get();
    o.log = [this](std::string_view line) {
      absl::MutexLock lock(&mu_);
      log_.emplace_back(line);
    };
    auto r = KvReceiver::Start(o, layout_);
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = std::move(*r);
    ASSERT_TRUE(receiver_->Expect("req", 1, 0, kPrompt, &writer_, done_.Callback()).ok());
  }
  std::string Endpoint() const { return absl::StrCat("127.0.0.1:", receiver_->port()); }
  absl::StatusOr<std::unique_ptr<KvSender>> Connect(const auth::ClusterAuth* a) {
    return KvSender::Connect(Endpoint(), "req", 1, layout_, kTestBitExactClass,
                             kSenderTimeoutMs, a);
  }
  // Sends the whole prompt and FINAL; D's done must be OK.
  void ExpectDelivers(KvSender& sender) {
    const RefKv ref(layout_, kPrompt, 7);
    ASSERT_TRUE(SendRange(sender, ref, layout_.n_layers, 0, kPrompt, 4).ok());
    ASSERT_TRUE(sender.SendFinal(OneSample(5)).ok());
    ASSERT_TRUE(done_.Wait());
    EXPECT_TRUE(done_.status().ok()) << done_.status();
  }
  std::vector<std::string> Log() {
    absl::MutexLock lock(&mu_);
    return log_;
  }

  void TearDown() override { receiver_.reset(); }  // its threads log into log_

  static constexpr uint32_t kPrompt = 8;
  const KvLayout layout_ = TestLayout(2, 2, 4);
  VectorKvWriter writer_{layout_, kPrompt};
  DoneRecorder done_;
  absl::Mutex mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<auth::ClusterAuth> receiver_auth_;
  std::unique_ptr<KvReceiver> receiver_;  // last: destroyed first
};

TEST_F(HelloAuthTest, SameSecretTransfers) {
  auto p = Auth('a');
  Start('a');
  auto sender = Connect(p.get());
  ASSERT_TRUE(sender.ok()) << sender.status();
  ExpectDelivers(**sender);
}

TEST_F(HelloAuthTest, SenderWithAnotherSecretOrNoneIsRefusedAndTheTransferLivesOn) {
  auto wrong = Auth('b'), open = Auth(0);
  Start('a');
  absl::StatusOr<std::unique_ptr<KvSender>> bad = Connect(wrong.get());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(bad.status().message(),
            absl::StrCat("KV receiver ", Endpoint(), " rejected request req attempt 1: KV "
                         "receiver rejects request req attempt 1: bad signature (another "
                         "cluster secret, or the message was altered)"));
  absl::StatusOr<std::unique_ptr<KvSender>> none = Connect(open.get());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(none.status().message().find(
                "missing credential (this KV receiver requires the cluster secret)"),
            std::string::npos)
      << none.status();
  // Neither touched the transfer: the right sender still delivers.
  EXPECT_EQ(done_.calls(), 0);
  auto good = Connect(Auth('a').get());
  ASSERT_TRUE(good.ok()) << good.status();
  ExpectDelivers(**good);
  // D logged both refusals, without any signature.
  int refused = 0;
  for (const std::string& line : Log()) {
    if (line.find("UNAUTHENTICATED") != std::string::npos) ++refused;
  }
  EXPECT_EQ(refused, 2);
}

TEST_F(HelloAuthTest, ReplayedHelloIsRefused) {
  auto p = Auth('a');
  Start('a');
  wire::Hello h{kKvProtocolVersion, "req", 1, layout_, kTestBitExactClass, {}, "tcp", ""};
  SignHello(p.get(), &h);
  const std::string bytes = wire::EncodeHello(h);
  auto first = RawPeer::Connect(receiver_->port());
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->Send(bytes).ok());
  uint32_t type = 0;
  std::string payload;
  ASSERT_TRUE(first->Read(&type, &payload).ok());
  ASSERT_EQ(type, static_cast<uint32_t>(wire::MessageType::kAccept));
  std::string answer;
  ASSERT_TRUE(wire::DecodeAccept(payload, &answer).ok());
  EXPECT_TRUE(CheckAcceptAnswer(p.get(), h, answer).ok());
  // The same bytes again (a captured HELLO): refused as a replay.
  auto second = RawPeer::Connect(receiver_->port());
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(second->Send(bytes).ok());
  ASSERT_TRUE(second->Read(&type, &payload).ok());
  ASSERT_EQ(type, static_cast<uint32_t>(wire::MessageType::kReject));
  absl::StatusOr<wire::Reject> r = wire::DecodeReject(payload);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->code, absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r->reason,
            "KV receiver rejects request req attempt 1: replayed nonce: this credential was "
            "already used");
}

TEST_F(HelloAuthTest, ReceiverWithAnotherSecretCannotTakeKv) {
  auto p = Auth('a');
  Start('b');
  absl::StatusOr<std::unique_ptr<KvSender>> sender = Connect(p.get());
  EXPECT_EQ(sender.status().code(), absl::StatusCode::kUnauthenticated) << sender.status();
  EXPECT_EQ(done_.calls(), 0);
}

TEST_F(HelloAuthTest, OpenReceiverCannotTakeKvFromASecuredSender) {
  auto p = Auth('a');
  Start(0);
  absl::StatusOr<std::unique_ptr<KvSender>> sender = Connect(p.get());
  EXPECT_EQ(sender.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(sender.status().message(),
            absl::StrCat("KV handshake with ", Endpoint(), " for request req: the KV receiver "
                         "did not prove the cluster secret (its ACCEPT has no answer: it runs "
                         "without cluster.secret_file); no KV sent"));
}

TEST_F(HelloAuthTest, OpenPairTransfersAsBefore) {
  Start(0);
  auto sender = Connect(nullptr);
  ASSERT_TRUE(sender.ok()) << sender.status();
  ExpectDelivers(**sender);
}

// The prefill worker's sender: the same checks on its poll loop.
TEST_F(HelloAuthTest, SendQueueAuthenticatesBothWays) {
  Start('a');
  for (char fill : {'b', 'a'}) {
    auto p = Auth(fill);
    KvSendQueue::Options qo;
    qo.auth = p.get();
    auto queue = KvSendQueue::Start(qo);
    ASSERT_TRUE(queue.ok()) << queue.status();
    absl::Mutex mu;
    bool notified = false;
    auto id = (*queue)->Open(Endpoint(), "req", 1, layout_, kTestBitExactClass, [&] {
      absl::MutexLock lock(&mu);
      notified = true;
    });
    ASSERT_TRUE(id.ok()) << id.status();
    if (fill == 'a') {
      const RefKv ref(layout_, kPrompt, 7);
      for (uint32_t layer = 0; layer < layout_.n_layers; ++layer) {
        ASSERT_TRUE((*queue)
                        ->EnqueueFrame(*id, layer, 0, kPrompt, ref.K(layer, 0), ref.V(layer, 0),
                                       KvSendQueue::Admit::kAlways)
                        .value_or(false));
      }
      ASSERT_TRUE((*queue)->EnqueueFinal(*id, OneSample(5)).ok());
    }
    {
      absl::MutexLock lock(&mu);
      ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&notified), absl::Seconds(5)));
    }
    std::optional<absl::Status> result = (*queue)->Result(*id);
    ASSERT_TRUE(result.has_value());
    if (fill == 'b') {
      EXPECT_EQ(result->code(), absl::StatusCode::kUnauthenticated) << *result;
      EXPECT_EQ(done_.calls(), 0);
    } else {
      EXPECT_TRUE(result->ok()) << *result;
      ASSERT_TRUE(done_.Wait());
      EXPECT_TRUE(done_.status().ok()) << done_.status();
    }
  }
}

}  // namespace
}  // namespace tandem::kvtransfer
