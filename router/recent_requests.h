// The router's recent finished requests, as the role planner reads the
// load (router/planner.h, issue #35): arrival rate, prompt and output
// lengths, and TTFT/TPOT percentiles over a sliding window.
//
// Owns: a bounded list of finished requests (the newest kMaxRequests).
// Threads: thread-safe (RequestTimer::Finished adds from gRPC threads, the
// planner reads from its own).
#ifndef TANDEM_ROUTER_RECENT_REQUESTS_H_
#define TANDEM_ROUTER_RECENT_REQUESTS_H_

#include <cstdint>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::router {

// One request that got an admission slot and ended.
struct FinishedRequest {
  absl::Time arrival;
  absl::Time finished;
  int64_t prompt_tokens = 0;  // BOS included
  int64_t cached_tokens = 0;  // prefix-cache hit where it was prefilled
  int64_t output_tokens = 0;  // sample 0's tokens sent
  double ttft_s = -1;         // -1: no token was sent
  double tpot_s = -1;         // sample 0's, -1 with < 2 tokens
};

// What the planner reads of a window (all 0 when it holds no request).
struct RecentLoad {
  int count = 0;            // requests that ended in the window
  double request_rate = 0;  // arrivals in the window / its length, req/s
  double mean_prompt_tokens = 0;
  double mean_uncached_prompt_tokens = 0;  // prompt - cached
  double mean_output_tokens = 0;
  double ttft_p90_s = -1;  // -1: no sample
  double tpot_p90_s = -1;
  // Fraction of the window's requests meeting both `ttft_slo_s` and
  // `tpot_slo_s` given to Window (1 with none given).
  double slo_attainment = 1;
};

class RecentRequests {
 public:
  static constexpr int kMaxRequests = 4096;
  void Add(const FinishedRequest& request);
  // The requests that finished in (now - window, now]. SLOs <= 0: unset.
  RecentLoad Window(absl::Time now, absl::Duration window, double ttft_slo_s = 0,
                    double tpot_slo_s = 0) const;

 private:
  mutable absl::Mutex mu_;
  std::deque<FinishedRequest> requests_ ABSL_GUARDED_BY(mu_);  // by finish time
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_RECENT_REQUESTS_H_
