// Token sampling: greedy, temperature, min-p, top-k, top-p with
// counter-based randomness (DESIGN.md, Engine: Sampling).
//
// Owns: drawing one token from a sequence's SamplingView (sampling_view.h).
// Does not touch: logits production, the logits processors' rules, stop
// conditions. Threads: pure functions; thread-safe.
//
// Pipeline per sequence and step: ApplyLogitsProcessors over the full row
// -> the backend reduces the row to a SamplingView (BuildSamplingView on
// the CPU) -> SampleFromView on the host. Sample() runs all three.
#ifndef TANDEM_ENGINE_SAMPLING_SAMPLER_H_
#define TANDEM_ENGINE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling/sampling_options.h"
#include "engine/sampling/sampling_view.h"

namespace tandem::sampling {

struct SampledToken {
  int32_t token_id = -1;
  float logprob = 0.0f;  // log-softmax of the raw (unprocessed) logits
  // view.raw_top: the options.top_logprobs most likely raw alternatives,
  // empty when top_logprobs == 0.
  std::vector<TokenLogprob> top_logprobs;
};

// Draws output index `output_index` of a request from `view`, built for the
// same `options` (which must pass Validate()). This is the contract a
// backend's view must satisfy; every sum is in double, in the order given:
//
//   logprob of the chosen id = float(double(raw_logit) - view.raw_max -
//     view.raw_log_sum) (bit-identical to the log-softmax in double, in
//     index order, that Sample has always reported).
//   temperature == 0: candidates[0] (argmax, ties -> lowest id); min_p,
//     top_k and top_p are ignored.
//   Otherwise, with p_i = exp(double(l'_i) - double(l'_0)) for candidate i
//   (l' the processed logits, l'_0 = candidates[0].logit; p_i is the
//   probability of candidate i over the most likely one's), in this order:
//     min_p > 0 (vLLM's min_p): kept = the candidates with
//       p_i >= double(min_p): candidate 0, then candidates 1, 2, ... up to
//       (not including) the first whose p_i >= double(min_p) is false (a
//       prefix, as p falls along the candidate order; NaN fails).
//       min_p == 0: kept = all candidates.
//     top_k > 0: kept = the first min(top_k, kept) of those (so the
//       min_p walk above may stop at top_k).
//     total = the sum of p over kept in candidate order when top_k > 0 or
//       min_p > 0; view.normaliser otherwise.
//     top_p < 1: target = double(top_p) * total; walk kept in order
//       accumulating p; kept = the shortest prefix whose cumulative mass is
//       >= target (at least one; all of kept if none is).
//     top_p == 1 with top_k and min_p off: kept = all candidates (the view
//       is then complete).
//     kept_mass = the sum of p over kept in order; threshold =
//       UniformDraw(seed, output_index) * kept_mass; return the first kept
//       candidate whose cumulative mass is > threshold (the last kept one
//       if none is).
// With min_p == 0 this is bit for bit the top_k / top_p draw of before
// min_p. BuildSamplingView guarantees kept never needs a candidate the view
// lacks (top_k <= candidates or complete; with top_k off, the min_p walk
// stops inside the view or it is complete, or with min_p off the
// candidates' mass reaches the top_p target or the view is complete); this
// asserts it. The draw is a pure function of (seed, output_index), so a
// P -> D handoff or a recompute gives the same token. Cost: O(kept) double
// exps (four passes at most), no allocation unless top_logprobs > 0.
SampledToken SampleFromView(const SamplingView& view, const SamplingOptions& options,
                            uint32_t output_index);

// Convenience for one row: BuildSamplingView + SampleFromView of output
// index history.generated.size(). Allocates a row and a view per call;
// loops over many sequences should keep a view and scratch and call the
// two steps.
SampledToken Sample(std::span<const float> logits, const SamplingOptions& options,
                    const TokenHistory& history);

// As above with an empty history (no penalty or min_tokens mask has
// anything to act on) at any `output_index`.
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

// The seed of sample `sample_index` of a request with n > 1 samples: the
// engine sets SamplingOptions::seed = SampleSeed(request seed, s) for
// sample s, whose draw at output i is then
// UniformDraw(SampleSeed(seed, s), i), a pure function of (seed, s, i).
//   SampleSeed(seed, 0) = seed (an n = 1 stream is sample 0's);
//   SampleSeed(seed, s) = Mix64(seed + s * 0xD1B54A32D192ED03) for s > 0,
// Mix64 being SplitMix64's output function (Stafford's Mix13:
// z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27;
// z *= 0x94D049BB133111EB; z ^= z >> 31), all arithmetic mod 2^64. The
// increment is odd and differs from UniformDraw's, so the seeds of
// samples 1, 2, ... of one request are distinct (Mix64 is a bijection)
// and unrelated to the states of the stream of `seed` itself.
uint64_t SampleSeed(uint64_t seed, uint32_t sample_index);

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_SAMPLER_H_
