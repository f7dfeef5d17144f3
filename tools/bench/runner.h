// RunBenchmark: sends a run's requests through a BenchBackend on their
// schedule and collects what each measured, as vLLM's `bench serve`
// (benchmarks/serve.py: benchmark()): warm-up first, then each request at
// its send time, at most max_concurrency in flight.
//
// Owns: the schedule (send times, concurrency slots), the progress display.
// Does not touch: how a request is sent (grpc_backend.h, openai_backend.h)
// or summarised (metrics.h).
// Threads: runs on the caller's thread; the backend's `done` callbacks
// (any thread) store their output under a mutex and wake the caller.
// Timing: std::chrono::steady_clock.
#ifndef TANDEM_TOOLS_BENCH_RUNNER_H_
#define TANDEM_TOOLS_BENCH_RUNNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/bench_types.h"

namespace tandem::bench {

struct RunOptions {
  // When each request is sent, seconds from the run's start (after the
  // warm-up); send_times_s[i] is request i's. The rule (the CLI's):
  //  - not empty (--request-rate given: arrivals.h's ArrivalTimes): used as
  //    is; it must have one finite, >= 0 entry per request.
  //  - empty: each request's own timestamp_s (a Mooncake trace), 0 for a
  //    request without one (vLLM's default rate, inf: everything at once).
  // Requests are started in request order: a request whose time is earlier
  // than its predecessor's starts right after it.
  std::vector<double> send_times_s;
  // At most this many requests in flight (--max-concurrency); 0 = no
  // limit. A request whose time has come waits for a free slot, and its
  // start_s is then when it actually starts (vLLM's semaphore).
  int32_t max_concurrency = 0;
  // Warm-up requests (--num-warmups): copies of request 0 (vLLM's "test
  // input"), sent one at a time before the run; not measured, not in the
  // outputs. A failed warm-up ends the run with UNAVAILABLE.
  int32_t num_warmups = 0;
  // Progress on stderr (false: --no-progress). On a terminal one line
  // redrawn with '\r' at every completion (ProgressBar); otherwise one
  // line each time another tenth of the requests has completed.
  bool progress = true;
};

struct RunResult {
  std::vector<RequestOutput> outputs;  // in request order; start_s from the run's start
  // Seconds from the first request's actual start to the last completion
  // (0 with no requests): the denominator of the throughputs.
  double duration_s = 0;
};

// Runs `requests` on `backend` and returns when every request has
// completed (the backend's deadlines bound that). Errors: INVALID_ARGUMENT
// naming send_times_s (wrong count, negative or not finite), max_concurrency
// or num_warmups (< 0); UNAVAILABLE "warm-up request failed: <error>".
[[nodiscard]] absl::StatusOr<RunResult> RunBenchmark(BenchBackend& backend,
                                                     const std::vector<BenchRequest>& requests,
                                                     const RunOptions& options);

// The progress line "  37/40 [###########.....] 00:12" (no '\r' or '\n'):
// `done` right-aligned to the width of `total`, a bar of 30 cells of which
// floor(30 * done / total) are '#' (all '#' when total is 0), the elapsed
// time as MM:SS (whole seconds, rounded down; HH:MM:SS from one hour).
std::string ProgressBar(int64_t done, int64_t total, double elapsed_s);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_RUNNER_H_
