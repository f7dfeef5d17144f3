// The NCCL data path's watchdog and concurrency rules on the CPU: a
// communicator that never finishes init, an operation that never
// completes (a stopped peer: no error, nothing moves), one communicator
// creation per pair under concurrent OpenTransfers, SendRows never
// blocking. Deadlines are short here; the waits for their effects are
// generous (no timing is asserted).
#include <atomic>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nccl_pair.h"

namespace tandem::kvtransfer::nccl::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kShortMs = 300;

bool IsWatchdogError(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDeadlineExceeded ||
         status.code() == absl::StatusCode::kUnavailable;
}


class NcclWatchdogTest : public NcclPairTest {
 protected:
  void SetUp() override {
    p_kv_.FillRandom(11);
    MakePlanes(kShortMs, kShortMs);
  }
  void Healthy(const TransferKey& key, uint64_t generation) {
    NcclSetup setup = Open(key);
    EXPECT_EQ(setup.generation, generation);
    EXPECT_EQ(setup.unique_id.size(), kNcclUniqueIdBytes);  // a new communicator
    ASSERT_TRUE(OpenD(key).ok());
    DoneRecorder done;
    for (int layer = 0; layer < kLayers; ++layer) {
      auto frame = Send(key, layer, 0, 10);
      ASSERT_TRUE(frame.ok()) << frame.status();
      EXPECT_EQ(frame->comm_seq, static_cast<uint64_t>(layer));  // a new sequence
      receiver().Receive(key, *frame, done.Callback());
    }
    for (const absl::Status& status : done.Wait(kLayers)) EXPECT_TRUE(status.ok()) << status;
    EXPECT_TRUE(SameRows(0, 10));
    EXPECT_TRUE(PollUntilDone(key, absl::OkStatus()).ok());
    receiver().CloseTransfer(key, [] {});
    sender().CloseTransfer(key);
  }
};

TEST_F(NcclWatchdogTest, NcclInitThatNeverCompletesIsAbortedAndReplaced) {
  factory_->set_never_complete_init(true);
  const TransferKey key{"req-init", 1};
  NcclSetup setup = Open(key);
  ASSERT_TRUE(OpenD(key).ok());
  auto frame = Send(key, 0, 0, 4);  // queued; never waits
  ASSERT_TRUE(frame.ok()) << frame.status();
  DoneRecorder done;
  receiver().Receive(key, *frame, done.Callback());
  absl::Status d_status = done.Wait(1)[0];
  EXPECT_EQ(d_status.code(), absl::StatusCode::kDeadlineExceeded) << d_status;
  EXPECT_THAT(std::string(d_status.message()), HasSubstr("init"));
  absl::Status p_status = PollUntilDone(key, absl::UnavailableError("D rejected"));
  EXPECT_EQ(p_status.code(), absl::StatusCode::kDeadlineExceeded) << p_status;
  EXPECT_THAT(std::string(p_status.message()),
              HasSubstr("did not complete within 300 ms"));
  bool quiesced = false;
  receiver().CloseTransfer(key, [&] { quiesced = true; });
  EXPECT_TRUE(WaitFor([&] { return quiesced; }));
  sender().CloseTransfer(key);
  EXPECT_TRUE(WaitFor([&] { return factory_->aborts() >= 2; }));  // both ranks aborted

  factory_->set_never_complete_init(false);
  Healthy(TransferKey{"req-after-init", 1}, setup.generation + 1);
  EXPECT_EQ(factory_->unique_ids_made(), 2);
}

TEST_F(NcclWatchdogTest, NcclStalledOperationIsAbortedAndTheRequestsFail) {
  const TransferKey warm{"req-warm", 1};
  Healthy(warm, 1);
  // The link stops: nothing moves, nobody reports an error.
  factory_->set_stalled(true);
  const TransferKey key{"req-stalled", 1};
  NcclSetup setup = Open(key);
  EXPECT_EQ(setup.generation, 1u);
  ASSERT_TRUE(OpenD(key).ok());
  DoneRecorder done;
  for (int layer = 0; layer < kLayers; ++layer) {
    auto frame = Send(key, layer, 0, 8);
    ASSERT_TRUE(frame.ok()) << frame.status();
    receiver().Receive(key, *frame, done.Callback());
  }
  for (const absl::Status& status : done.Wait(kLayers)) {
    EXPECT_TRUE(IsWatchdogError(status)) << status;
  }
  absl::Status p_status = PollUntilDone(key, absl::OkStatus());
  EXPECT_TRUE(IsWatchdogError(p_status)) << p_status;
  // The transfer's later SendRows fail at once with the same error.
  EXPECT_EQ(Send(key, 0, 8, 2).status().code(), p_status.code());
  bool quiesced = false;
  receiver().CloseTransfer(key, [&] { quiesced = true; });
  EXPECT_TRUE(WaitFor([&] { return quiesced; }));
  sender().CloseTransfer(key);
  {
    absl::MutexLock lock(&log_mu_);
    EXPECT_FALSE(log_.empty());
  }
  // A new generation next time, which works once the link does.
  factory_->set_stalled(false);
  Healthy(TransferKey{"req-after-stall", 1}, 2);
}

