// The router's Prometheus metrics: the user's view of every Generate call,
// measured where the client's stream is written (a gRPC client's, or the
// HTTP front end's, which calls the router's own Generate in-process).
// docs/architecture.md "Router metrics" lists each metric, its type, unit,
// buckets and where it is measured.
//
//   tandem_requests_total{route, finish_reason}    counter, one per Generate
//       call when its stream ended. route: "local" | "remote" (the route the
//       client's first message named) | "none" (never reached a decode
//       worker: refused, dropped from the admission queue, or no healthy
//       decode worker). finish_reason: for a call that ended OK, sample 0's
//       reason ("stop" | "length" | "context" | "cancelled"; n > 1 counts
//       the request once, by its first sample); for an error, "cancelled"
//       (gRPC CANCELLED: the client went away) or "error" (any other code).
//   tandem_request_errors_total{code}              counter, one per Generate
//       call that ended with a non-OK status (lowercase gRPC code name,
//       "invalid_argument", "resource_exhausted", "unauthenticated",
//       "cancelled", ...): its sum equals tandem_requests_total with
//       finish_reason "cancelled" or "error".
//   tandem_time_to_first_token_seconds             histogram: arrival at the
//       router -> the first message carrying tokens queued for the client.
//   tandem_inter_token_latency_seconds             histogram: per sample,
//       each gap between two messages carrying its tokens.
//   tandem_time_per_output_token_seconds           histogram: per sample
//       with >= 2 tokens, (last token's message - first token's message) /
//       (tokens - 1) (vLLM's definition; n = 1: per request).
//   tandem_e2e_request_latency_seconds             histogram: arrival ->
//       stream finished, every request that got an admission slot.
//   tandem_request_queue_time_seconds              histogram: time in the
//       admission queue, 0 when admitted at once; also for a request
//       dropped from the queue (deadline, cancel); not for a refusal.
//   tandem_request_phase_seconds{phase}            histogram: where a request's
//       TTFT went (RequestTiming, router/request_timing.h), one observation
//       per phase and request, from sample 0's last message. phase:
//       "router_queue" | "placement" | "prefill_queue" | "prefill" (both
//       routes; their sum is the request's TTFT) | "kv_transfer" |
//       "decode_admission" | "first_decode" (remote route only: they are
//       0 on the local route and not observed there).
//   tandem_prompt_tokens_total                     counter: prompt tokens of
//       requests that got an admission slot.
//   tandem_generation_tokens_total                 counter: tokens written
//       to clients, every sample's, each once (= the sum of the
//       completion_tokens clients saw).
//   tandem_prompt_tokens_cached_total              counter: per finished
//       request, its cached_prompt_tokens (prefix-cache hit on the
//       prefilling worker).
//   tandem_num_requests_running / _waiting         gauges: admission slots
//       held / requests in the admission queue (router.max_inflight,
//       router.max_queued).
// No label carries a request id. The worker processes export metrics of the
// same names from their own engine's view (their own /metrics).
//
// Threads: every method of RouterMetrics is thread-safe (prometheus-cpp's
// metrics are). A RequestTimer is not: its owner serializes its calls.
#ifndef TANDEM_ROUTER_ROUTER_METRICS_H_
#define TANDEM_ROUTER_ROUTER_METRICS_H_

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/admission.h"
#include "router/recent_requests.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::router {

class RouterMetrics {
 public:
  // The route label of a finished request.
  enum class Route { kNone = 0, kLocal = 1, kRemote = 2 };

  // Histogram bucket upper bounds in seconds (+Inf implied), vLLM's lists
  // for the same metrics, extended below where a CPU model is faster.
  // tandem_time_to_first_token_seconds: vLLM's, 0.001 .. 2560.
  static const std::vector<double>& TimeToFirstTokenBuckets();
  // tandem_inter_token_latency_seconds and _time_per_output_token_seconds:
  // 0.001, 0.0025, 0.005, then vLLM's 0.01 .. 80.
  static const std::vector<double>& TokenLatencyBuckets();
  // tandem_e2e_request_latency_seconds and _request_queue_time_seconds:
  // 0.01, 0.025, 0.05, 0.1, then vLLM's request latency list 0.3 .. 7680.
  static const std::vector<double>& RequestLatencyBuckets();
  // tandem_request_phase_seconds: 0.0001, 0.00025, 0.0005, then the TTFT
  // list (a phase may take microseconds).
  static const std::vector<double>& PhaseBuckets();

  // The phase label values of tandem_request_phase_seconds, in
  // RequestTiming's field order; the first kLocalPhases are observed on
  // both routes, the rest on the remote route only.
  static constexpr int kPhases = 7;
  static constexpr int kLocalPhases = 4;
  static constexpr const char* kPhaseLabels[kPhases] = {
      "router_queue", "placement",        "prefill_queue", "prefill",
      "kv_transfer",  "decode_admission", "first_decode"};

