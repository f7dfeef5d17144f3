// Which device a worker computes on ("cpu" or "cuda:N"), and the device
// queries behind an interface so that the start-up checks and the memory
// planning are unit-tested on a machine without a GPU (a fake
// DeviceQuery) while the real one asks the CUDA runtime.
//
// Owns: parsing engine.device values, the DeviceQuery seam and the
// start-up availability check. Does not touch: device memory (the CUDA
// backend), configuration files (common/cluster_config).
// Threads: ParseDevice and CheckDeviceAvailable are pure; a DeviceQuery is
// safe to call from any thread.
#ifndef TANDEM_ENGINE_BACKEND_DEVICE_H_
#define TANDEM_ENGINE_BACKEND_DEVICE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::backend {

// A compute device: the CPU, or CUDA device `index` (as cudaSetDevice
// numbers it, i.e. after CUDA_VISIBLE_DEVICES).
struct DeviceSpec {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int32_t index = 0;  // kCuda only

  bool is_cuda() const { return kind == Kind::kCuda; }
  // "cpu" or "cuda:N".
  std::string ToString() const;
  friend bool operator==(const DeviceSpec&, const DeviceSpec&) = default;
};

// Parses "cpu" or "cuda:N" (N a decimal integer in [0, 1023]).
// INVALID_ARGUMENT naming `key` (e.g. "engine.device") and the value
// otherwise.
[[nodiscard]] absl::StatusOr<DeviceSpec> ParseDevice(std::string_view text, std::string_view key);

// What the start-up checks and the memory plan need to know of a GPU.
struct GpuInfo {
  int32_t index = 0;
  std::string name;                // e.g. "NVIDIA H200"
  uint64_t total_bytes = 0;        // device memory, bytes
  uint64_t free_bytes = 0;         // free now (cudaMemGetInfo), bytes
  int32_t compute_capability = 0;  // major * 10 + minor, e.g. 90
};

class DeviceQuery {
 public:
  virtual ~DeviceQuery() = default;
  // Number of CUDA devices; 0 where there is none (no driver, no device,
  // or CUDA not compiled in), with the reason in *why_none when given.
  virtual int32_t DeviceCount(std::string* why_none) const = 0;
  // Facts about device `index` (< DeviceCount()). UNAVAILABLE when the
  // runtime cannot answer.
  [[nodiscard]] virtual absl::StatusOr<GpuInfo> Info(int32_t index) const = 0;
};

// The CUDA runtime's answers (cudaGetDeviceCount, cudaGetDeviceProperties,
// cudaMemGetInfo); in a build without CUDA, DeviceCount() is 0 with
// "this build has no CUDA backend (TANDEM_ENABLE_CUDA is OFF)".
const DeviceQuery& SystemDeviceQuery();

// OK for the CPU, and for cuda:N when `query` has a device N. Otherwise
// FAILED_PRECONDITION in one line naming `key` and the numbers, e.g.
// "engine.device: cuda:0, but this machine has no CUDA GPU (no CUDA-capable
// device is detected)" or "engine.device: cuda:3, but this machine has 1
// CUDA GPU (cuda:0)".
[[nodiscard]] absl::Status CheckDeviceAvailable(const DeviceQuery& query, const DeviceSpec& device,
                                                std::string_view key);

}  // namespace tandem::backend

#endif  // TANDEM_ENGINE_BACKEND_DEVICE_H_
