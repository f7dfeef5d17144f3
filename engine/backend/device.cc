#include "engine/backend/device.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::backend {

namespace {
constexpr int32_t kMaxCudaIndex = 1023;
constexpr absl::string_view kCudaPrefix = "cuda:";

// This Abseil's string_view is its own type, not std::string_view.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
}  // namespace

std::string DeviceSpec::ToString() const {
  return is_cuda() ? absl::StrCat(kCudaPrefix, index) : std::string("cpu");
}

absl::StatusOr<DeviceSpec> ParseDevice(std::string_view text_in, std::string_view key_in) {
  const absl::string_view text = Absl(text_in), key = Absl(key_in);
  if (text == "cpu") return DeviceSpec{};
  if (text.substr(0, kCudaPrefix.size()) == kCudaPrefix) {
    absl::string_view digits = text.substr(kCudaPrefix.size());
    int32_t index = -1;
    // Digits only: SimpleAtoi alone would take "+1" and " 1".
    if (!digits.empty() && digits.size() <= 4 &&
        std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) &&
        absl::SimpleAtoi(digits, &index) && index <= kMaxCudaIndex) {
      return DeviceSpec{DeviceSpec::Kind::kCuda, index};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(key, ": expected cpu or cuda:N (N in 0..",
                                                 kMaxCudaIndex, "), got '", text, "'"));
}

absl::Status CheckDeviceAvailable(const DeviceQuery& query, const DeviceSpec& device,
                                  std::string_view key_in) {
  if (!device.is_cuda()) return absl::OkStatus();
  const absl::string_view key = Absl(key_in);
  std::string why;
  const int32_t count = query.DeviceCount(&why);
  if (count <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(key, ": ", device.ToString(), ", but this machine has no CUDA GPU",
                     why.empty() ? "" : absl::StrCat(" (", why, ")")));
  }
  if (device.index >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat(key, ": ", device.ToString(), ", but this machine has ", count,
                     count == 1 ? " CUDA GPU (cuda:0)"
                                : absl::StrCat(" CUDA GPUs (cuda:0..cuda:", count - 1, ")")));
  }
  return absl::OkStatus();
}

}  // namespace tandem::backend
