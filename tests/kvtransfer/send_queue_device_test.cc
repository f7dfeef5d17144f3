// KvSendQueue's device transfers (OpenWithTransport, EnqueueDescriptor)
// against a scripted decode worker on 127.0.0.1: what the HELLO and the
// FRAME_DESCs look like on the wire, the FINAL totals, and how the result
// depends on D's ACK (OK only after FINAL; an ACK on a tcp transfer or
// before FINAL, a close without ACK, and no ACK in time are errors). Also
// the refusals of EnqueueDescriptor / OpenWithTransport / EnqueueFrame.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "kvtransfer/send_queue.h"
#include "kvtransfer/tcp.h"
#include "kvtransfer/wire.h"
#include "tests/kvtransfer/fake_data_receiver.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using testing::OneSample;
using testing::TestLayout;
using testing::WaitQueueResult;
using Id = KvSendQueue::TransferId;

// Accepts one connection, reads the HELLO, ACCEPTs, then follows `script`.
class ScriptedReceiver {
 public:
  enum class Script {
    kAckAtOnce,         // ACK right after ACCEPT
    kAckAfterFinal,     // read up to FINAL, then ACK
    kCloseAfterFinal,   // read up to FINAL, then close without a word
    kSilentAfterFinal,  // read up to FINAL, then say nothing (until destroyed)
  };
  explicit ScriptedReceiver(Script script) {
    auto fd = tcp::Listen("127.0.0.1", 0, &port_);
    EXPECT_TRUE(fd.ok()) << fd.status();
    listen_ = *std::move(fd);
    thread_ = std::thread([this, script] { Run(script); });
  }
  ~ScriptedReceiver() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }
  // Every message read (type, payload), HELLO first; complete once the
  // script has acted.
  std::vector<std::pair<uint32_t, std::string>> messages() {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(&acted_));
    return messages_;
  }

 private:
  void Run(Script script) {
    auto conn = tcp::Accept(listen_.get(), tcp::DeadlineIn(5000));
    if (!conn.ok() || !conn->valid()) return;
    auto read = [&](uint32_t* type) {
      std::string payload;
      // KEEPALIVEs (an idle accepted transfer's) are not recorded.
      do {
        if (!tcp::ReadMessage(conn->get(), tcp::DeadlineIn(5000), 1 << 20, type, &payload)
                 .ok()) {
          return false;
        }
      } while (*type == static_cast<uint32_t>(wire::MessageType::kKeepalive));
      absl::MutexLock l(&mu_);
      messages_.emplace_back(*type, std::move(payload));
      return true;
    };
    uint32_t type = 0;
    if (read(&type)) {
      (void)tcp::SendAll(conn->get(), wire::EncodeAccept(), tcp::DeadlineIn(5000));
      if (script != Script::kAckAtOnce) {
        while (read(&type) && type != static_cast<uint32_t>(wire::MessageType::kFinal)) {
        }
      }
      if (script == Script::kAckAtOnce || script == Script::kAckAfterFinal) {
        (void)tcp::SendAll(conn->get(), wire::EncodeAck(), tcp::DeadlineIn(5000));
      }
      if (script == Script::kCloseAfterFinal) conn->Reset();
    }
    absl::MutexLock l(&mu_);
    acted_ = true;
    mu_.Await(absl::Condition(&stop_));
  }

  tcp::ScopedFd listen_;
  int port_ = 0;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool acted_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<uint32_t, std::string>> messages_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

class KvTransportSendQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto q = KvSendQueue::Start({1 << 20, 300});
    ASSERT_TRUE(q.ok()) << q.status();
    queue_ = *std::move(q);
  }
  Id Open(const std::string& endpoint, KvTransport transport, const std::string& setup = "") {
    auto id = queue_->OpenWithTransport(endpoint, "r1", 1, layout_, "cls", transport, setup,
                                        nullptr);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }
  const KvLayout layout_ = TestLayout(2, 2, 4);
  std::unique_ptr<KvSendQueue> queue_;
};

TEST_F(KvTransportSendQueueTest, DeviceTransferSucceedsOnAckAfterFinal) {
  ScriptedReceiver d(ScriptedReceiver::Script::kAckAfterFinal);
  const Id id = Open(d.endpoint(), KvTransport::kCudaIpc, "pool-handles");
  ASSERT_TRUE(queue_->EnqueueDescriptor(id, {"r1", 1, 0, 0, 3, 0, "blk"}).ok());
  ASSERT_TRUE(queue_->EnqueueDescriptor(id, {"r1", 1, 1, 0, 3, 1, ""}).ok());
  ASSERT_TRUE(queue_->EnqueueFinal(id, OneSample(9)).ok());
  std::optional<absl::Status> result = WaitQueueResult(*queue_, id);
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->ok()) << *result;
  auto msgs = d.messages();
  ASSERT_EQ(msgs.size(), 4u);
  absl::StatusOr<wire::Hello> hello = wire::DecodeHello(msgs[0].second);
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(hello->transport, "cuda_ipc");
  EXPECT_EQ(hello->transport_setup, "pool-handles");
  EXPECT_EQ(msgs[1].first, 6u);
  absl::StatusOr<FrameDescriptor> first = wire::DecodeFrameDesc(msgs[1].second);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->locator, "blk");
  EXPECT_EQ(first->token_count, 3u);
  absl::StatusOr<TransferResult> final_msg = wire::DecodeFinal(msgs[3].second);
  ASSERT_TRUE(final_msg.ok()) << final_msg.status();
  EXPECT_EQ(final_msg->frames, 2u);
  EXPECT_EQ(final_msg->kv_bytes, 2 * layout_.FrameBytes(3));  // 2 x 96
  EXPECT_EQ(final_msg->samples[0].token, 9);
}

