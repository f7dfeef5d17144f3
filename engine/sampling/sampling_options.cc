#include "engine/sampling/sampling_options.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem::sampling {

absl::Status Validate(const SamplingOptions& options) {
  if (!(std::isfinite(options.temperature) && options.temperature >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature: must be >= 0 and finite, got ", options.temperature));
  }
  if (!(options.top_p > 0.0f && options.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p: must be in (0, 1], got ", options.top_p));
  }
  if (options.top_logprobs < 0 || options.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("top_logprobs: must be in [0, ",
                                                   kMaxTopLogprobs, "], got ",
                                                   options.top_logprobs));
  }
  return absl::OkStatus();
}

}  // namespace tandem::sampling
