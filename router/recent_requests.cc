#include "router/recent_requests.h"

#include <algorithm>
#include <vector>

namespace tandem::router {
namespace {

// The nearest-rank percentile of `v` (sorted here); -1 when empty.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::max(0.0, p * static_cast<double>(v.size()) - 1e-9));
  return v[std::min(rank, v.size() - 1)];
}

}  // namespace

void RecentRequests::Add(const FinishedRequest& request) {
  absl::MutexLock lock(&mu_);
  requests_.push_back(request);
  while (requests_.size() > static_cast<size_t>(kMaxRequests)) requests_.pop_front();
}

RecentLoad RecentRequests::Window(absl::Time now, absl::Duration window, double ttft_slo_s,
                                  double tpot_slo_s) const {
  RecentLoad load;
  std::vector<double> ttfts, tpots;
  double prompt = 0, uncached = 0, output = 0;
  int met = 0;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = requests_.rbegin(); it != requests_.rend(); ++it) {
      if (it->finished <= now - window) break;
      if (it->finished > now) continue;
      ++load.count;
      prompt += static_cast<double>(it->prompt_tokens);
      uncached += static_cast<double>(it->prompt_tokens - it->cached_tokens);
      output += static_cast<double>(it->output_tokens);
      if (it->ttft_s >= 0) ttfts.push_back(it->ttft_s);
      if (it->tpot_s >= 0) tpots.push_back(it->tpot_s);
      const bool ttft_ok = ttft_slo_s <= 0 || (it->ttft_s >= 0 && it->ttft_s <= ttft_slo_s);
      const bool tpot_ok = tpot_slo_s <= 0 || it->tpot_s < 0 || it->tpot_s <= tpot_slo_s;
      if (ttft_ok && tpot_ok) ++met;
    }
  }
  if (load.count == 0) return load;
  const double n = load.count;
  load.request_rate = n / absl::ToDoubleSeconds(window);
  load.mean_prompt_tokens = prompt / n;
  load.mean_uncached_prompt_tokens = uncached / n;
  load.mean_output_tokens = output / n;
  load.ttft_p90_s = Percentile(std::move(ttfts), 0.9);
  load.tpot_p90_s = Percentile(std::move(tpots), 0.9);
  load.slo_attainment = met / n;
  return load;
}

}  // namespace tandem::router
