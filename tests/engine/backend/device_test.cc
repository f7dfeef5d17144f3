// ParseDevice, DeviceSpec::ToString and CheckDeviceAvailable over a fake
// DeviceQuery (engine/backend/device.h).
#include "engine/backend/device.h"

#include <gtest/gtest.h>

#include "tests/engine/backend/fake_device_query.h"

namespace tandem::backend {
namespace {

TEST(ParseDeviceTest, ParsesCpuAndCudaIndices) {
  absl::StatusOr<DeviceSpec> cpu = ParseDevice("cpu", "engine.device");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(*cpu, DeviceSpec{});
  EXPECT_FALSE(cpu->is_cuda());
  for (int32_t index : {0, 1, 7, 1023}) {
    absl::StatusOr<DeviceSpec> d = ParseDevice(absl::StrCat("cuda:", index), "engine.device");
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->is_cuda());
    EXPECT_EQ(d->index, index);
  }
}

TEST(ParseDeviceTest, ToStringRoundTrips) {
  EXPECT_EQ(DeviceSpec{}.ToString(), "cpu");
  EXPECT_EQ((DeviceSpec{DeviceSpec::Kind::kCuda, 0}).ToString(), "cuda:0");
  EXPECT_EQ((DeviceSpec{DeviceSpec::Kind::kCuda, 12}).ToString(), "cuda:12");
  for (const char* text : {"cpu", "cuda:0", "cuda:3", "cuda:1023"}) {
    EXPECT_EQ(ParseDevice(text, "k")->ToString(), text);
  }
}

TEST(ParseDeviceTest, RefusesOtherSpellingsNamingTheKey) {
  for (const char* text : {"", "gpu", "CPU", "cuda", "cuda:", "cuda:-1", "cuda:+1", "cuda: 1",
                           "cuda:1024", "cuda:99999", "cuda:1x", "cuda:0.5", "cpu:0",
                           "cuda:0 "}) {
    absl::StatusOr<DeviceSpec> d = ParseDevice(text, "decode_workers[0].device");
    ASSERT_FALSE(d.ok()) << "'" << text << "'";
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(d.status().message(),
              absl::StrCat("decode_workers[0].device: expected cpu or cuda:N (N in 0..1023), "
                           "got '",
                           text, "'"));
  }
}

TEST(CheckDeviceAvailableTest, CpuIsAlwaysAvailable) {
  FakeDeviceQuery none({}, "no CUDA-capable device is detected");
  EXPECT_TRUE(CheckDeviceAvailable(none, DeviceSpec{}, "engine.device").ok());
}

TEST(CheckDeviceAvailableTest, NoGpuNamesTheKeyAndTheReason) {
  FakeDeviceQuery none({}, "no CUDA-capable device is detected");
  absl::Status s =
      CheckDeviceAvailable(none, *ParseDevice("cuda:0", "engine.device"), "engine.device");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "engine.device: cuda:0, but this machine has no CUDA GPU (no CUDA-capable device "
            "is detected)");
  FakeDeviceQuery silent({});
  EXPECT_EQ(CheckDeviceAvailable(silent, *ParseDevice("cuda:0", "k"), "engine.device").message(),
            "engine.device: cuda:0, but this machine has no CUDA GPU");
}

TEST(CheckDeviceAvailableTest, IndexBeyondTheDevicesNamesTheCount) {
  FakeDeviceQuery one({FakeH200(0)});
  EXPECT_TRUE(CheckDeviceAvailable(one, *ParseDevice("cuda:0", "k"), "engine.device").ok());
  absl::Status s = CheckDeviceAvailable(one, *ParseDevice("cuda:3", "k"), "engine.device");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "engine.device: cuda:3, but this machine has 1 CUDA GPU (cuda:0)");

  FakeDeviceQuery two({FakeH200(0), FakeH200(1)});
  EXPECT_TRUE(CheckDeviceAvailable(two, *ParseDevice("cuda:1", "k"), "engine.device").ok());
  EXPECT_EQ(CheckDeviceAvailable(two, *ParseDevice("cuda:2", "k"), "prefill_workers[1].device")
                .message(),
            "prefill_workers[1].device: cuda:2, but this machine has 2 CUDA GPUs "
            "(cuda:0..cuda:1)");
}

}  // namespace
}  // namespace tandem::backend
