// The NCCL data path end to end on the CPU: P's sender and D's receiver
// over a fake in-process communicator pair, host KV on both ends.
#include <algorithm>
#include <cstdlib>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nccl_pair.h"

namespace tandem::kvtransfer::nccl::testing {
namespace {

using ::testing::HasSubstr;

// 4 bytes per f32 element, kv_dim 8: one K or V row is 32 bytes, a frame
// of n tokens 2 * n * 32 bytes (KvLayout::FrameBytes).
constexpr uint64_t kRowBytes = 32;

TEST_F(NcclPairTest, NcclEndToEndBytesIdentical) {
  const TransferKey key{"req-1", 1};
  NcclSetup setup = Open(key);
  EXPECT_EQ(setup.generation, 1u);
  EXPECT_EQ(setup.unique_id.size(), kNcclUniqueIdBytes);
  ASSERT_TRUE(OpenD(key).ok());
  DoneRecorder done;
  std::vector<uint64_t> seqs;
  // Two chunks per layer, chunk-major, as a chunked prefill produces them.
  for (auto [start, count] : {std::pair{0, 7}, std::pair{7, 13}}) {
    for (int layer = 0; layer < kLayers; ++layer) {
      auto frame = Send(key, layer, start, count);
      ASSERT_TRUE(frame.ok()) << frame.status();
      EXPECT_EQ(frame->layer, static_cast<uint32_t>(layer));
      EXPECT_EQ(frame->token_start, static_cast<uint32_t>(start));
      EXPECT_EQ(frame->token_count, static_cast<uint32_t>(count));
      EXPECT_TRUE(frame->locator.empty());
      seqs.push_back(frame->comm_seq);
      receiver().Receive(key, *frame, done.Callback());
    }
  }
  EXPECT_EQ(seqs, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5}));
  for (const absl::Status& status : done.Wait(6)) EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(SameRows(0, 20));
  // D never runs `done` on the caller's (this) thread.
  for (auto id : done.threads()) EXPECT_NE(id, std::this_thread::get_id());
  EXPECT_TRUE(PollUntilDone(key, absl::OkStatus()).ok());
  const uint64_t bytes = kLayers * 2 * 20 * kRowBytes;
  EXPECT_EQ(sender().bytes_total(), bytes);
  EXPECT_EQ(receiver().bytes_total(), bytes);
  bool quiesced = false;
  receiver().CloseTransfer(key, [&] { quiesced = true; });
  EXPECT_TRUE(quiesced);
  sender().CloseTransfer(key);

  // The next transfer of the pair reuses the communicator: same
  // generation, no unique id (it is live), comm_seq goes on.
  const TransferKey next{"req-2", 1};
  NcclSetup again = Open(next);
  EXPECT_EQ(again.generation, 1u);
  EXPECT_TRUE(again.unique_id.empty());
  EXPECT_EQ(again.p_instance, setup.p_instance);
  ASSERT_TRUE(OpenD(next).ok());
  auto frame = Send(next, 2, 3, 5);
  ASSERT_TRUE(frame.ok());
  EXPECT_EQ(frame->comm_seq, 6u);
  DoneRecorder done2;
  receiver().Receive(next, *frame, done2.Callback());
  EXPECT_TRUE(done2.Wait(1)[0].ok());
  EXPECT_EQ(factory_->unique_ids_made(), 1);
  EXPECT_EQ(factory_->links().size(), 1u);
  receiver().CloseTransfer(next, [] {});
  sender().CloseTransfer(next);
}

