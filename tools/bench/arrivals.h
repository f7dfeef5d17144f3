// When `tandem bench` sends each request: vLLM's `bench serve` arrival
// process (benchmarks/serve.py: get_request). Gaps between sends are drawn
// from a gamma distribution with shape `burstiness` and scale
// 1 / (request_rate * burstiness), so the mean rate is request_rate and
// burstiness 1 is a Poisson process (exponential gaps); < 1 is burstier,
// > 1 more regular. request_rate = +inf sends everything at time 0.
#ifndef TANDEM_TOOLS_BENCH_ARRIVALS_H_
#define TANDEM_TOOLS_BENCH_ARRIVALS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::bench {

// Send times of n requests, seconds from the run's start, non-decreasing;
// the first is the first gap (vLLM sends request 0 at once: so does this,
// times[0] = 0). Deterministic for a given seed (std::mt19937_64 and
// libstdc++'s gamma_distribution). INVALID_ARGUMENT naming --request-rate
// (not > 0, NaN) or --burstiness (not finite > 0); n < 0 likewise.
absl::StatusOr<std::vector<double>> ArrivalTimes(int32_t n, double request_rate, double burstiness,
                                                 uint64_t seed);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_ARRIVALS_H_
