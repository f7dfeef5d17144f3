// P's side alone (CudaIpcSender) with a test clock: descriptors, locators,
// the export cache and Poll's wait after a failure.
#include "kvtransfer/cuda_ipc/ipc_sender.h"

#include <memory>

#include "gtest/gtest.h"
#include "kvtransfer/cuda_ipc/ipc_codec.h"
#include "tests/kvtransfer/cuda_ipc/host_ipc.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

using testing::HostIpcApi;
using testing::HostIpcRegistry;
using testing::HostKv;

class CudaIpcSenderTest : public ::testing::Test {
 protected:
  CudaIpcSenderTest()
      : registry_(std::make_shared<HostIpcRegistry>()),
        kv_(/*n_layers=*/2, /*layer_blocks=*/32, /*block_size=*/4, /*kv_dim=*/8) {
    CudaIpcSender::Options o;
    o.kv = &kv_;
    o.api = std::make_shared<HostIpcApi>(registry_, "host-a", "p-inst", 77);
    o.transfer_timeout_ms = 1000;
    o.now = [this] { return now_; };
    sender_ = std::make_unique<CudaIpcSender>(std::move(o));
  }

  std::shared_ptr<HostIpcRegistry> registry_;
  HostKv kv_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<CudaIpcSender> sender_;
  const TransferKey key_{"req-1", 1};
  const TransportPeer peer_{"127.0.0.1:9000", "host-a", "d-inst"};
};

TEST_F(CudaIpcSenderTest, DescriptorNamesTheBlocksOfTheRange) {
  absl::StatusOr<std::string> setup = sender_->OpenTransfer(key_, peer_);
  ASSERT_TRUE(setup.ok()) << setup.status();
  absl::StatusOr<IpcSetup> s = DecodeSetup(*setup);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->host_id, "host-a");
  EXPECT_EQ(s->instance_id, "p-inst");
  EXPECT_EQ(s->pid, 77);
  EXPECT_EQ(s->block_size, 4);
  EXPECT_EQ(s->layer_blocks, 32);
  EXPECT_EQ(s->pool_bytes, 2u * 32 * 4 * 8 * 4);
  EXPECT_EQ(s->event_handles.size(), 2u);
  EXPECT_FALSE(s->event_handles[1].empty());

  const std::vector<int32_t> table = {9, 3, 30, 5, 17};
  // Tokens [6, 15): table indices 1 .. 3 (block size 4).
  absl::StatusOr<FrameDescriptor> d = sender_->SendRows(key_, kv_, table, 1, 6, 9);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->request_id, "req-1");
  EXPECT_EQ(d->attempt, 1u);
  EXPECT_EQ(d->layer, 1u);
  EXPECT_EQ(d->token_start, 6u);
  EXPECT_EQ(d->token_count, 9u);
  EXPECT_EQ(d->comm_seq, 0u);
  absl::StatusOr<IpcLocator> loc = DecodeLocator(d->locator);
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->first_block, 1u);
  EXPECT_EQ(loc->blocks, (std::vector<int32_t>{3, 30, 5}));
  EXPECT_EQ(loc->event_handle, "");  // the setup has it
  absl::StatusOr<FrameDescriptor> d2 = sender_->SendRows(key_, kv_, table, 0, 16, 4);
  ASSERT_TRUE(d2.ok()) << d2.status();
  EXPECT_EQ(d2->comm_seq, 1u);
  EXPECT_EQ(DecodeLocator(d2->locator)->blocks, (std::vector<int32_t>{17}));
  // 2 (K, V) x 13 tokens x 8 x 4 bytes.
  EXPECT_EQ(sender_->bytes_total(), 2u * 13 * 8 * 4);
}