TEST_F(NcclPairTest, NcclOutOfOrderDescriptorsArePostedInCommSeqOrder) {
  const TransferKey key{"req-ooo", 1};
  Open(key);
  ASSERT_TRUE(OpenD(key).ok());
  // Frames of 1, 2 and 3 tokens: seq 0, 1, 2 with distinct sizes.
  std::vector<FrameDescriptor> frames;
  for (int i = 0; i < 3; ++i) {
    auto frame = Send(key, 0, i * 3, i + 1);
    ASSERT_TRUE(frame.ok());
    frames.push_back(*frame);
  }
  // D learns comm_seq 2, then 0, then 1 (e.g. from connections that raced).
  DoneRecorder done;
  receiver().Receive(key, frames[2], done.Callback());
  receiver().Receive(key, frames[0], done.Callback());
  receiver().Receive(key, frames[1], done.Callback());
  for (const absl::Status& status : done.Wait(3)) EXPECT_TRUE(status.ok()) << status;
  auto link = factory_->links().at(0);
  {
    absl::MutexLock lock(&link->mu);
    EXPECT_EQ(link->recv_sizes,
              (std::vector<uint64_t>{2 * 1 * kRowBytes, 2 * 2 * kRowBytes, 2 * 3 * kRowBytes}));
    EXPECT_TRUE(link->error.empty()) << link->error;
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p_kv_.Rows(p_table_, 0, i * 3, i + 1), d_kv_.Rows(d_table_, 0, i * 3, i + 1));
  }
  receiver().CloseTransfer(key, [] {});
  EXPECT_TRUE(PollUntilDone(key, absl::OkStatus()).ok());
  sender().CloseTransfer(key);
}

TEST_F(NcclPairTest, NcclFramesPostedTogetherGoInOneGroup) {
  const TransferKey key{"req-group", 1};
  Open(key);
  // D has not joined: P's communicator is initializing, its sends queue.
  std::vector<FrameDescriptor> frames;
  for (int layer = 0; layer < kLayers; ++layer) {
    auto frame = Send(key, layer, 0, 4);
    ASSERT_TRUE(frame.ok());
    frames.push_back(*frame);
  }
  EXPECT_EQ(sender().Poll(key, absl::OkStatus()), std::nullopt);
  ASSERT_TRUE(OpenD(key).ok());
  DoneRecorder done;
  for (const auto& frame : frames) receiver().Receive(key, frame, done.Callback());
  for (const absl::Status& status : done.Wait(3)) EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(PollUntilDone(key, absl::OkStatus()).ok());
  auto link = factory_->links().at(0);
  {
    absl::MutexLock lock(&link->mu);
    EXPECT_EQ(link->group_sizes[0], std::vector<int>{3});
  }
  EXPECT_TRUE(SameRows(0, 4));
  receiver().CloseTransfer(key, [] {});
  sender().CloseTransfer(key);
}