TEST_F(NcclWatchdogTest, NcclMissingDescriptorAbortsAfterTheTimeout) {
  const TransferKey key{"req-gap", 1};
  Open(key);
  ASSERT_TRUE(OpenD(key).ok());
  auto first = Send(key, 0, 0, 2);
  auto second = Send(key, 1, 0, 2);
  ASSERT_TRUE(first.ok() && second.ok());
  // D only ever learns comm_seq 1: it must not post it before 0, and
  // gives up after transfer_timeout.
  DoneRecorder done;
  receiver().Receive(key, *second, done.Callback());
  absl::Status status = done.Wait(1)[0];
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("no descriptor for comm_seq 0"));
  auto link = factory_->links().at(0);
  {
    absl::MutexLock lock(&link->mu);
    EXPECT_TRUE(link->recv_sizes.empty());
  }
  // P's sends went out (buffered), so only D knows; its failure reaches P
  // as the transfer's control status (the REJECT), and P drops the
  // communicator too: the next transfer makes generation 2.
  EXPECT_TRUE(IsCommunicatorLost(status)) << status;
  EXPECT_EQ(PollUntilDone(key, status), status);
  receiver().CloseTransfer(key, [] {});
  sender().CloseTransfer(key);
  Healthy(TransferKey{"req-after-gap", 1}, 2);
}

TEST_F(NcclWatchdogTest, NcclDecodeRefusesALostGenerationAndPrefillMovesOn) {
  const TransferKey first{"req-first", 1};
  Healthy(first, 1);
  // D's communicator of generation 1 fails alone: D learns only the
  // second of two descriptors and gives up waiting for the first, while
  // P's sends went out (buffered).
  const TransferKey doomed{"req-doomed", 1};
  Open(doomed);
  ASSERT_TRUE(OpenD(doomed).ok());
  auto lost = Send(doomed, 0, 0, 3);
  auto second = Send(doomed, 1, 0, 3);
  ASSERT_TRUE(lost.ok() && second.ok());
  DoneRecorder done;
  receiver().Receive(doomed, *second, done.Callback());
  EXPECT_TRUE(IsWatchdogError(done.Wait(1)[0]));
  receiver().CloseTransfer(doomed, [] {});
  // Suppose D's message never reached P (a control status without it):
  // P still offers generation 1, and D refuses with the marker P acts on.
  EXPECT_TRUE(PollUntilDone(doomed, absl::UnavailableError("connection reset")).code() ==
              absl::StatusCode::kUnavailable);
  sender().CloseTransfer(doomed);
  const TransferKey refused{"req-refused", 1};
  NcclSetup stale = Open(refused);
  EXPECT_EQ(stale.generation, 1u);
  absl::Status reject = OpenD(refused);
  EXPECT_EQ(reject.code(), absl::StatusCode::kUnavailable) << reject;
  EXPECT_TRUE(IsCommunicatorLost(reject)) << reject;
  EXPECT_EQ(PollUntilDone(refused, reject), reject);
  sender().CloseTransfer(refused);
  Healthy(TransferKey{"req-new-generation", 1}, 2);
}

class NcclSenderTest : public NcclPairTest {};

TEST_F(NcclSenderTest, NcclOneCommunicatorCreationPerPairUnderConcurrentOpens) {
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  std::vector<std::string> setups(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto setup = sender().OpenTransfer(TransferKey{"req-" + std::to_string(i), 1},
                                         TransportPeer{"127.0.0.1:9000", "host", "d-instance"});
      if (setup.ok()) setups[i] = *setup;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(factory_->unique_ids_made(), 1);
  for (const std::string& raw : setups) {
    auto setup = DecodeNcclSetup(raw);
    ASSERT_TRUE(setup.ok()) << setup.status();
    EXPECT_EQ(setup->generation, 1u);
  }
  // Another D instance (a restarted D at the same endpoint) is another pair.
  NcclSetup other = Open(TransferKey{"req-other", 1}, "d-instance-2");
  EXPECT_EQ(other.generation, 1u);
  EXPECT_EQ(factory_->unique_ids_made(), 2);
  for (int i = 0; i < kThreads; ++i) sender().CloseTransfer(TransferKey{"req-" + std::to_string(i), 1});
  sender().CloseTransfer(TransferKey{"req-other", 1});
}

TEST_F(NcclSenderTest, NcclSendRowsNeverBlocksWhileTheCommunicatorIsStalled) {
  factory_->set_stalled(true);
  const TransferKey key{"req-nonblocking", 1};
  Open(key);
  ASSERT_TRUE(OpenD(key).ok());
  std::vector<FrameDescriptor> frames;
  for (int i = 0; i < 40; ++i) {
    auto frame = Send(key, i % kLayers, (i / kLayers) % 19, 1);
    ASSERT_TRUE(frame.ok()) << frame.status();
    EXPECT_EQ(frame->comm_seq, static_cast<uint64_t>(i));
    frames.push_back(*frame);
  }
  // Nothing moved: P still holds its blocks.
  EXPECT_EQ(sender().Poll(key, absl::OkStatus()), std::nullopt);
  DoneRecorder done;
  for (const auto& frame : frames) receiver().Receive(key, frame, done.Callback());
  EXPECT_EQ(sender().Poll(key, absl::OkStatus()), std::nullopt);
  factory_->set_stalled(false);
  for (const absl::Status& status : done.Wait(40)) EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(PollUntilDone(key, absl::OkStatus()).ok());
  receiver().CloseTransfer(key, [] {});
  sender().CloseTransfer(key);
}

}  // namespace
}  // namespace tandem::kvtransfer::nccl::testing
