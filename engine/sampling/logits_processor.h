// Logits processors: the per-request rewrites of a full logit row that run
// before any candidate selection (DESIGN.md, Engine: Sampling).
//
// Owns: the list of processors, their fixed order and their float
// arithmetic (a GPU backend reproduces each as specified here, bit for
// bit). Does not touch: raw logits kept for logprobs (callers pass a copy),
// candidate selection, min_p / top_k / top_p, the draw. Threads: pure
// function of its inputs (a thread_local scratch of one int32 per
// vocabulary id, grown once); thread-safe.
#ifndef TANDEM_ENGINE_SAMPLING_LOGITS_PROCESSOR_H_
#define TANDEM_ENGINE_SAMPLING_LOGITS_PROCESSOR_H_

#include <cstdint>
#include <span>

#include "engine/sampling/sampling_options.h"

namespace tandem::sampling {

// The token history the processors read: the sequence's prompt and the
// tokens generated so far (all ids in [0, vocab)). The output index being
// sampled is generated.size(). The processors' state is a pure function of
// it, so a P -> D handoff or a recompute after preemption processes the
// same row the same way. Views only: the caller keeps the ids alive for
// the call.
struct TokenHistory {
  std::span<const int32_t> prompt;
  std::span<const int32_t> generated;
};

// Rewrites one row of `logits` (one entry per vocabulary id, V entries) in
// place with the request's processors, in vLLM v1's order. Every step is
// the float operation written, rounded once per operation (the build has
// no FMA contraction), and touches each affected id once, so the result
// does not depend on the order ids are visited in:
//
//   a. min_tokens (vLLM MinTokensLogitsProcessor): while
//      generated.size() < min_tokens, l[id] = -inf for every id of
//      min_tokens_masked_ids.
//   b. logit_bias (OpenAI / vLLM): l[id] = l[id] + bias for every
//      (id, bias) of logit_bias.
//   c. repetition penalty (Hugging Face RepetitionPenaltyLogitsProcessor,
//      vLLM apply_penalties), when repetition_penalty p != 1: for every
//      distinct id of prompt ∪ generated, l = l > 0 ? l / p : l * p
//      (a NaN stays NaN).
//   d. frequency then presence penalty (OpenAI; vLLM apply_penalties): for
//      every distinct id generated c > 0 times, l = l - frequency * float(c)
//      when frequency_penalty != 0 (the product rounded to float, then the
//      difference), then l = l - presence when presence_penalty != 0. The
//      prompt does not count.
//   e. temperature: when temperature > 0, l = l / temperature (float
//      division, element by element; not a multiplication by 1/T).
//      temperature == 0 (greedy) skips it: greedy takes the argmax of the
//      row after a-d.
//
// A step whose parameter is neutral (no masked ids or min_tokens reached,
// no biases, p == 1, penalty == 0) leaves the row untouched. The result
// (the "processed logits" l') is what candidate selection and the draw
// see; logprobs are always reported from the raw row. Cost: O(V) for
// temperature plus O(|prompt| + |generated| + |biases| + |masked ids|)
// for a-d, no allocation once the thread's scratch has grown to V.
// Preconditions: `options` passes Validate(); every id of the history and
// of min_tokens_masked_ids is in [0, V) (asserted in debug builds).
void ApplyLogitsProcessors(const SamplingOptions& options, const TokenHistory& history,
                           std::span<float> logits);

// True when ApplyLogitsProcessors leaves every row bit for bit as it is, so
// a caller may skip the copy: no step a-d applies (min_tokens reached or no
// masked ids, no biases, repetition_penalty 1 or an empty history, zero
// frequency and presence penalties or nothing generated) and temperature
// is 0 or 1 (x / 1.0f == x exactly for every float, NaN and infinities
// included).
bool LogitsProcessorsAreIdentity(const SamplingOptions& options, const TokenHistory& history);

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_LOGITS_PROCESSOR_H_