TEST_F(NcclPairTest, NcclCancelledTransferMidStreamKeepsTheChannelInStep) {
  const TransferKey cancelled{"req-cancel", 1};
  NcclSetup setup = Open(cancelled);
  ASSERT_TRUE(OpenD(cancelled).ok());
  // Warm the communicator up (both ranks joined), then hold D's posting:
  // after GroupEnd D's communicator stays "in progress", so the frames of
  // the cancelled transfer are not yet scattered when it is closed.
  std::shared_ptr<FakeLink> link;
  ASSERT_TRUE(WaitFor([&] {
    link = factory_->link(setup.unique_id);
    if (link == nullptr) return false;
    absl::MutexLock lock(&link->mu);
    return link->joined[0] && link->joined[1];
  }));
  {
    absl::MutexLock lock(&link->mu);
    link->hold_posting[1] = true;
  }
  DoneRecorder done;
  for (int layer = 0; layer < 2; ++layer) {
    auto frame = Send(cancelled, layer, 0, 6);
    ASSERT_TRUE(frame.ok());
    receiver().Receive(cancelled, *frame, done.Callback());
  }
  // D posted at least its first group (then waits on the held state).
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock lock(&link->mu);
    return !link->recv_sizes.empty();
  }));
  bool quiesced = false;
  receiver().CloseTransfer(cancelled, [&] { quiesced = true; });
  for (const absl::Status& status : done.Wait(2)) {
    EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  }
  EXPECT_TRUE(quiesced);  // nothing was scattered into the target
  {
    absl::MutexLock lock(&link->mu);
    link->hold_posting[1] = false;
  }
  // A frame P announced before it learned of the cancel still arrives.
  auto late = Send(cancelled, 2, 0, 6);
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->comm_seq, 2u);
  DoneRecorder late_done;
  receiver().Receive(cancelled, *late, late_done.Callback());
  EXPECT_EQ(late_done.Wait(1)[0].code(), absl::StatusCode::kCancelled);
  // The cancelled frames were still received (into the discard buffer):
  // P's sends complete, and D's blocks were not written.
  EXPECT_EQ(PollUntilDone(cancelled, absl::CancelledError("D cancelled")).code(),
            absl::StatusCode::kCancelled);
  sender().CloseTransfer(cancelled);
  EXPECT_EQ(d_kv_.Rows(d_table_, 0, 0, 6), std::string(2 * 6 * kRowBytes, '\0'));
  EXPECT_EQ(d_kv_.Rows(d_table_, 1, 0, 6), std::string(2 * 6 * kRowBytes, '\0'));
  EXPECT_EQ(d_kv_.Rows(d_table_, 2, 0, 6), std::string(2 * 6 * kRowBytes, '\0'));

  // The next transfer on the same communicator lands correctly.
  const TransferKey next{"req-after-cancel", 1};
  NcclSetup again = Open(next);
  EXPECT_EQ(again.generation, 1u);
  ASSERT_TRUE(OpenD(next).ok());
  DoneRecorder done2;
  for (int layer = 0; layer < kLayers; ++layer) {
    auto frame = Send(next, layer, 2, 9);
    ASSERT_TRUE(frame.ok());
    EXPECT_EQ(frame->comm_seq, static_cast<uint64_t>(3 + layer));
    receiver().Receive(next, *frame, done2.Callback());
  }
  for (const absl::Status& status : done2.Wait(3)) EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(SameRows(2, 9));
  EXPECT_TRUE(PollUntilDone(next, absl::OkStatus()).ok());
  {
    absl::MutexLock lock(&link->mu);
    EXPECT_TRUE(link->error.empty()) << link->error;
  }
  receiver().CloseTransfer(next, [] {});
  sender().CloseTransfer(next);
}

