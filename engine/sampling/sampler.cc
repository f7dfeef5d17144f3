#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::sampling {
namespace {

constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

// SplitMix64's output function (Stafford's "Mix13" finalizer).
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Lowest id among the largest logits (NaN never wins).
int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

// log softmax(logits)[id], accumulated in double in index order.
float LogSoftmaxAt(std::span<const float> logits, int32_t id) {
  const double max = logits[static_cast<size_t>(Argmax(logits))];
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(id)]) - max -
                            std::log(sum));
}

}  // namespace

absl::Status Validate(const SamplingOptions& options) {
  if (!(std::isfinite(options.temperature) && options.temperature >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature: must be >= 0 and finite, got ", options.temperature));
  }
  if (!(options.top_p > 0.0f && options.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p: must be in (0, 1], got ", options.top_p));
  }
  return absl::OkStatus();
}

double UniformDraw(uint64_t seed, uint32_t output_index) {
  const uint64_t z = Mix64(seed + (static_cast<uint64_t>(output_index) + 1) * kGoldenGamma);
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

SampledToken Sample(std::span<const float> logits, const SamplingOptions& options,
                    uint32_t output_index) {
  assert(!logits.empty());
  if (options.temperature == 0.0f) {
    const int32_t id = Argmax(logits);
    return {id, LogSoftmaxAt(logits, id)};
  }

  // Tempered probabilities (unnormalized: exp((l - max) / T), max -> 1).
  const double max = logits[static_cast<size_t>(Argmax(logits))];
  const double temperature = options.temperature;
  std::vector<double> p(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp((static_cast<double>(logits[i]) - max) / temperature);
  }

  // Candidates by descending probability, ties by ascending id, so the order
  // (and hence the result) never depends on the sort implementation.
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const auto before = [&p](int32_t a, int32_t b) {
    const double pa = p[static_cast<size_t>(a)], pb = p[static_cast<size_t>(b)];
    return pa > pb || (pa == pb && a < b);
  };
  size_t kept = order.size();
  if (options.top_k > 0 && static_cast<size_t>(options.top_k) < kept) {
    kept = static_cast<size_t>(options.top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kept),
                      order.end(), before);
  } else {
    std::sort(order.begin(), order.end(), before);
  }

  // Nucleus: smallest prefix whose mass reaches top_p of the top-k mass.
  double top_k_mass = 0.0;
  for (size_t i = 0; i < kept; ++i) top_k_mass += p[static_cast<size_t>(order[i])];
  if (options.top_p < 1.0f) {
    const double target = static_cast<double>(options.top_p) * top_k_mass;
    double cumulative = 0.0;
    size_t n = 0;
    while (n < kept) {
      cumulative += p[static_cast<size_t>(order[n])];
      ++n;
      if (cumulative >= target) break;
    }
    kept = n;
  }

  double kept_mass = 0.0;
  for (size_t i = 0; i < kept; ++i) kept_mass += p[static_cast<size_t>(order[i])];
  const double threshold = UniformDraw(options.seed, output_index) * kept_mass;
  int32_t id = order[kept - 1];
  double cumulative = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    cumulative += p[static_cast<size_t>(order[i])];
    if (cumulative > threshold) {
      id = order[i];
      break;
    }
  }
  return {id, LogSoftmaxAt(logits, id)};
}

}  // namespace tandem::sampling
