// A DeviceQuery with canned answers (engine/backend/device.h), for the
// start-up checks and the backend factory on machines without a GPU.
#ifndef TANDEM_TESTS_ENGINE_BACKEND_FAKE_DEVICE_QUERY_H_
#define TANDEM_TESTS_ENGINE_BACKEND_FAKE_DEVICE_QUERY_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/device.h"

namespace tandem::backend {

class FakeDeviceQuery final : public DeviceQuery {
 public:
  // `gpus`: the devices, cuda:0 first; none: DeviceCount() is 0 with `why`.
  explicit FakeDeviceQuery(std::vector<GpuInfo> gpus, std::string why = "")
      : gpus_(std::move(gpus)), why_(std::move(why)) {}

  int32_t DeviceCount(std::string* why_none) const override {
    if (gpus_.empty() && why_none != nullptr) *why_none = why_;
    return static_cast<int32_t>(gpus_.size());
  }
  absl::StatusOr<GpuInfo> Info(int32_t index) const override {
    if (index < 0 || index >= static_cast<int32_t>(gpus_.size())) {
      return absl::UnavailableError(absl::StrCat("no device ", index));
    }
    return gpus_[index];
  }

 private:
  std::vector<GpuInfo> gpus_;
  std::string why_;
};

// An H200-like device `index`: 141 GiB total, all free, sm_90.
inline GpuInfo FakeH200(int32_t index) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  return GpuInfo{index, "NVIDIA H200", 141 * kGiB, 141 * kGiB, 90};
}

}  // namespace tandem::backend

#endif  // TANDEM_TESTS_ENGINE_BACKEND_FAKE_DEVICE_QUERY_H_
