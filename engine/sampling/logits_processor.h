// Logits processors: the per-request rewrites of a full logit row that run
// before any candidate selection (DESIGN.md, Engine: Sampling).
//
// Owns: the list of processors and their fixed order. Does not touch: raw
// logits kept for logprobs (callers pass a copy), candidate selection,
// the draw. Threads: pure function; thread-safe.
#ifndef TANDEM_ENGINE_SAMPLING_LOGITS_PROCESSOR_H_
#define TANDEM_ENGINE_SAMPLING_LOGITS_PROCESSOR_H_

#include <span>

#include "engine/sampling/sampling_options.h"

namespace tandem::sampling {

// Rewrites one row of `logits` (one entry per vocabulary id) in place with
// the request's processors, in this fixed order:
//
//   1. (reserved) repetition / frequency / presence penalties and logit
//      biases: they go here, before temperature, as vLLM and llama.cpp
//      order them, so that a bias is scaled like the logit it shifts.
//   2. temperature: when options.temperature > 0, l = l / temperature
//      (float division, element by element). temperature == 0 (greedy)
//      leaves the row unchanged.
//
// The result (the "processed logits" l') is what candidate selection and
// the draw see; logprobs are always reported from the raw row. Cost: one
// pass over the row. `options` must pass Validate().
void ApplyLogitsProcessors(const SamplingOptions& options, std::span<float> logits);

// True when ApplyLogitsProcessors leaves every row bit for bit as it is
// (temperature 0 or 1, no other processor), so a caller may skip the copy:
// x / 1.0f == x exactly for every float, NaN and infinities included.
bool LogitsProcessorsAreIdentity(const SamplingOptions& options);

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_LOGITS_PROCESSOR_H_
