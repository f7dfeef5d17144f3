#include "engine/backend/gpu_memory_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::backend {

namespace {

constexpr char kFractionKey[] = "engine.gpu_memory_fraction";

// "15.20 GiB", "4.00 MiB", "128.00 KiB" or "512 bytes".
std::string Bytes(uint64_t bytes) {
  constexpr double kKiB = 1024.0, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
  const double b = static_cast<double>(bytes);
  if (b >= kGiB) return absl::StrFormat("%.2f GiB", b / kGiB);
  if (b >= kMiB) return absl::StrFormat("%.2f MiB", b / kMiB);
  if (b >= kKiB) return absl::StrFormat("%.2f KiB", b / kKiB);
  return absl::StrCat(bytes, " bytes");
}

// a + b, saturating at the largest uint64 (absurd inputs must not wrap
// around into a plan that "fits").
uint64_t AddSat(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max()
                                                      : a + b;
}

uint64_t FixedBytes(const GpuMemoryInputs& in) {
  uint64_t sum = 0;
  for (uint64_t part : {in.weight_bytes, in.activation_peak_bytes, in.workspace_bytes,
                        in.transfer_buffer_bytes, in.other_bytes}) {
    sum = AddSat(sum, part);
  }
  return sum;
}

// "weights 2.30 GiB + activations 400.00 MiB + ..." joined by `sep`.
std::string FixedParts(const GpuMemoryInputs& in, const char* sep) {
  return absl::StrCat("weights ", Bytes(in.weight_bytes), sep, "activations ",
                      Bytes(in.activation_peak_bytes), sep, "workspace ", Bytes(in.workspace_bytes),
                      sep, "transfer ", Bytes(in.transfer_buffer_bytes), sep, "other ",
                      Bytes(in.other_bytes));
}

}  // namespace

std::string GpuMemoryPlan::Describe(const GpuMemoryInputs& in) const {
  std::string line =
      absl::StrFormat("GPU memory: budget %s (%.2f of %s): %s; KV %s = %d blocks of %s",
                      Bytes(budget_bytes), in.gpu_memory_fraction, Bytes(in.device_total_bytes),
                      FixedParts(in, ", "), Bytes(kv_bytes), num_blocks, Bytes(in.block_bytes));
  if (in.max_blocks > 0 && num_blocks == in.max_blocks) {
    absl::StrAppend(&line, " (capped by engine.num_kv_blocks ", in.max_blocks, ")");
  }
  return line;
}

absl::StatusOr<GpuMemoryPlan> PlanGpuMemory(const GpuMemoryInputs& in) {
  const double fraction = in.gpu_memory_fraction;
  if (!(fraction > 0.0 && fraction <= 1.0)) {  // NaN fails both
    return absl::InvalidArgumentError(
        absl::StrCat(kFractionKey, ": must be in (0, 1], got ", fraction));
  }
  if (in.block_bytes == 0) {
    return absl::InvalidArgumentError("KV block size is 0 bytes");
  }
  GpuMemoryPlan plan;
  plan.budget_bytes =
      static_cast<uint64_t>(std::floor(fraction * static_cast<double>(in.device_total_bytes)));
  const uint64_t fixed = FixedBytes(in);
  if (fixed > plan.budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the model does not fit: %s = %s > %s %.2f of %s (%s)", FixedParts(in, " + "), Bytes(fixed),
        kFractionKey, fraction, Bytes(in.device_total_bytes), Bytes(plan.budget_bytes)));
  }
  if (plan.budget_bytes > in.device_free_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s %.2f of %s is %s, but only %s of the device was free at start (other processes "
        "hold the rest); lower %s",
        kFractionKey, fraction, Bytes(in.device_total_bytes), Bytes(plan.budget_bytes),
        Bytes(in.device_free_bytes), kFractionKey));
  }
  const uint64_t rest = plan.budget_bytes - fixed;
  if (rest < in.block_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s %.2f leaves %s for the KV cache, less than one block of %s",
                        kFractionKey, fraction, Bytes(rest), Bytes(in.block_bytes)));
  }
  uint64_t blocks = rest / in.block_bytes;
  blocks = std::min<uint64_t>(blocks, std::numeric_limits<int32_t>::max());
  if (in.max_blocks > 0) blocks = std::min<uint64_t>(blocks, in.max_blocks);
  plan.num_blocks = static_cast<int32_t>(blocks);
  plan.kv_bytes = blocks * in.block_bytes;
  return plan;
}

double SplitGpuMemoryFraction(double fraction, int32_t n) {
  return n <= 1 ? fraction : fraction / n;
}

}  // namespace tandem::backend