  // What the router's GetStatus reports (WorkerStatus.router_*_total), read
  // from the same counters /metrics serves.
  struct Totals {
    uint64_t requests = 0;              // sum of tandem_requests_total
    uint64_t request_errors = 0;        // sum of tandem_request_errors_total
    uint64_t prompt_tokens = 0;         // tandem_prompt_tokens_total
    uint64_t generation_tokens = 0;     // tandem_generation_tokens_total
    uint64_t prompt_tokens_cached = 0;  // tandem_prompt_tokens_cached_total
  };

  // Registers every metric in a new registry; the labelled series of
  // tandem_requests_total exist (at 0) from the start.
  RouterMetrics();
  RouterMetrics(const RouterMetrics&) = delete;
  RouterMetrics& operator=(const RouterMetrics&) = delete;

  // The registry to serve on /metrics (common/metrics' ServeMetrics).
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Callbacks for Admission (its Observer): the two gauges and the
  // queue-time histogram. This RouterMetrics must outlive the Admission.
  Admission::Observer AdmissionObserver();
  // The admission counts now (tandem_num_requests_running / _waiting).
  void SetAdmissionCounts(int running, int queued);
  // One request's time in the admission queue (0: admitted at once).
  void ObserveQueueTime(absl::Duration waited);

  // A request got an admission slot: its prompt's tokens are counted.
  void RequestStarted(int64_t prompt_tokens);
  // A Generate call ended with `code` (not OK) before it got an admission
  // slot: bad metadata or request, API key refusal, router at capacity,
  // shutting down, dropped from the queue. Counted with route "none".
  void RequestRefused(absl::StatusCode code);

  Totals totals() const;

  // The recent finished requests (the role planner's load, recent_requests.h).
  const RecentRequests& recent() const { return recent_; }

 private:
  friend class RequestTimer;
  // finish_reason label values, in label order.
  static constexpr int kReasons = 5;  // stop, length, context, cancelled, error

  // Counts one ended call in tandem_requests_total and, for a non-OK code,
  // tandem_request_errors_total.
  void CountRequest(Route route, absl::StatusCode code, v1::FinishReason reason);
  prometheus::Counter& ErrorCounter(absl::StatusCode code);

  const std::shared_ptr<prometheus::Registry> registry_;
  // [route][reason] of tandem_requests_total.
  std::array<std::array<prometheus::Counter*, kReasons>, 3> requests_{};
  prometheus::Family<prometheus::Counter>* errors_family_;
  mutable absl::Mutex errors_mu_;
  // By absl::StatusCode value (0..16); created on first use.
  std::array<prometheus::Counter*, 17> errors_ ABSL_GUARDED_BY(errors_mu_){};
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* tpot_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_;
  std::array<prometheus::Histogram*, kPhases> phases_{};  // by kPhaseLabels
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* prompt_tokens_cached_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  RecentRequests recent_;
};

// One admitted request's timings as its client sees them, from its arrival
// at the router to the end of its stream. Times are passed in (the caller's
// clock: absl::Now() in the router, synthetic in tests).
// Threads: none of its own; not thread-safe (GenerateCall calls it under its
// lock).
class RequestTimer {
 public:
  // `metrics` may be null (nothing is recorded). `arrival`: when the call
  // reached the router. `samples`: the request's n (>= 1). `prompt_tokens`:
  // its prompt's (for RouterMetrics::recent()).
  RequestTimer(RouterMetrics* metrics, absl::Time arrival, uint32_t samples,
               int64_t prompt_tokens = 0);

  // `n` >= 1 tokens of sample `sample` were queued for the client in one
  // message at `now`: counts them in tandem_generation_tokens_total and
  // observes the request's first token (TTFT) or the sample's gap since
  // its previous message (inter-token latency). A sample index >= n is
  // ignored.
  void TokensSent(uint32_t sample, int64_t n, absl::Time now);

  // The call's stream ended at `now` with `code`; `first_sample_reason`:
  // sample 0's finish reason (used when `code` is OK); `prompt_tokens_cached`:
  // the cached_prompt_tokens the request reported. Observes the end-to-end
  // latency and each sample's time per output token, and counts the
  // request. Later calls do nothing.
  void Finished(absl::Time now, RouterMetrics::Route route, absl::StatusCode code,
                v1::FinishReason first_sample_reason, int64_t prompt_tokens_cached);

  // Sample 0's last message carried `timing`, on the remote route if
  // `remote`: observes its phases in tandem_request_phase_seconds (the
  // first call only; the remote-only phases only if `remote`).
  void PhasesKnown(const v1::RequestTiming& timing, bool remote);

 private:
  struct Sample {
    int64_t tokens = 0;
    absl::Time first;  // its first message with tokens
    absl::Time last;   // its latest one
  };
  RouterMetrics* const metrics_;
  const absl::Time arrival_;
  const int64_t prompt_tokens_;
  std::vector<Sample> samples_;
  bool first_token_sent_ = false;
  bool phases_observed_ = false;
  bool finished_ = false;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROUTER_METRICS_H_
