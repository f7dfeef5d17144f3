#include "router/router_metrics.h"

#include <cctype>
#include <string>

#include "absl/status/status.h"

namespace tandem::router {
namespace {

constexpr const char* kRouteLabels[] = {"none", "local", "remote"};
constexpr const char* kReasonLabels[] = {"stop", "length", "context", "cancelled", "error"};
constexpr int kStop = 0, kLength = 1, kContext = 2, kCancelled = 3, kError = 4;

// The finish_reason label's index for a call that ended with `code`.
int ReasonIndex(absl::StatusCode code, v1::FinishReason reason) {
  if (code == absl::StatusCode::kCancelled) return kCancelled;
  if (code != absl::StatusCode::kOk) return kError;
  switch (reason) {
    case v1::FINISH_STOP:
      return kStop;
    case v1::FINISH_LENGTH:
      return kLength;
    case v1::FINISH_CONTEXT:
      return kContext;
    case v1::FINISH_CANCELLED:
      return kCancelled;
    default:
      return kError;  // an OK end names its reason; none is a bug: counted as error
  }
}

// "INVALID_ARGUMENT" -> "invalid_argument".
std::string CodeLabel(absl::StatusCode code) {
  std::string s = absl::StatusCodeToString(code);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

const std::vector<double>& RouterMetrics::TimeToFirstTokenBuckets() {
  static const std::vector<double> b = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                        0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                        20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
  return b;
}

const std::vector<double>& RouterMetrics::TokenLatencyBuckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                        0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,   2.5,
                                        5.0,   7.5,    10.0,  20.0, 40.0,  80.0};
  return b;
}

const std::vector<double>& RouterMetrics::RequestLatencyBuckets() {
  static const std::vector<double> b = {0.01, 0.025, 0.05,  0.1,   0.3,   0.5,    0.8,   1.0,  1.5,
                                        2.0,  2.5,   5.0,   10.0,  15.0,  20.0,   30.0,  40.0, 50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return b;
}

const std::vector<double>& RouterMetrics::PhaseBuckets() {
  static const std::vector<double> b = [] {
    std::vector<double> v = {0.0001, 0.00025, 0.0005};
    const std::vector<double>& ttft = TimeToFirstTokenBuckets();
    v.insert(v.end(), ttft.begin(), ttft.end());
    return v;
  }();
  return b;
}

RouterMetrics::RouterMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& requests = prometheus::BuildCounter()
                       .Name("tandem_requests_total")
                       .Help(
                           "Generate calls ended at the router, by route and finish reason "
                           "(one per request; n > 1: sample 0's reason)")
                       .Register(*registry_);
  for (int r = 0; r < 3; ++r) {
    for (int f = 0; f < kReasons; ++f) {
      requests_[r][f] =
          &requests.Add({{"route", kRouteLabels[r]}, {"finish_reason", kReasonLabels[f]}});
    }
  }
  errors_family_ = &prometheus::BuildCounter()
                        .Name("tandem_request_errors_total")
                        .Help("Generate calls ended at the router with an error, by gRPC code")
                        .Register(*registry_);
  auto histogram = [this](const char* name, const char* help, const std::vector<double>& buckets) {
    return &prometheus::BuildHistogram()
                .Name(name)
                .Help(help)
                .Register(*registry_)
                .Add({}, buckets);
  };
  ttft_ = histogram("tandem_time_to_first_token_seconds",
                    "Arrival at the router to the first token sent to the client",
                    TimeToFirstTokenBuckets());
  itl_ = histogram("tandem_inter_token_latency_seconds",
                   "Gap between two messages carrying tokens of one sample, at the router",
                   TokenLatencyBuckets());
  tpot_ = histogram("tandem_time_per_output_token_seconds",
                    "Per sample with >= 2 tokens: (last - first token sent) / (tokens - 1)",
                    TokenLatencyBuckets());
  e2e_ = histogram("tandem_e2e_request_latency_seconds",
                   "Arrival at the router to the end of the client's stream (admitted requests)",
                   RequestLatencyBuckets());
  queue_ = histogram("tandem_request_queue_time_seconds",
                     "Time in the router's admission queue (0 when admitted at once)",
                     RequestLatencyBuckets());
  auto& phases = prometheus::BuildHistogram()
                     .Name("tandem_request_phase_seconds")
                     .Help(
                         "Where a request's time to first token went, per phase (sample 0's "
                         "RequestTiming; kv_transfer, decode_admission, first_decode: remote "
                         "route only)")
                     .Register(*registry_);
  for (int p = 0; p < kPhases; ++p) {
    phases_[p] = &phases.Add({{"phase", kPhaseLabels[p]}}, PhaseBuckets());
  }
  auto counter = [this](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add({});
  };
  prompt_tokens_ =
      counter("tandem_prompt_tokens_total", "Prompt tokens of requests admitted at the router");
  generation_tokens_ = counter("tandem_generation_tokens_total",
                               "Tokens the router sent to clients (every sample's)");
  prompt_tokens_cached_ =
      counter("tandem_prompt_tokens_cached_total",
              "Prompt tokens of finished requests found in the prefilling worker's prefix cache");
  auto gauge = [this](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add({});
  };
  running_ = gauge("tandem_num_requests_running",
                   "Generate calls holding a router admission slot (router.max_inflight)");
  waiting_ = gauge("tandem_num_requests_waiting",
                   "Generate calls in the router's admission queue (router.max_queued)");
}

Admission::Observer RouterMetrics::AdmissionObserver() {
  Admission::Observer o;
  o.on_counts = [this](int running, int queued) { SetAdmissionCounts(running, queued); };
  o.on_waited = [this](absl::Duration waited) { ObserveQueueTime(waited); };
  return o;
}

void RouterMetrics::SetAdmissionCounts(int running, int queued) {
  running_->Set(running);
  waiting_->Set(queued);
}

void RouterMetrics::ObserveQueueTime(absl::Duration waited) { queue_->Observe(Seconds(waited)); }

void RouterMetrics::RequestStarted(int64_t prompt_tokens) {
  prompt_tokens_->Increment(static_cast<double>(prompt_tokens));
}

void RouterMetrics::RequestRefused(absl::StatusCode code) {
  CountRequest(Route::kNone, code, v1::FINISH_NONE);
}

void RouterMetrics::CountRequest(Route route, absl::StatusCode code, v1::FinishReason reason) {
  requests_[static_cast<int>(route)][ReasonIndex(code, reason)]->Increment();
  if (code != absl::StatusCode::kOk) ErrorCounter(code).Increment();
}

prometheus::Counter& RouterMetrics::ErrorCounter(absl::StatusCode code) {
  int i = static_cast<int>(code);
  if (i < 0 || i >= static_cast<int>(errors_.size())) {
    code = absl::StatusCode::kUnknown;
    i = static_cast<int>(code);
  }
  absl::MutexLock lock(&errors_mu_);
  if (errors_[i] == nullptr) errors_[i] = &errors_family_->Add({{"code", CodeLabel(code)}});
  return *errors_[i];
}

RouterMetrics::Totals RouterMetrics::totals() const {
  Totals t;
  for (const auto& route : requests_) {
    for (const prometheus::Counter* c : route) t.requests += static_cast<uint64_t>(c->Value());
  }
  {
    absl::MutexLock lock(&errors_mu_);
    for (const prometheus::Counter* c : errors_) {
      if (c != nullptr) t.request_errors += static_cast<uint64_t>(c->Value());
    }
  }
  t.prompt_tokens = static_cast<uint64_t>(prompt_tokens_->Value());
  t.generation_tokens = static_cast<uint64_t>(generation_tokens_->Value());
  t.prompt_tokens_cached = static_cast<uint64_t>(prompt_tokens_cached_->Value());
  return t;
}

RequestTimer::RequestTimer(RouterMetrics* metrics, absl::Time arrival, uint32_t samples,
                           int64_t prompt_tokens)
    : metrics_(metrics), arrival_(arrival), prompt_tokens_(prompt_tokens), samples_(samples) {}

void RequestTimer::TokensSent(uint32_t sample, int64_t n, absl::Time now) {
  if (metrics_ == nullptr || finished_ || sample >= samples_.size() || n <= 0) return;
  metrics_->generation_tokens_->Increment(static_cast<double>(n));
  if (!first_token_sent_) {
    first_token_sent_ = true;
    metrics_->ttft_->Observe(Seconds(now - arrival_));
  }
  Sample& s = samples_[sample];
  if (s.tokens == 0) {
    s.first = now;
  } else {
    metrics_->itl_->Observe(Seconds(now - s.last));
  }
  s.last = now;
  s.tokens += n;
}

void RequestTimer::PhasesKnown(const v1::RequestTiming& timing, bool remote) {
  if (metrics_ == nullptr || phases_observed_) return;
  phases_observed_ = true;
  const double ms[RouterMetrics::kPhases] = {
      timing.router_queue_ms(), timing.placement_ms(),   timing.prefill_queue_ms(),
      timing.prefill_ms(),      timing.kv_transfer_ms(), timing.decode_admission_ms(),
      timing.first_decode_ms()};
  const int observed = remote ? RouterMetrics::kPhases : RouterMetrics::kLocalPhases;
  for (int p = 0; p < observed; ++p) metrics_->phases_[p]->Observe(ms[p] / 1000.0);
}

void RequestTimer::Finished(absl::Time now, RouterMetrics::Route route, absl::StatusCode code,
                            v1::FinishReason first_sample_reason, int64_t prompt_tokens_cached) {
  if (metrics_ == nullptr || finished_) return;
  finished_ = true;
  metrics_->e2e_->Observe(Seconds(now - arrival_));
  for (const Sample& s : samples_) {
    if (s.tokens >= 2) metrics_->tpot_->Observe(Seconds(s.last - s.first) / (s.tokens - 1));
  }
  metrics_->prompt_tokens_cached_->Increment(static_cast<double>(prompt_tokens_cached));
  metrics_->CountRequest(route, code, first_sample_reason);
  FinishedRequest recent;
  recent.arrival = arrival_;
  recent.finished = now;
  recent.prompt_tokens = prompt_tokens_;
  recent.cached_tokens = prompt_tokens_cached;
  if (!samples_.empty() && samples_[0].tokens > 0) {
    const Sample& s0 = samples_[0];
    recent.output_tokens = s0.tokens;
    recent.ttft_s = Seconds(s0.first - arrival_);
    if (s0.tokens >= 2) recent.tpot_s = Seconds(s0.last - s0.first) / (s0.tokens - 1);
  }
  metrics_->recent_.Add(recent);
}

}  // namespace tandem::router
