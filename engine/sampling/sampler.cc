#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace tandem::sampling {
namespace {

constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;
// SampleSeed's increment: odd, and not kGoldenGamma, so that sample seeds
// are not states of the output stream of `seed` itself.
constexpr uint64_t kSampleGamma = 0xD1B54A32D192ED03ull;

// SplitMix64's output function (Stafford's "Mix13" finalizer).
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The index in view.candidates of the token to emit (see SampleFromView).
size_t Draw(const SamplingView& view, const SamplingOptions& options, uint32_t output_index) {
  const std::vector<Candidate>& c = view.candidates;
  if (options.temperature == 0.0f) return 0;

  const double l0 = c[0].logit;
  const auto p = [&c, l0](size_t i) { return std::exp(static_cast<double>(c[i].logit) - l0); };
  const bool min_p_on = options.min_p > 0.0f;
  size_t kept = c.size();
  if (options.top_k > 0) {
    kept = std::min(static_cast<size_t>(options.top_k), c.size());
    assert(kept == static_cast<size_t>(options.top_k) || view.complete);
  } else {
    assert(view.complete || options.top_p < 1.0f || min_p_on);
  }
  if (min_p_on) {
    // The survivors are a prefix of the candidate order; top_k then keeps
    // the first top_k of them, so the walk stops at `kept` as well.
    const double min_p = options.min_p;
    size_t n = 1;
    while (n < kept && p(n) >= min_p) ++n;
    // With top_k off the view was widened until this walk stops inside it.
    assert(n < c.size() || view.complete || options.top_k > 0);
    kept = n;
  }
  double total = view.normaliser;
  if (options.top_k > 0 || min_p_on) {
    total = 0.0;
    for (size_t i = 0; i < kept; ++i) total += p(i);
  }

  double kept_mass = 0.0;
  if (options.top_p < 1.0f) {
    // Nucleus: the walk's cumulative sum is kept_mass when it stops.
    const double target = static_cast<double>(options.top_p) * total;
    size_t n = 0;
    while (n < kept) {
      kept_mass += p(n);
      ++n;
      if (kept_mass >= target) break;
    }
    // With top_k and min_p off the view was widened until this walk stops
    // inside it.
    assert(kept_mass >= target || options.top_k > 0 || min_p_on || view.complete);
    kept = n;
  } else if (options.top_k > 0 || min_p_on) {
    kept_mass = total;
  } else {
    for (size_t i = 0; i < kept; ++i) kept_mass += p(i);
  }

  const double threshold = UniformDraw(options.seed, output_index) * kept_mass;
  double cumulative = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    cumulative += p(i);
    if (cumulative > threshold) return i;
  }
  return kept - 1;
}

}  // namespace

double UniformDraw(uint64_t seed, uint32_t output_index) {
  const uint64_t z = Mix64(seed + (static_cast<uint64_t>(output_index) + 1) * kGoldenGamma);
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

SampledToken SampleFromView(const SamplingView& view, const SamplingOptions& options,
                            uint32_t output_index) {
  assert(!view.candidates.empty());
  const Candidate& chosen = view.candidates[Draw(view, options, output_index)];
  return {
      chosen.id,
      static_cast<float>(static_cast<double>(chosen.raw_logit) - view.raw_max - view.raw_log_sum),
      view.raw_top};
}

SampledToken Sample(std::span<const float> logits, const SamplingOptions& options,
                    const TokenHistory& history) {
  SamplingView view;
  BuildSamplingView(logits, options, history, &view);
  return SampleFromView(view, options, static_cast<uint32_t>(history.generated.size()));
}

SampledToken Sample(std::span<const float> logits, const SamplingOptions& options,
                    uint32_t output_index) {
  SamplingView view;
  BuildSamplingView(logits, options, TokenHistory{}, &view);
  return SampleFromView(view, options, output_index);
}

uint64_t SampleSeed(uint64_t seed, uint32_t sample_index) {
  if (sample_index == 0) return seed;
  return Mix64(seed + static_cast<uint64_t>(sample_index) * kSampleGamma);
}

}  // namespace tandem::sampling
