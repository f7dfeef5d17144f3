// Per-request sampling options and their range checks (DESIGN.md, Engine:
// Sampling). Split out of sampler.h so that the logits processors and the
// sampling view can name the options without the sampler.
#ifndef TANDEM_ENGINE_SAMPLING_SAMPLING_OPTIONS_H_
#define TANDEM_ENGINE_SAMPLING_SAMPLING_OPTIONS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::sampling {

// Upper limit of SamplingOptions::top_logprobs (OpenAI's API allows 20).
inline constexpr int32_t kMaxTopLogprobs = 20;

struct SamplingOptions {
  float temperature = 0.0f;  // 0 = greedy argmax, ties -> lowest id; >= 0
  int32_t top_k = 0;         // <= 0 = off
  float top_p = 1.0f;        // in (0, 1]
  uint64_t seed = 0;         // randomness for output index i = f(seed, i)
  int32_t top_logprobs = 0;  // raw top-n alternatives reported per token;
                             // 0 (none) .. kMaxTopLogprobs
};

// INVALID_ARGUMENT naming the field and its limit for temperature < 0 or
// NaN/inf, top_p outside (0, 1] or NaN, top_logprobs outside [0, 20].
absl::Status Validate(const SamplingOptions& options);

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_SAMPLING_OPTIONS_H_