TEST_F(CudaIpcSenderTest, BadRangesAreRefusedNamingTheValue) {
  ASSERT_TRUE(sender_->OpenTransfer(key_, peer_).ok());
  const std::vector<int32_t> table = {1, 2};
  auto refused = [&](int32_t layer, int32_t start, int32_t count) {
    return sender_->SendRows(key_, kv_, table, layer, start, count).status();
  };
  EXPECT_EQ(refused(2, 0, 1).message(), "cuda_ipc SendRows: 'layer' 2 outside [0, 2)");
  EXPECT_EQ(refused(0, 0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused(0, 6, 3).message(),
            "cuda_ipc SendRows: tokens [6, 9) need 3 blocks, 'block_table' has 2");
  const std::vector<int32_t> bad = {1, 32};
  EXPECT_EQ(sender_->SendRows(key_, kv_, bad, 0, 0, 8).status().message(),
            "cuda_ipc SendRows: 'block_table[1]' 32 outside [0, 32)");
  HostKv other(2, 32, 4, 8);
  EXPECT_EQ(sender_->SendRows(key_, other, table, 0, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sender_->SendRows({"nope", 1}, kv_, table, 0, 0, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sender_->bytes_total(), 0u);
}

TEST_F(CudaIpcSenderTest, RefusesAPeerOnAnotherHost) {
  absl::StatusOr<std::string> setup =
      sender_->OpenTransfer(key_, {"10.0.0.2:9000", "host-b", "d-inst"});
  EXPECT_EQ(setup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(setup.status().message(),
            "cuda_ipc needs one host: the decode worker 10.0.0.2:9000 is on host host-b, this "
            "prefill worker on host-a");
}

TEST_F(CudaIpcSenderTest, ExportsPoolsAndEventsOncePerProcess) {
  for (uint32_t attempt = 1; attempt <= 3; ++attempt) {
    ASSERT_TRUE(sender_->OpenTransfer({"req", attempt}, peer_).ok());
  }
  HostIpcRegistry::Counts c = registry_->counts();
  EXPECT_EQ(c.mem_exports, 2);    // K and V
  EXPECT_EQ(c.event_exports, 2);  // one per layer
}

TEST_F(CudaIpcSenderTest, PollAfterAFailureWaitsTheTransferTimeout) {
  ASSERT_TRUE(sender_->OpenTransfer(key_, peer_).ok());
  const std::vector<int32_t> table = {1};
  ASSERT_TRUE(sender_->SendRows(key_, kv_, table, 0, 0, 2).ok());
  const absl::Status failed = absl::UnavailableError("D went away");
  EXPECT_FALSE(sender_->Poll(key_, failed).has_value());
  now_ += absl::Milliseconds(999);
  EXPECT_FALSE(sender_->Poll(key_, failed).has_value());
  now_ += absl::Milliseconds(1);
  std::optional<absl::Status> got = sender_->Poll(key_, failed);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, failed);
  sender_->CloseTransfer(key_);
}

TEST_F(CudaIpcSenderTest, PollIsImmediateAfterAckOrWithoutFrames) {
  ASSERT_TRUE(sender_->OpenTransfer(key_, peer_).ok());
  const absl::Status failed = absl::CancelledError("cancelled");
  std::optional<absl::Status> none = sender_->Poll(key_, failed);  // nothing announced
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(*none, failed);
  const std::vector<int32_t> table = {1};
  ASSERT_TRUE(sender_->SendRows(key_, kv_, table, 0, 0, 2).ok());
  std::optional<absl::Status> ok = sender_->Poll(key_, absl::OkStatus());
  ASSERT_TRUE(ok.has_value());
  EXPECT_TRUE(ok->ok());
  sender_->CloseTransfer(key_);
  std::optional<absl::Status> unknown = sender_->Poll(key_, failed);
  ASSERT_TRUE(unknown.has_value());
  EXPECT_EQ(*unknown, failed);
}

TEST_F(CudaIpcSenderTest, LayerWithoutAnEventAtOpenCarriesItsHandleInTheLocator) {
  HostKv fresh(2, 32, 4, 8, kv::KvDtype::kF32, /*with_events=*/false);
  CudaIpcSender::Options o;
  o.kv = &fresh;
  o.api = std::make_shared<HostIpcApi>(registry_, "host-a", "p2", 78);
  CudaIpcSender sender(std::move(o));
  absl::StatusOr<std::string> setup = sender.OpenTransfer(key_, peer_);
  ASSERT_TRUE(setup.ok()) << setup.status();
  EXPECT_EQ(DecodeSetup(*setup)->event_handles, std::vector<std::string>(2, ""));
  const std::vector<int32_t> table = {1};
  EXPECT_EQ(sender.SendRows(key_, fresh, table, 0, 0, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  fresh.CreateEvents();  // the first Forward
  absl::StatusOr<FrameDescriptor> d = sender.SendRows(key_, fresh, table, 0, 0, 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(registry_->Find(DecodeLocator(d->locator)->event_handle), fresh.layer_event(0));
}

}  // namespace
}  // namespace tandem::kvtransfer::cuda_ipc
