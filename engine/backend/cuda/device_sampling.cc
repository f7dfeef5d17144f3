#include "engine/backend/cuda/device_sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace tandem::backend::cuda {
namespace {

// The candidate order's key (sampling_view.h): NaN ranks as -inf.
inline float Key(float logit) {
  return std::isnan(logit) ? -std::numeric_limits<float>::infinity() : logit;
}

// True when ApplyLogitsProcessors does nothing but divide by the
// temperature (no mask, bias or penalty in effect).
bool TemperatureOnly(const sampling::SamplingOptions& options,
                     const sampling::TokenHistory& history) {
  if (!options.logit_bias.empty()) return false;
  sampling::SamplingOptions probe = options;
  probe.temperature = 1.0f;
  return sampling::LogitsProcessorsAreIdentity(probe, history);
}

}  // namespace

DeviceRowPlan PlanDeviceRow(const sampling::SamplingOptions& o,
                            const sampling::TokenHistory& history, int32_t vocab) {
  DeviceRowPlan p;
  p.top_n = static_cast<int32_t>(
      std::min<int64_t>(std::clamp<int64_t>(o.top_logprobs, 0, sampling::kMaxTopLogprobs), vocab));
  p.identity = sampling::LogitsProcessorsAreIdentity(o, history);
  const int32_t min_view = static_cast<int32_t>(sampling::kMinViewCandidates);
  if (o.temperature == 0.0f) {
    p.k = 1;
    p.mode = p.identity ? DeviceRowMode::kGreedy : DeviceRowMode::kHost;
  } else if (p.identity || TemperatureOnly(o, history)) {
    if (o.top_k > 0) {
      p.k = std::min(vocab, std::max(o.top_k, min_view));
      p.mode = p.k <= kMaxDeviceTopK ? DeviceRowMode::kTopK : DeviceRowMode::kHost;
    } else if (o.min_p > 0.0f) {
      p.k = std::min(vocab, min_view);
      p.mode = DeviceRowMode::kTopK;
    }
  }
  switch (p.mode) {
    case DeviceRowMode::kHost:
      p.fetch = 0;
      break;
    case DeviceRowMode::kGreedy:
      p.fetch = p.top_n;
      break;
    case DeviceRowMode::kTopK:
      p.fetch = std::max(p.identity ? p.k : std::min(2 * p.k, kMaxDeviceTopK), p.top_n);
      break;
  }
  return p;
}

bool BuildViewFromTopK(const DeviceRowPlan& p, const sampling::SamplingOptions& o,
                       const RowStats& stats, const int32_t* ids, const float* values,
                       int32_t fetched, int32_t vocab, sampling::SamplingView* view) {
  if (p.top_n > fetched) return false;
  std::vector<sampling::Candidate>& cand = view->candidates;
  cand.clear();
  int32_t k = 1;
  if (p.mode == DeviceRowMode::kGreedy) {
    cand.push_back({stats.argmax, stats.max, stats.max});
  } else {
    if (p.k > fetched) return false;
    const float temperature = o.temperature;
    for (int32_t j = 0; j < fetched; ++j) {
      const float raw = values[j];
      // The processed logit exactly as ApplyLogitsProcessors computes it.
      cand.push_back({ids[j], p.identity ? raw : raw / temperature, raw});
    }
    if (!p.identity) {
      // The fetched ids in the processed candidate order (ids are unique,
      // so the order is strict).
      std::sort(cand.begin(), cand.end(),
                [](const sampling::Candidate& a, const sampling::Candidate& b) {
                  const float ka = Key(a.logit), kb = Key(b.logit);
                  return ka > kb || (ka == kb && a.id < b.id);
                });
    }
    k = p.k;
    if (o.top_k <= 0 && o.min_p > 0.0f) {
      // BuildSamplingView's min_p widening, on the same values.
      const double l0 = cand[0].logit;
      const double min_p = o.min_p;
      while (k < vocab &&
             std::exp(static_cast<double>(cand[static_cast<size_t>(k - 1)].logit) - l0) >= min_p) {
        k = std::min(4 * k, vocab);
        if (k > fetched) return false;
      }
    }
    if (!p.identity && fetched < vocab) {
      // Every id not fetched has a raw logit <= the last fetched one, so a
      // processed key <= last_key: the first k are exact only when the
      // k-th is strictly before that (a tie could put a lower id first).
      const float last_key = Key(values[fetched - 1] / temperature);
      if (!(Key(cand[static_cast<size_t>(k - 1)].logit) > last_key)) return false;
    }
    cand.resize(static_cast<size_t>(k));
  }
  view->complete = k == vocab;
  view->raw_max = stats.max;
  // LaunchRowStats sums the exps in a fixed tree order, not in index order
  // as BuildSamplingView does: raw_log_sum (hence every logprob) is exact
  // within the CUDA bit-exact class, a few ulps from the CPU's.
  view->raw_log_sum = stats.log_sum;
  view->normaliser = 0.0;
  view->raw_top.clear();
  for (int32_t j = 0; j < p.top_n; ++j) {
    view->raw_top.push_back({ids[j], static_cast<float>(static_cast<double>(values[j]) -
                                                        view->raw_max - view->raw_log_sum)});
  }
  return true;
}

int32_t GraphBucket(int32_t n, int32_t cap) {
  int32_t b = 1;
  while (b < n && b < 32) b *= 2;
  if (n > 32) b = (n + 31) / 32 * 32;
  return std::min(b, cap);
}

std::vector<int32_t> GraphBuckets(int32_t cap) {
  std::vector<int32_t> buckets;
  for (int32_t n = 1; n <= cap; ++n) {
    const int32_t b = GraphBucket(n, cap);
    if (buckets.empty() || buckets.back() != b) buckets.push_back(b);
  }
  return buckets;
}

}  // namespace tandem::backend::cuda