TEST_F(NcclPairTest, NcclBadInputIsRefusedByName) {
  const TransferKey key{"req-bad", 1};
  // P: a peer without an instance id; a range outside the pool; no
  // transfer.
  auto no_peer = sender().OpenTransfer(key, TransportPeer{"127.0.0.1:9000", "host", ""});
  EXPECT_EQ(no_peer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(no_peer.status().message()), HasSubstr("instance_id"));
  EXPECT_EQ(Send(key, 0, 0, 1).status().code(), absl::StatusCode::kFailedPrecondition);
  Open(key);
  EXPECT_EQ(Send(key, kLayers, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Send(key, 0, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Send(key, 0, 18, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sender().OpenTransfer(key, TransportPeer{"127.0.0.1:9000", "host", "d-instance"})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // D: a malformed setup; a generation it never saw without a unique id;
  // no target; a Receive for a key it does not know (done not inline).
  EXPECT_EQ(receiver().OpenTransfer(key, "garbage", DeviceKvTarget{&d_kv_, d_table_}).code(),
            absl::StatusCode::kFailedPrecondition);
  NcclSetup unknown{7, "some-p", ""};
  absl::Status refused =
      receiver().OpenTransfer(key, EncodeNcclSetup(unknown), DeviceKvTarget{&d_kv_, d_table_});
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("generation 7"));
  EXPECT_EQ(receiver().OpenTransfer(key, raw_setup_, DeviceKvTarget{nullptr, {}}).code(),
            absl::StatusCode::kFailedPrecondition);
  DoneRecorder done;
  receiver().Receive(TransferKey{"nobody", 1}, FrameDescriptor{"nobody", 1, 0, 0, 1, 0, ""},
                     done.Callback());
  EXPECT_EQ(done.Wait(1)[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(done.threads()[0], std::this_thread::get_id());
  // The options are checked by name.
  NcclDataPlaneOptions bad;
  bad.transfer_timeout_ms = 0;
  auto plane = NcclDataPlane::CreateForTesting(bad, factory_, device_);
  EXPECT_EQ(plane.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plane.status().message()), HasSubstr("transfer_timeout_ms"));
  sender().CloseTransfer(key);
}

TEST(NcclSetupTest, NcclSetupRoundTripsAndRefusesMalformedBytes) {
  NcclSetup setup{3, "p-instance", std::string(kNcclUniqueIdBytes, 'x')};
  auto decoded = DecodeNcclSetup(EncodeNcclSetup(setup));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->generation, 3u);
  EXPECT_EQ(decoded->p_instance, "p-instance");
  EXPECT_EQ(decoded->unique_id, setup.unique_id);
  const std::string good = EncodeNcclSetup(setup);
  EXPECT_THAT(std::string(DecodeNcclSetup(good.substr(0, good.size() - 1)).status().message()),
              HasSubstr("unique_id"));
  EXPECT_THAT(std::string(DecodeNcclSetup(good + "z").status().message()), HasSubstr("trailing"));
  EXPECT_THAT(std::string(DecodeNcclSetup("XXXX").status().message()), HasSubstr("magic"));
  EXPECT_THAT(std::string(DecodeNcclSetup(EncodeNcclSetup({0, "p", ""})).status().message()),
              HasSubstr("generation 0"));
  EXPECT_THAT(std::string(DecodeNcclSetup(EncodeNcclSetup({1, "", ""})).status().message()),
              HasSubstr("p_instance"));
  EXPECT_THAT(std::string(DecodeNcclSetup(EncodeNcclSetup({1, "p", "short"})).status().message()),
              HasSubstr("unique_id"));
}

TEST(NcclEnvironmentTest, NcclSocketIfnameFromOptionsUnlessTheEnvironmentSetsIt) {
  unsetenv("NCCL_SOCKET_IFNAME");
  NcclDataPlaneOptions options;
  auto line = ApplyNcclEnvironment(options);
  ASSERT_TRUE(line.ok());
  EXPECT_EQ(std::getenv("NCCL_SOCKET_IFNAME"), nullptr);  // "" keeps NCCL's default
  options.socket_ifname = "eth7";
  line = ApplyNcclEnvironment(options);
  ASSERT_TRUE(line.ok());
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "eth7");
  EXPECT_THAT(*line, HasSubstr("NCCL_SOCKET_IFNAME=eth7"));
  // An explicit environment (tandem up's one-GPU test mode: lo) wins.
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  line = ApplyNcclEnvironment(options);
  ASSERT_TRUE(line.ok());
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "lo");
  EXPECT_THAT(*line, HasSubstr("wins over 'eth7'"));
  unsetenv("NCCL_SOCKET_IFNAME");
  options.init_timeout_ms = -1;
  EXPECT_THAT(std::string(ApplyNcclEnvironment(options).status().message()),
              HasSubstr("init_timeout_ms"));
}

TEST(NcclCreateTest, NcclCreateNeedsNcclAndAGpu) {
  NcclDataPlaneOptions options;
  auto plane = NcclDataPlane::Create(options);
  if (!NcclDataPlaneAvailable()) {
    EXPECT_EQ(plane.status().code(), absl::StatusCode::kUnimplemented);
    return;
  }
  if (!plane.ok()) GTEST_SKIP() << "no CUDA GPU: " << plane.status();
  EXPECT_NE((*plane)->sender(), nullptr);
  EXPECT_NE((*plane)->receiver(), nullptr);
}

}  // namespace
}  // namespace tandem::kvtransfer::nccl::testing
