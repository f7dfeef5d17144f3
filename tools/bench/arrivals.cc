// vLLM's `bench serve` arrival process (benchmarks/serve.py: get_request):
// gamma-distributed gaps. See arrivals.h.
#include "tools/bench/arrivals.h"

#include <cmath>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tools/bench/bench_types.h"

namespace tandem::bench {

absl::StatusOr<std::vector<double>> ArrivalTimes(int32_t n, double request_rate, double burstiness,
                                                 uint64_t seed) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--num-prompts: expected >= 0, got ", n));
  }
  if (!(request_rate > 0)) {  // also NaN
    return absl::InvalidArgumentError(
        absl::StrCat("--request-rate: expected a number > 0 or inf, got ", request_rate));
  }
  if (!std::isfinite(burstiness) || !(burstiness > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--burstiness: expected a finite number > 0, got ", burstiness));
  }
  std::vector<double> times(n, 0.0);
  if (std::isinf(request_rate)) return times;
  // Gamma(shape k, scale theta) has mean k * theta = 1 / request_rate.
  const double scale = 1.0 / (request_rate * burstiness);
  if (scale == 0) return times;  // rate * burstiness overflowed: gaps below any clock
  if (!std::isfinite(scale)) {
    return absl::InvalidArgumentError(absl::StrCat("--request-rate: ", request_rate,
                                                   " with --burstiness ", burstiness,
                                                   " gives an infinite mean gap"));
  }
  const double total_s = static_cast<double>(n) / request_rate;
  if (!std::isfinite(total_s) || total_s > kMaxSendTimeS) {
    return absl::InvalidArgumentError(absl::StrCat("--request-rate: ", request_rate,
                                                   " with --num-prompts ", n, " plans a run of ",
                                                   total_s, " s (at most ", kMaxSendTimeS, " s)"));
  }
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, scale);
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) times[i] = sum += gap(rng);
  // vLLM's normalisation: the last send lands at exactly n / rate, so the
  // offered rate of a short run is the one asked for; the shape of the gaps
  // (their relative sizes) is the gamma draws'.
  if (n > 0 && sum > 0) {
    const double factor = total_s / sum;
    for (double& t : times) t *= factor;
  }
  return times;
}

}  // namespace tandem::bench