TEST_F(KvTransportSendQueueTest, AckOnTcpTransferIsDataLoss) {
  ScriptedReceiver d(ScriptedReceiver::Script::kAckAtOnce);
  const Id id = Open(d.endpoint(), KvTransport::kTcp);
  std::optional<absl::Status> result = WaitQueueResult(*queue_, id);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(*result, absl::DataLossError(absl::StrCat(
                         "KV transfer of request r1 to ", d.endpoint(),
                         ": unexpected ACK from the receiver while sending (a tcp transfer "
                         "gets no ACK)")));
}

TEST_F(KvTransportSendQueueTest, AckBeforeFinalIsDataLoss) {
  ScriptedReceiver d(ScriptedReceiver::Script::kAckAtOnce);
  const Id id = Open(d.endpoint(), KvTransport::kNccl);
  std::optional<absl::Status> result = WaitQueueResult(*queue_, id);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(*result, absl::DataLossError(absl::StrCat("KV transfer of request r1 to ",
                                                      d.endpoint(),
                                                      ": unexpected ACK from the receiver "
                                                      "while sending")));
}

TEST_F(KvTransportSendQueueTest, CloseAfterFinalWithoutAckIsUnavailable) {
  ScriptedReceiver d(ScriptedReceiver::Script::kCloseAfterFinal);
  const Id id = Open(d.endpoint(), KvTransport::kNccl);
  ASSERT_TRUE(queue_->EnqueueDescriptor(id, {"r1", 1, 0, 0, 3, 0, ""}).ok());
  ASSERT_TRUE(queue_->EnqueueFinal(id, OneSample()).ok());
  std::optional<absl::Status> result = WaitQueueResult(*queue_, id);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(*result, absl::UnavailableError(absl::StrCat(
                         "KV transfer of request r1 to ", d.endpoint(),
                         ": KV receiver closed the connection while waiting for ACK")));
}

TEST_F(KvTransportSendQueueTest, NoAckInTimeIsDeadlineExceeded) {
  ScriptedReceiver d(ScriptedReceiver::Script::kSilentAfterFinal);
  const Id id = Open(d.endpoint(), KvTransport::kNccl);
  ASSERT_TRUE(queue_->EnqueueFinal(id, OneSample()).ok());
  std::optional<absl::Status> result = WaitQueueResult(*queue_, id);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(*result, absl::DeadlineExceededError(absl::StrCat(
                         "KV transfer of request r1 to ", d.endpoint(),
                         ": no progress for 300 ms while waiting for ACK")));
  EXPECT_EQ(d.messages().size(), 2u);  // HELLO, FINAL
}

TEST_F(KvTransportSendQueueTest, RefusesBadDescriptorsAndSetups) {
  // A long silence bound: the second connection waits in the backlog.
  auto q = KvSendQueue::Start({1 << 20, 20000});
  ASSERT_TRUE(q.ok()) << q.status();
  queue_ = *std::move(q);
  ScriptedReceiver d(ScriptedReceiver::Script::kSilentAfterFinal);
  const Id tcp_id = Open(d.endpoint(), KvTransport::kTcp);
  const Id id = Open(d.endpoint(), KvTransport::kNccl);
  auto refused = [&](Id which, const FrameDescriptor& f, const std::string& why) {
    EXPECT_EQ(queue_->EnqueueDescriptor(which, f),
              absl::InvalidArgumentError(
                  absl::StrCat("KvSendQueue::EnqueueDescriptor: request r1 attempt 1: ", why)));
  };
  refused(tcp_id, {"r1", 1, 0, 0, 1, 0, ""},
          "a tcp transfer takes FRAMEs (EnqueueFrame), not descriptors");
  ASSERT_TRUE(queue_->EnqueueFinal(tcp_id, OneSample()).ok());  // lets `d` finish its script
  refused(id, {"r2", 1, 0, 0, 1, 0, ""}, "descriptor is for request r2 attempt 1");
  refused(id, {"r1", 2, 0, 0, 1, 0, ""}, "descriptor is for request r1 attempt 2");
  refused(id, {"r1", 1, 2, 0, 1, 0, ""}, "layer 2 >= n_layers 2");
  refused(id, {"r1", 1, 0, 0, 0, 0, ""}, "token_count must be > 0");
  refused(id, {"r1", 1, 0, 0, 1, 0, std::string(wire::kMaxLocatorBytes + 1, 'x')},
          "locator of 65537 bytes exceeds the limit of 65536");
  const std::vector<char> rows(2 * layout_.RowBytes(), 0);
  EXPECT_EQ(queue_->EnqueueFrame(id, 0, 0, 1, rows.data(), rows.data()).status(),
            absl::InvalidArgumentError("KvSendQueue::EnqueueFrame: request r1 uses transport "
                                       "nccl; its frames go as EnqueueDescriptor"));
  EXPECT_EQ(queue_->EnqueueDescriptor(12345, {"r1", 1, 0, 0, 1, 0, ""}).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(queue_->EnqueueFinal(id, OneSample()).ok());
  EXPECT_EQ(queue_->EnqueueDescriptor(id, {"r1", 1, 0, 0, 1, 0, ""}),
            absl::InvalidArgumentError(
                "KvSendQueue::EnqueueDescriptor: request r1 already queued its FINAL"));
  EXPECT_EQ(queue_
                ->OpenWithTransport(d.endpoint(), "r3", 1, layout_, "cls", KvTransport::kNccl,
                                    std::string(wire::kMaxTransportSetupBytes + 1, 's'), nullptr)
                .status(),
            absl::InvalidArgumentError("KvSendQueue::OpenWithTransport: transport_setup of "
                                       "16385 bytes exceeds the limit of 16384"));
}

}  // namespace
}  // namespace tandem::kvtransfer
