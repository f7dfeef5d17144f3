// The host half of the CUDA backend's sampling seam (DESIGN.md, GPU
// workers; sampling_view.h): which rows the device reduction can serve,
// and the sampling::SamplingView built from what crosses to the host for
// such a row (its RowStats and the first ids of its raw candidate order,
// cuda_kernels.h's LaunchRowStats / LaunchRowTopK). Every other row is
// copied whole and reduced by sampling::BuildSamplingView.
//
// Owns: that decision and that arithmetic, pure functions (unit-tested on
// the CPU against BuildSamplingView). Does not touch: the device, the
// draw. Threads: pure functions.
#ifndef TANDEM_ENGINE_BACKEND_CUDA_DEVICE_SAMPLING_H_
#define TANDEM_ENGINE_BACKEND_CUDA_DEVICE_SAMPLING_H_

#include <cstdint>
#include <vector>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/sampling/logits_processor.h"
#include "engine/sampling/sampling_options.h"
#include "engine/sampling/sampling_view.h"

namespace tandem::backend::cuda {

// How one sampled row is reduced.
enum class DeviceRowMode {
  kGreedy,  // candidates[0] = RowStats.argmax (identity processors)
  kTopK,    // candidates from the device top-K (identity or temperature)
  kHost,    // the whole row on the host (BuildSamplingView)
};

struct DeviceRowPlan {
  DeviceRowMode mode = DeviceRowMode::kHost;
  bool identity = false;  // the processors change no bit (processed == raw)
  int32_t k = 1;          // the view's initial K (BuildSamplingView's)
  int32_t top_n = 0;      // raw_top entries
  int32_t fetch = 0;      // device top-K ids this row asks for first
};

// The plan of a row of `vocab` logits for `options` (valid) and `history`:
//   kGreedy: temperature 0 with identity processors (K = 1).
//   kTopK: temperature > 0 whose processors are the identity or the
//     temperature alone (x / T, correctly rounded, is weakly monotone, so
//     the processed order is the raw order up to the ties it makes), with
//     top_k on (K = min(vocab, max(top_k, 64)) <= kMaxDeviceTopK) or,
//     top_k off, min_p > 0 (K = 64, widened x4 while the last candidate
//     passes min_p, up to what the device fetched).
//   kHost: everything else: penalties, logit bias or the min_tokens mask
//     in effect; top_k beyond kMaxDeviceTopK; top_k and min_p off at
//     temperature > 0 (the view's normaliser sums the whole vocabulary in
//     index order, and top_p == 1 keeps every id).
// fetch: greedy, top_n; identity, max(K, top_n); a temperature,
// max(min(2K, kMaxDeviceTopK), top_n) (ids past the K-th tell its ties
// apart). Always <= kMaxDeviceTopK; the caller caps it at vocab.
DeviceRowPlan PlanDeviceRow(const sampling::SamplingOptions& options,
                            const sampling::TokenHistory& history, int32_t vocab);

// Builds `view` (as BuildSamplingView would from the whole row) for a
// kGreedy or kTopK row from its statistics and the first `fetched` ids of
// its raw candidate order with their raw logits (ids / values; may be null
// when fetched == 0). Returns false, `view` then garbage, when `fetched`
// does not determine the view: fewer than top_n or K ids, a min_p view
// wider than `fetched`, or (a temperature, fetched < vocab) a K-th
// processed candidate not strictly above the processed key of the last
// fetched id (an id not fetched could tie with it and come first). The
// caller then fetches more or builds the view on the host.
// raw_max and raw_log_sum are stats.max and stats.log_sum; normaliser 0.
bool BuildViewFromTopK(const DeviceRowPlan& plan, const sampling::SamplingOptions& options,
                       const RowStats& stats, const int32_t* ids, const float* values,
                       int32_t fetched, int32_t vocab, sampling::SamplingView* view);

// The CUDA-graph bucket of a decode step of n sequences (1 <= n <= cap):
// 1, 2, 4, 8, 16, 32, then multiples of 32, capped at `cap`.
int32_t GraphBucket(int32_t n, int32_t cap);
// Every bucket GraphBucket returns for n in [1, cap], ascending (empty for
// cap < 1).
std::vector<int32_t> GraphBuckets(int32_t cap);

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_DEVICE_SAMPLING_H_
