// Token sampling: greedy, temperature, top-k, top-p with counter-based
// randomness (DESIGN.md, Engine: Sampling).
//
// Owns: turning one logit vector into one token. Does not touch: logits
// production, stop conditions. Threads: pure functions; thread-safe.
#ifndef TANDEM_ENGINE_SAMPLING_SAMPLER_H_
#define TANDEM_ENGINE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace tandem::sampling {

struct SamplingOptions {
  float temperature = 0.0f;  // 0 = greedy argmax, ties -> lowest id; >= 0
  int32_t top_k = 0;         // <= 0 = off
  float top_p = 1.0f;        // in (0, 1]
  uint64_t seed = 0;         // randomness for output index i = f(seed, i)
};

// INVALID_ARGUMENT naming the field and its limit for temperature < 0 or
// NaN/inf, top_p outside (0, 1] or NaN.
absl::Status Validate(const SamplingOptions& options);

struct SampledToken {
  int32_t token_id;
  float logprob;  // log-softmax of the raw (untempered) logits
};

// Samples output index `output_index` from `logits` (vocab entries, at
// least one). temperature == 0: argmax, ties -> lowest id. Otherwise
// p = softmax(logits / temperature); keep the top_k most probable ids (ties
// ordered by lower id first), then the smallest prefix of those (descending
// p) whose renormalized cumulative mass reaches top_p (at least one id);
// draw u = UniformDraw(seed, output_index) and return the first kept id
// whose cumulative mass exceeds u * (kept mass). The draw is a pure
// function of (seed, output_index), so a P -> D handoff or a recompute gives
// the same token. `options` must pass Validate().
SampledToken Sample(std::span<const float> logits, const SamplingOptions& options,
                    uint32_t output_index);

// The counter-based uniform draw in [0, 1) for (seed, output_index): output
// number `output_index` (0-based) of SplitMix64 (Steele, Lea & Flood,
// "Fast splittable pseudorandom number generators", OOPSLA 2014; Vigna's
// splitmix64.c) started from state `seed`, i.e.
//   z = Mix64(seed + (output_index + 1) * 0x9E3779B97F4A7C15),
// keeping its top 53 bits: u = (z >> 11) * 2^-53. Jumping to any index is
// O(1), which is why no generator state travels with a request.
double UniformDraw(uint64_t seed, uint32_t output_index);

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_SAMPLER_H_
