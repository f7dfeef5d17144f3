#include "engine/sampling/sampling_options.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem::sampling {
namespace {

// OK when `value` is in [-kMaxAbsPenalty, kMaxAbsPenalty] (not NaN).
[[nodiscard]] absl::Status CheckPenalty(const char* field, float value) {
  if (value >= -kMaxAbsPenalty && value <= kMaxAbsPenalty) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": must be in [-", kMaxAbsPenalty, ", ",
                                                 kMaxAbsPenalty, "], got ", value));
}

}  // namespace

absl::Status Validate(const SamplingOptions& options, int32_t vocab_size) {
  if (!(options.temperature == 0.0f ||
        (std::isfinite(options.temperature) && options.temperature >= kMinTemperature))) {
    return absl::InvalidArgumentError(absl::StrCat("temperature: must be 0 (greedy) or in [",
                                                   kMinTemperature, ", inf), got ",
                                                   options.temperature));
  }
  if (!(options.top_p > 0.0f && options.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p: must be in (0, 1], got ", options.top_p));
  }
  if (!(options.min_p >= 0.0f && options.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_p: must be in [0, 1], got ", options.min_p));
  }
  if (!(options.repetition_penalty >= kMinRepetitionPenalty &&
        options.repetition_penalty <= kMaxRepetitionPenalty)) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty: must be in [", kMinRepetitionPenalty, ", ",
                     kMaxRepetitionPenalty, "], got ", options.repetition_penalty));
  }
  if (absl::Status s = CheckPenalty("presence_penalty", options.presence_penalty); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckPenalty("frequency_penalty", options.frequency_penalty); !s.ok()) {
    return s;
  }
  if (options.top_logprobs < 0 || options.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("logprobs: must be in [0, ", kMaxTopLogprobs,
                                                   "], got ", options.top_logprobs));
  }
  for (size_t i = 0; i < options.logit_bias.size(); ++i) {
    const auto [id, bias] = options.logit_bias[i];
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias[", id, "]: token id ", id,
                                                     " is outside the vocabulary [0, ", vocab_size,
                                                     ")"));
    }
    if (!(bias >= -kMaxAbsLogitBias && bias <= kMaxAbsLogitBias)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias[", id, "]: bias must be in [-",
                                                     kMaxAbsLogitBias, ", ", kMaxAbsLogitBias,
                                                     "], got ", bias));
    }
    if (i > 0 && id <= options.logit_bias[i - 1].first) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias: token ids must be sorted and unique, got ", id, " after ",
                       options.logit_bias[i - 1].first));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::sampling
