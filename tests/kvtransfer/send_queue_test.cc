// KvSendQueue over real sockets on 127.0.0.1: a full transfer into a real
// KvReceiver, the per-destination budget against a receiver that never
// reads (while a second destination completes), the silence bound,
// REJECTs, connect failure and cancel.
#include "kvtransfer/send_queue.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/tcp.h"
#include "kvtransfer/wire.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using namespace std::chrono_literals;
using testing::DoneRecorder;
using testing::kTestBitExactClass;
using testing::OneSample;
using testing::RefKv;
using testing::TestLayout;
using testing::VectorKvWriter;
using Id = KvSendQueue::TransferId;

// Counts notify calls; waits for a transfer's result.
class Notifier {
 public:
  KvSendQueue::Notify Callback() {
    return [this] {
      absl::MutexLock lock(&mu_);
      ++calls_;
    };
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // The result, once there (within `timeout`); nullopt otherwise. Waits
  // for notify calls, re-reading the result after each.
  static std::optional<absl::Status> WaitResult(KvSendQueue& q, Id id, Notifier& n,
                                                absl::Duration timeout = absl::Seconds(5)) {
    const absl::Time until = absl::Now() + timeout;
    for (;;) {
      std::optional<absl::Status> r = q.Result(id);
      if (r.has_value() || absl::Now() >= until) return r;
      absl::MutexLock lock(&n.mu_);
      const int seen = n.calls_;
      auto changed = [&n, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(n.mu_) {
        return n.calls_ != seen;
      };
      // A short bound too: the result may have landed before `seen` was read.
      n.mu_.AwaitWithTimeout(absl::Condition(&changed), absl::Milliseconds(20));
    }
  }

 private:
  mutable absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

// A peer that accepts one connection and then, per mode, answers HELLO
// with ACCEPT and never reads again (a stalled decode worker), or never
// answers at all.
class StalledPeer {
 public:
  enum class Mode { kAcceptThenStall, kSilent };
  explicit StalledPeer(Mode mode) {
    int port = 0;
    auto fd = tcp::Listen("127.0.0.1", 0, &port);
    EXPECT_TRUE(fd.ok()) << fd.status();
    listen_ = *std::move(fd);
    port_ = port;
    thread_ = std::thread([this, mode] {
      auto conn = tcp::Accept(listen_.get(), tcp::DeadlineIn(5000));
      if (!conn.ok() || !conn->valid()) return;
      if (mode == Mode::kAcceptThenStall) {
        uint32_t type = 0;
        std::string payload;
        if (tcp::ReadMessage(conn->get(), tcp::DeadlineIn(5000), wire::kMaxControlPayload,
                             &type, &payload)
                .ok()) {
          (void)tcp::SendAll(conn->get(), wire::EncodeAccept(), tcp::DeadlineIn(5000));
        }
      }
      absl::MutexLock lock(&mu_);
      conn_ = *std::move(conn);
      mu_.Await(absl::Condition(&stop_));
    });
  }
  ~StalledPeer() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  tcp::ScopedFd listen_;
  int port_ = 0;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  tcp::ScopedFd conn_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

class KvSendQueueTest : public testing::ReceiverTest {
 protected:
  // Queues 32-token frames of layer 0 to a destination that never reads
  // until the kernel's buffers are full too and the queue stays full:
  // refused 10 times in a row, 5 ms apart (at most 1024 frames). Returns
  // whether it got there.
  static bool FillUntilStuck(KvSendQueue& q, Id id, const RefKv& ref) {
    int refusals = 0;
    for (int i = 0; i < 1024 && refusals < 10; ++i) {
      auto queued = q.EnqueueFrame(id, 0, 0, 32, ref.K(0, 0), ref.V(0, 0));
      if (!queued.ok()) return false;
      if (*queued) {
        refusals = 0;
      } else {
        ++refusals;
        std::this_thread::sleep_for(5ms);
      }
    }
    return refusals == 10;
  }
  static std::unique_ptr<KvSendQueue> NewQueue(uint64_t budget, int timeout_ms = 2000) {
    auto q = KvSendQueue::Start({budget, timeout_ms});
    EXPECT_TRUE(q.ok()) << q.status();
    return q.ok() ? *std::move(q) : nullptr;
  }
  // Opens (id, 1) to `endpoint` with layout_.
  Id Open(KvSendQueue& q, const std::string& endpoint, const std::string& id, Notifier& n) {
    auto t = q.Open(endpoint, id, 1, layout_, kTestBitExactClass, n.Callback());
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : 0;
  }
};

TEST_F(KvSendQueueTest, BadOptionsAreInvalidArgument) {
  auto q = KvSendQueue::Start({0, 1000});
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(q.status().message().find("send_buffer_bytes"), std::string::npos);
  q = KvSendQueue::Start({1024, 0});
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(q.status().message().find("transfer_timeout_ms"), std::string::npos);
}

TEST_F(KvSendQueueTest, FullTransferArrivesAndEndsOk) {
  // 2 layers, kv_dim 2 x 4 = 8 f32: a row is 32 bytes. Prompt 20, D holds
  // 4: two frames per layer ([4, 12), [12, 20)), 2 x 16 x 2 x 32 = 2,048
  // K+V bytes in 4 frames.
  Start(TestLayout(2, 2, 4));
  VectorKvWriter writer(layout_, 20);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("q-full", 1, 4, 20, &writer, done.Callback()).ok());
  auto q = NewQueue(1 << 20);
  ASSERT_NE(q, nullptr);
  Notifier n;
  const Id id = Open(*q, Endpoint(), "q-full", n);
  const RefKv ref(layout_, 20, 77);
  // Bad frames and FINALs are refused with nothing queued.
  EXPECT_EQ(q->EnqueueFrame(id, 2, 4, 1, ref.K(0, 4), ref.V(0, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q->EnqueueFrame(id, 0, 4, 0, ref.K(0, 4), ref.V(0, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q->EnqueueFinal(id, {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q->queued_bytes(Endpoint()), 0u);
  for (uint32_t start : {4u, 12u}) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      auto queued = q->EnqueueFrame(id, layer, start, 8, ref.K(layer, start), ref.V(layer, start));
      ASSERT_TRUE(queued.ok()) << queued.status();
      EXPECT_TRUE(*queued);
    }
  }
  ASSERT_TRUE(q->EnqueueFinal(id, OneSample(42)).ok());
  // A frame after FINAL is refused.
  EXPECT_EQ(q->EnqueueFrame(id, 0, 4, 1, ref.K(0, 4), ref.V(0, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::optional<absl::Status> result = Notifier::WaitResult(*q, id, n);
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->ok()) << *result;
  EXPECT_GE(n.calls(), 1);
  ASSERT_TRUE(done.Wait());
  ASSERT_TRUE(done.status().ok()) << done.status();
  EXPECT_EQ(done.result().frames, 4u);
  EXPECT_EQ(done.result().kv_bytes, 2048u);
  EXPECT_EQ(done.result().samples[0].token, 42);
  for (uint32_t layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(std::memcmp(writer.K(layer, 4), ref.K(layer, 4), 16 * 32), 0);
    EXPECT_EQ(std::memcmp(writer.V(layer, 4), ref.V(layer, 4), 16 * 32), 0);
  }
  EXPECT_EQ(q->queued_bytes(Endpoint()), 0u);
  q->Close(id);
  EXPECT_EQ(q->Result(id)->code(), absl::StatusCode::kNotFound);
}

// Protocol v4: an accepted transfer with nothing to send (the request
// waits its turn on a busy prefill worker) outlives the receiver's silence
// bound several times over, because the queue sends KEEPALIVEs; then its
// frames and FINAL still complete it (issue #32: a busy prefill worker is
// not a failed one).
TEST_F(KvSendQueueTest, KeepalivesHoldAnIdleTransferPastTheSilenceBound) {
  constexpr int kSilenceMs = 200;
  Start(TestLayout(2, 2, 4), /*handshake_ms=*/2000, kSilenceMs);
  VectorKvWriter writer(layout_, 8);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("q-idle", 1, 0, 8, &writer, done.Callback()).ok());
  auto q = NewQueue(1 << 20, kSilenceMs);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(KeepaliveIntervalMs(kSilenceMs), kSilenceMs / 4);
  Notifier n;
  const Id id = Open(*q, Endpoint(), "q-idle", n);
  // Idle for 4 silence bounds: without KEEPALIVEs the receiver would have
  // ended the transfer (DEADLINE_EXCEEDED "stalled") after the first.
  EXPECT_FALSE(done.Wait(std::chrono::milliseconds(4 * kSilenceMs)));
  EXPECT_FALSE(q->Result(id).has_value());
  const RefKv ref(layout_, 8, 3);
  for (uint32_t layer = 0; layer < 2; ++layer) {
    auto queued = q->EnqueueFrame(id, layer, 0, 8, ref.K(layer, 0), ref.V(layer, 0));
    ASSERT_TRUE(queued.ok()) << queued.status();
  }
  ASSERT_TRUE(q->EnqueueFinal(id, OneSample(9)).ok());
  std::optional<absl::Status> result = Notifier::WaitResult(*q, id, n);
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->ok()) << *result;
  ASSERT_TRUE(done.Wait());
  EXPECT_TRUE(done.status().ok()) << done.status();
  EXPECT_EQ(done.result().frames, 2u);
  EXPECT_EQ(std::memcmp(writer.K(1, 0), ref.K(1, 0), 8 * 32), 0);
}

TEST_F(KvSendQueueTest, StalledDestinationFillsItsBudgetWhileAnotherCompletes) {
  // 1 layer, kv_dim 64 x 64 f32 = 16 KiB rows; 32-token frames carry
  // 2 x 32 x 16 KiB = 1 MiB. Budget 4 MiB: the stalled peer takes what the
  // kernel buffers hold, then its queue fills and EnqueueFrame says "not
  // now".
  Start(TestLayout(1, 64, 64));
  const uint64_t budget = 4 << 20;
  auto q = NewQueue(budget);
  ASSERT_NE(q, nullptr);
  StalledPeer stalled(StalledPeer::Mode::kAcceptThenStall);
  Notifier stalled_n;
  const Id slow = Open(*q, stalled.endpoint(), "q-slow", stalled_n);
  const RefKv ref(layout_, 32, 5);
  ASSERT_TRUE(FillUntilStuck(*q, slow, ref));
  EXPECT_LE(q->queued_bytes(stalled.endpoint()), budget);
  // Not an error: the transfer runs on, it just has no room.
  EXPECT_FALSE(q->Result(slow).has_value());
  // kAlways queues past the budget (a step already under way); at or
  // above it HasRoom says false.
  for (int i = 0; i < 64 && q->queued_bytes(stalled.endpoint()) < budget; ++i) {
    auto forced = q->EnqueueFrame(slow, 0, 0, 32, ref.K(0, 0), ref.V(0, 0),
                                  KvSendQueue::Admit::kAlways);
    ASSERT_TRUE(forced.ok());
    EXPECT_TRUE(*forced);
  }
  ASSERT_GE(q->queued_bytes(stalled.endpoint()), budget);
  auto room = q->HasRoom(slow);
  ASSERT_TRUE(room.ok()) << room.status();
  EXPECT_FALSE(*room);

  // Meanwhile a transfer to the real receiver completes.
  VectorKvWriter writer(layout_, 32);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("q-fast", 1, 0, 32, &writer, done.Callback()).ok());
  Notifier fast_n;
  const Id fast = Open(*q, Endpoint(), "q-fast", fast_n);
  auto queued = q->EnqueueFrame(fast, 0, 0, 32, ref.K(0, 0), ref.V(0, 0));
  ASSERT_TRUE(queued.ok());
  EXPECT_TRUE(*queued);
  ASSERT_TRUE(q->EnqueueFinal(fast, OneSample(1)).ok());
  std::optional<absl::Status> fast_result = Notifier::WaitResult(*q, fast, fast_n);
  ASSERT_TRUE(fast_result.has_value());
  EXPECT_TRUE(fast_result->ok()) << *fast_result;
  ASSERT_TRUE(done.Wait());
  EXPECT_TRUE(done.status().ok()) << done.status();
  EXPECT_EQ(done.result().kv_bytes, 1u << 20);
  // The stalled one is still stuck, full.
  EXPECT_FALSE(q->Result(slow).has_value());
  EXPECT_GE(q->queued_bytes(stalled.endpoint()), budget);

  // Cancel: its queued bytes go, the destination has room again.
  q->Close(slow);
  EXPECT_EQ(q->queued_bytes(stalled.endpoint()), 0u);
  EXPECT_EQ(q->HasRoom(slow).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(KvSendQueueTest, NoProgressIsDeadlineExceeded) {
  Start(TestLayout(1, 64, 64));
  auto q = NewQueue(4 << 20, /*timeout_ms=*/300);
  ASSERT_NE(q, nullptr);
  const RefKv ref(layout_, 32, 6);
  {
    // Never answers HELLO.
    StalledPeer silent(StalledPeer::Mode::kSilent);
    Notifier n;
    const Id id = Open(*q, silent.endpoint(), "q-silent", n);
    std::optional<absl::Status> r = Notifier::WaitResult(*q, id, n);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->code(), absl::StatusCode::kDeadlineExceeded) << *r;
    EXPECT_NE(r->message().find("waiting for ACCEPT"), std::string::npos) << *r;
    EXPECT_EQ(n.calls(), 1);
    // Later calls report the failure.
    EXPECT_EQ(q->HasRoom(id).status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(q->EnqueueFrame(id, 0, 0, 1, ref.K(0, 0), ref.V(0, 0)).status().code(),
              absl::StatusCode::kDeadlineExceeded);
  }
  {
    // Accepts, then reads nothing: the writes stop making progress.
    StalledPeer stalled(StalledPeer::Mode::kAcceptThenStall);
    Notifier n;
    const Id id = Open(*q, stalled.endpoint(), "q-stalled", n);
    ASSERT_TRUE(FillUntilStuck(*q, id, ref));
    std::optional<absl::Status> r = Notifier::WaitResult(*q, id, n);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->code(), absl::StatusCode::kDeadlineExceeded) << *r;
    EXPECT_NE(r->message().find("while sending"), std::string::npos) << *r;
    EXPECT_EQ(q->queued_bytes(stalled.endpoint()), 0u);
  }
}

TEST_F(KvSendQueueTest, RejectCarriesCodeAndReason) {
  Start(TestLayout(2, 2, 4));
  auto q = NewQueue(1 << 20);
  ASSERT_NE(q, nullptr);
  // Nothing expected under this id: NOT_FOUND.
  Notifier n1;
  const Id unknown = Open(*q, Endpoint(), "q-nobody", n1);
  std::optional<absl::Status> r = Notifier::WaitResult(*q, unknown, n1);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code(), absl::StatusCode::kNotFound) << *r;
  EXPECT_NE(r->message().find("rejected request q-nobody"), std::string::npos) << *r;
  // Another layout: FAILED_PRECONDITION naming the field.
  VectorKvWriter writer(layout_, 8);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("q-layout", 1, 0, 8, &writer, done.Callback()).ok());
  KvLayout other = layout_;
  other.head_dim = 8;
  Notifier n2;
  auto id = q->Open(Endpoint(), "q-layout", 1, other, kTestBitExactClass, n2.Callback());
  ASSERT_TRUE(id.ok());
  r = Notifier::WaitResult(*q, *id, n2);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code(), absl::StatusCode::kFailedPrecondition) << *r;
  EXPECT_NE(r->message().find("head_dim"), std::string::npos) << *r;
  // "q-layout" is still expected: the receiver ends it (CANCELLED, through
  // done's callback) while `writer` and `done` live, not after this body
  // returned (ASan: a stack-use-after-return in the fixture's teardown).
  receiver_.reset();
}

TEST_F(KvSendQueueTest, CancelMidTransferEndsItOnBothSides) {
  Start(TestLayout(2, 2, 4));
  VectorKvWriter writer(layout_, 20);
  DoneRecorder done;
  ASSERT_TRUE(receiver_->Expect("q-cancel", 1, 0, 20, &writer, done.Callback()).ok());
  auto q = NewQueue(1 << 20);
  ASSERT_NE(q, nullptr);
  Notifier n;
  const Id id = Open(*q, Endpoint(), "q-cancel", n);
  const RefKv ref(layout_, 20, 8);
  ASSERT_TRUE(q->EnqueueFrame(id, 0, 0, 10, ref.K(0, 0), ref.V(0, 0)).ok());
  // Wait until the receiver has the frame, then cancel.
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (receiver_->kv_bytes_received_total() < 2 * 10 * 32 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_EQ(receiver_->kv_bytes_received_total(), 2u * 10 * 32);
  q->Close(id);
  EXPECT_EQ(n.calls(), 0);  // Close does not notify
  ASSERT_TRUE(done.Wait());
  EXPECT_EQ(done.status().code(), absl::StatusCode::kUnavailable) << done.status();
  EXPECT_EQ(q->Result(id)->code(), absl::StatusCode::kNotFound);
}

TEST_F(KvSendQueueTest, NothingListeningIsUnavailableAndBadEndpointInvalid) {
  Start(TestLayout(1, 1, 1));
  const std::string endpoint = Endpoint();
  receiver_.reset();  // the port is closed now
  auto q = NewQueue(1 << 20);
  ASSERT_NE(q, nullptr);
  Notifier n;
  const Id id = Open(*q, endpoint, "q-gone", n);
  std::optional<absl::Status> r = Notifier::WaitResult(*q, id, n);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code(), absl::StatusCode::kUnavailable) << *r;
  EXPECT_EQ(q->Open("no-port", "q-bad", 1, layout_, kTestBitExactClass, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::kvtransfer
