// When `tandem bench` sends each request: vLLM's `bench serve` arrival
// process (benchmarks/serve.py: get_request). Gaps between sends are drawn
// from a gamma distribution with shape `burstiness` and scale
// 1 / (request_rate * burstiness), so the mean rate is request_rate and
// burstiness 1 is a Poisson process (exponential gaps); < 1 is burstier,
// > 1 more regular. As current vLLM does, the send times (the running sums
// of the n gaps, request 0 included) are then scaled so the last send is at
// exactly n / request_rate: the offered rate of a short run is the one
// asked for (without it, a 16-request Poisson run's span varies by ±25%,
// and so does every per-second result). request_rate = +inf sends
// everything at time 0.
#ifndef TANDEM_TOOLS_BENCH_ARRIVALS_H_
#define TANDEM_TOOLS_BENCH_ARRIVALS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::bench {

// Send times of n requests, seconds from the run's start, non-decreasing:
// times[i] = (g_0 + ... + g_i) * (n / rate) / (g_0 + ... + g_{n-1}) with g
// the gamma draws, so times[n-1] = n / rate and times[0] > 0 (vLLM delays
// request 0 by its gap too). Deterministic for a given seed and n
// (std::mt19937_64 and libstdc++'s gamma_distribution). INVALID_ARGUMENT
// naming --request-rate (not > 0, NaN, or n / rate not finite) or
// --burstiness (not finite > 0); n < 0 names --num-prompts.
[[nodiscard]] absl::StatusOr<std::vector<double>> ArrivalTimes(int32_t n, double request_rate,
                                                               double burstiness, uint64_t seed);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_ARRIVALS_H_
