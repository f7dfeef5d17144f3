// The sampling view: the small summary of one sequence's logit row that the
// host sampler draws from (DESIGN.md, Engine: Sampling).
//
// A backend must not copy whole logit rows (150k floats per sequence) to
// the host to sample. Instead the logits processors run over the full row,
// the backend reduces the row to a SamplingView (top candidates, a few
// sums, the raw top-n), and SampleFromView (sampler.h) draws from it.
// BuildSamplingView below is the CPU reduction; a GPU backend computes the
// same view on the device and must reproduce every field as documented
// here, bit for bit, for its samples to match the CPU's.
//
// Owns: the view's definition and the CPU reduction. Does not touch: the
// draw (sampler.h), the processors' rules (logits_processor.h). Threads:
// pure function of its inputs; callers own the view and scratch.
#ifndef TANDEM_ENGINE_SAMPLING_SAMPLING_VIEW_H_
#define TANDEM_ENGINE_SAMPLING_SAMPLING_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling/logits_processor.h"
#include "engine/sampling/sampling_options.h"

namespace tandem::sampling {

// The candidate order, used for the processed candidates and for raw_top:
// a strict total order where a comes before b when key(a) > key(b), or the
// keys are equal and id(a) < id(b); key = the logit with NaN treated as
// -infinity. So -inf and NaN entries come last, ordered by id, and the
// order never depends on a sort implementation.

struct Candidate {
  int32_t id;
  float logit;      // processed logit l' (after ApplyLogitsProcessors)
  float raw_logit;  // the model's logit, for the logprob
};

struct TokenLogprob {
  int32_t id;
  float logprob;  // log-softmax of the raw logits (see SampleFromView)
};

// Minimum number of candidates a view holds (when the vocabulary has that
// many): enough for the usual top_p nucleus, so widening is rare.
inline constexpr size_t kMinViewCandidates = 64;

struct SamplingView {
  // The first K ids of the whole vocabulary in the candidate order of the
  // processed logits (exactly those, sorted). Greedy (temperature 0) draws
  // nothing, so K = 1 (a GPU backend sends one id). Otherwise K =
  // min(vocab, max(top_k, kMinViewCandidates)); when top_k is off, K is
  // then widened x4 (capped at vocab): with min_p > 0 until the last
  // candidate fails the min_p test, with min_p == 0 until the candidates'
  // mass reaches top_p * normaliser, and K = vocab when top_p == 1 (see
  // BuildSamplingView).
  std::vector<Candidate> candidates;
  bool complete = false;  // candidates hold the whole vocabulary
  // Raw statistics, from the unprocessed row (logprobs are always raw):
  double raw_max = 0;      // double(raw logit) of the first id in the raw order
  double raw_log_sum = 0;  // log(sum_i exp(double(raw_i) - raw_max)), summed
                           // in index order
  // Only when top_k is off, min_p == 0 and temperature > 0 (else 0): the
  // sum over the whole vocabulary, in index order, of
  // exp(double(l'_i) - double(l'_max)), l'_max = candidates[0].logit.
  double normaliser = 0;
  // The first options.top_logprobs ids (capped at vocab) in the candidate
  // order of the raw logits, with raw logprobs
  // float(double(raw) - raw_max - raw_log_sum).
  std::vector<TokenLogprob> raw_top;
};

// Builds the view of one row of raw logits (vocab entries, at least one)
// for a request with `options` (which must pass Validate()) and the
// sequence's `history` (the processors' input, logits_processor.h):
//   1. copies the row into `scratch` and runs ApplyLogitsProcessors on it
//      (no copy when LogitsProcessorsAreIdentity: greedy or temperature 1
//      with no penalty, bias or min_tokens mask in effect);
//   2. selects the first K = min(vocab, max(top_k, 64)) ids of the candidate
//      order (64 when top_k is off; 1 for greedy, which ignores min_p);
//   3. when top_k is off and temperature > 0, with
//      p_i = exp(double(l'_i) - double(l'_0)) in candidate order:
//      - min_p > 0: while the view is not complete and the last
//        candidate's p_{K-1} >= double(min_p), widens K to min(4K, vocab).
//        Every min_p survivor (SampleFromView) is then in the view, and the
//        top_p nucleus lies within the survivors, so no normaliser is
//        computed and top_p == 1 does not need the whole vocabulary;
//      - min_p == 0: computes the normaliser, and while the view is not
//        complete and the candidates' mass sum_i p_i (summed in candidate
//        order) is not >= double(top_p) * normaliser, widens K to
//        min(4K, vocab). top_p == 1 keeps every id, so it selects
//        K = vocab at once;
//      this is what guarantees SampleFromView never runs past the
//      candidates: it walks the same values in the same order;
//   4. raw_max, raw_log_sum and raw_top from the raw row.
//
// Cost, vocab V: one copy and the processors' pass (neither for identity
// processors), an argmax pass (likewise), one double exp per id for
// raw_log_sum and one more for the normaliser (skipped for identity
// processors and for min_p > 0), and a selection:
// a bounded heap, O(V + K log K) typical, while K is small next to V (at
// most 1024 ids and a sixteenth of the vocabulary), otherwise an O(V)
// radix sort of the ids left. Nothing sorts the vocabulary with
// comparisons. K reaches V for a
// flat distribution with top_p near 1 (or a small min_p), and always for
// top_k off, min_p == 0, top_p == 1 at temperature > 0 (the contract then
// sums p over the whole sorted vocabulary). Measured at V = 152064 on one
// core: about 1.2 ms for greedy or top_k, 3 to 4 ms when the view is
// (nearly) complete, of which the exps are a third to a half;
// bench/engine_bench.cc BM_Sample measures it on a model's own logits
// (docs/benchmarks.md).
//
// `view` is overwritten; reuse one view and one `scratch` per thread and no
// call allocates once their capacities have grown (scratch: V floats;
// candidates: up to 2V while radix sorting). `scratch == nullptr`
// allocates a row per call.
void BuildSamplingView(std::span<const float> raw_logits, const SamplingOptions& options,
                       const TokenHistory& history, SamplingView* view,
                       std::vector<float>* scratch = nullptr);

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_SAMPLING_VIEW_H_
