// The cuda_ipc transport_setup and locator layouts (ipc_codec.h).
#include "kvtransfer/cuda_ipc/ipc_codec.h"

#include <string>

#include "gtest/gtest.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

IpcSetup ExampleSetup() {
  IpcSetup s;
  s.host_id = "boot-1";
  s.pid = 4242;
  s.instance_id = "0123abcd";
  s.device_ordinal = 1;
  s.k_handle = std::string(72, 'k');
  s.v_handle = std::string(72, 'v');
  s.pool_bytes = 1ull << 33;
  s.n_layers = 3;
  s.layer_blocks = 1000;
  s.block_size = 16;
  s.kv_dim = 512;
  s.dtype = kv::KvDtype::kF16;
  s.event_handles = {std::string(64, 'a'), "", std::string(64, 'c')};
  return s;
}

TEST(CudaIpcCodecTest, SetupRoundTrips) {
  IpcSetup s = ExampleSetup();
  bool dropped = true;
  std::string bytes = EncodeSetup(s, &dropped);
  EXPECT_FALSE(dropped);
  // version, host, pid, instance, device, 2 handles, pool_bytes, 5 shape
  // fields, n_events, 3 event strings.
  EXPECT_EQ(bytes.size(),
            4 + (4 + 6) + 8 + (4 + 8) + 4 + 2 * (4 + 72) + 8 + 5 * 4 + 4 + (4 + 64) + 4 + (4 + 64));
  absl::StatusOr<IpcSetup> got = DecodeSetup(bytes);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->host_id, "boot-1");
  EXPECT_EQ(got->pid, 4242);
  EXPECT_EQ(got->instance_id, "0123abcd");
  EXPECT_EQ(got->device_ordinal, 1);
  EXPECT_EQ(got->k_handle, s.k_handle);
  EXPECT_EQ(got->v_handle, s.v_handle);
  EXPECT_EQ(got->pool_bytes, 1ull << 33);
  EXPECT_EQ(got->n_layers, 3);
  EXPECT_EQ(got->layer_blocks, 1000);
  EXPECT_EQ(got->block_size, 16);
  EXPECT_EQ(got->kv_dim, 512);
  EXPECT_EQ(got->dtype, kv::KvDtype::kF16);
  EXPECT_EQ(got->event_handles, s.event_handles);
}

TEST(CudaIpcCodecTest, SetupOverSixteenKiBDropsTheEventHandles) {
  IpcSetup s = ExampleSetup();
  s.n_layers = 300;  // 300 x (4 + 64) bytes of handles: over 16 KiB
  s.event_handles.assign(300, std::string(64, 'e'));
  bool dropped = false;
  std::string bytes = EncodeSetup(s, &dropped);
  EXPECT_TRUE(dropped);
  EXPECT_LE(bytes.size(), kMaxSetupBytes);
  absl::StatusOr<IpcSetup> got = DecodeSetup(bytes);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->event_handles, std::vector<std::string>(300, ""));
}

TEST(CudaIpcCodecTest, MalformedSetupNamesTheField) {
  std::string bytes = EncodeSetup(ExampleSetup());
  absl::StatusOr<IpcSetup> cut = DecodeSetup(std::string_view(bytes).substr(0, 24));
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cut.status().message(),
            "malformed cuda_ipc transport_setup: field 'instance_id' truncated");
  absl::StatusOr<IpcSetup> trailing = DecodeSetup(bytes + "x");
  EXPECT_EQ(trailing.status().message(), "malformed cuda_ipc transport_setup: 1 trailing bytes");
  IpcSetup zero = ExampleSetup();
  zero.block_size = 0;
  EXPECT_EQ(DecodeSetup(EncodeSetup(zero)).status().message(),
            "malformed cuda_ipc transport_setup: field 'block_size' 0 outside [1, 1073741824]");
  std::string v2 = bytes;
  v2[0] = 2;
  EXPECT_EQ(DecodeSetup(v2).status().message(),
            "malformed cuda_ipc transport_setup: field 'version' 2 (this worker speaks 1)");
}

TEST(CudaIpcCodecTest, LocatorRoundTripsAndRefusesBadBytes) {
  IpcLocator loc;
  loc.first_block = 7;
  loc.event_handle = "ev";
  loc.blocks = {12, 0, 99};
  std::string bytes = EncodeLocator(loc);
  EXPECT_EQ(bytes.size(), 4 + 4 + (4 + 2) + 4 + 3 * 4);
  absl::StatusOr<IpcLocator> got = DecodeLocator(bytes);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->first_block, 7u);
  EXPECT_EQ(got->event_handle, "ev");
  EXPECT_EQ(got->blocks, (std::vector<int32_t>{12, 0, 99}));

  EXPECT_EQ(DecodeLocator("abc").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeLocator("abc").status().message(),
            "malformed cuda_ipc locator: field 'version' truncated");
  EXPECT_EQ(DecodeLocator(bytes.substr(0, bytes.size() - 1)).status().message(),
            "malformed cuda_ipc locator: field 'n_blocks' 3 needs 12 bytes, 11 left");
  std::string negative = bytes;
  negative.replace(negative.size() - 4, 4, std::string("\xff\xff\xff\xff", 4));
  EXPECT_EQ(DecodeLocator(negative).status().message(),
            "malformed cuda_ipc locator: field 'blocks[2]' 4294967295 is not a block id");
}

}  // namespace
}  // namespace tandem::kvtransfer::cuda_ipc
