// The one clock of `tandem bench`'s timings: std::chrono::steady_clock
// (monotonic; a wall-clock step cannot bend a TTFT), read as seconds.
#ifndef TANDEM_TOOLS_BENCH_CLOCK_H_
#define TANDEM_TOOLS_BENCH_CLOCK_H_

#include <chrono>

namespace tandem::bench {

using Clock = std::chrono::steady_clock;

// Seconds from `from` to `to` (negative when `to` is earlier).
inline double SecondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_CLOCK_H_
