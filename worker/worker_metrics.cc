#include "worker/worker_metrics.h"

#include <string>
#include <utility>

namespace tandem {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

ClientMetric Value(MetricType type, double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

MetricFamily Family(std::string name, std::string help, MetricType type,
                    std::vector<ClientMetric> metrics) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  f.metric = std::move(metrics);
  return f;
}

// A family with one unlabelled sample.
MetricFamily Single(std::string name, std::string help, MetricType type, double value) {
  return Family(std::move(name), std::move(help), type, {Value(type, value)});
}

// A summary without quantiles: NAME_sum and NAME_count.
MetricFamily SumCount(std::string name, std::string help, double sum, uint64_t count) {
  ClientMetric m;
  m.summary.sample_sum = sum;
  m.summary.sample_count = count;
  return Family(std::move(name), std::move(help), MetricType::Summary, {m});
}

// tandem_kv_transfer_bytes_total: direction x transport, from `c`.
MetricFamily TransportBytes(const KvTransportCounters& c) {
  std::vector<ClientMetric> metrics;
  for (const auto& [direction, bytes] :
       {std::pair{"sent", &c.bytes_sent}, std::pair{"received", &c.bytes_received}}) {
    for (size_t t = 0; t < kKvTransportLabels.size(); ++t) {
      metrics.push_back(
          Value(MetricType::Counter, static_cast<double>((*bytes)[t]),
                {{"direction", direction}, {"transport", std::string(kKvTransportLabels[t])}}));
    }
  }
  return Family("tandem_kv_transfer_bytes_total",
                "KV cache payload bytes sent to / received from peers, by transport.",
                MetricType::Counter, std::move(metrics));
}

// A counter family with direction="sent" and direction="received".
MetricFamily Directions(std::string name, std::string help, double sent, double received) {
  return Family(std::move(name), std::move(help), MetricType::Counter,
                {Value(MetricType::Counter, sent, {{"direction", "sent"}}),
                 Value(MetricType::Counter, received, {{"direction", "received"}})});
}

// The step model's gauges (see Collect's docstring).
void AddStepModel(const v1::StepModel& m, std::vector<MetricFamily>* families) {
  constexpr MetricType kGauge = MetricType::Gauge;
  families->push_back(Family(
      "tandem_step_model_coefficient", "The fitted step-time model's terms, ms.", kGauge,
      {Value(kGauge, m.base_ms(), {{"term", "base_ms"}}),
       Value(kGauge, m.prefill_ms_per_token(), {{"term", "prefill_ms_per_token"}}),
       Value(kGauge, m.prefill_ms_per_kilo_pair(), {{"term", "prefill_ms_per_kilo_pair"}}),
       Value(kGauge, m.decode_ms_per_seq(), {{"term", "decode_ms_per_seq"}}),
       Value(kGauge, m.decode_ms_per_kilo_context(), {{"term", "decode_ms_per_kilo_context"}})}));
  families->push_back(Single("tandem_step_model_prefill_tokens_per_second",
                             "Predicted prefill rate of one reference chunk, no decodes.", kGauge,
                             m.prefill_tokens_per_s()));
  families->push_back(Single("tandem_step_model_decode_step_seconds",
                             "Predicted decode step of 1 sequence at 512 tokens of context.",
                             kGauge, m.decode_step_ms() / 1000.0));
  families->push_back(Single("tandem_step_model_error_seconds",
                             "Mean absolute error of the step-time prediction, recent steps.",
                             kGauge, m.mean_abs_error_ms() / 1000.0));
  std::vector<ClientMetric> links;
  for (const auto& [peer, rate] : m.kv_link_bytes_per_s()) {
    links.push_back(Value(kGauge, rate, {{"peer", peer}}));
  }
  families->push_back(Family("tandem_kv_link_bytes_per_second",
                             "Measured KV transfer rate per prefill worker (EWMA).", kGauge,
                             std::move(links)));
}

}  // namespace

const std::vector<double>& WorkerMetrics::StepBuckets() {
  static const std::vector<double> buckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                              0.25,  0.5,    1.0,   2.5,  5.0,   10.0};
  return buckets;
}

WorkerMetrics::WorkerMetrics(std::function<v1::WorkerStatus()> status,
                             std::function<KvTransportCounters()> kv_counters)
    : status_(std::move(status)), kv_counters_(std::move(kv_counters)), step_(StepBuckets()) {
  for (auto& h : phases_) h = std::make_unique<prometheus::Histogram>(StepBuckets());
}

void WorkerMetrics::ObserveStep(double seconds) { step_.Observe(seconds); }

void WorkerMetrics::ObservePhases(const core::RequestPhases& p) {
  const double ms[kPhases.size()] = {p.placement_ms,   p.prefill_queue_ms,    p.prefill_ms,
                                     p.kv_transfer_ms, p.decode_admission_ms, p.first_decode_ms};
  for (size_t i = 0; i < kPhases.size(); ++i) {
    if (ms[i] > 0) phases_[i]->Observe(ms[i] / 1000.0);
  }
}

std::vector<MetricFamily> WorkerMetrics::Collect() const {
  const v1::WorkerStatus s = status_();
  const KvTransportCounters kv = kv_counters_ ? kv_counters_() : CountersFromStatus(s);
  constexpr MetricType kCounter = MetricType::Counter;
  constexpr MetricType kGauge = MetricType::Gauge;
  const auto d = [](auto v) { return static_cast<double>(v); };
  std::vector<MetricFamily> families;
  families.push_back(Single("tandem_prompt_tokens_total",
                            "Prompt tokens of the requests this worker accepted.", kCounter,
                            d(s.prompt_tokens_total())));
  families.push_back(Single("tandem_prompt_tokens_cached_total",
                            "Prompt tokens whose KV came from this worker's prefix cache.",
                            kCounter, d(s.prompt_tokens_cached_total())));
  families.push_back(Single("tandem_generation_tokens_total",
                            "Tokens sampled by this worker (every sample).", kCounter,
                            d(s.generation_tokens_total())));
  families.push_back(Single("tandem_prefill_tokens_computed_total",
                            "Prompt tokens whose KV this worker computed.", kCounter,
                            d(s.prefill_tokens_computed_total())));
  families.push_back(Single("tandem_prefix_cache_queries_total",
                            "Prefix-cache lookups, in tokens asked for.", kCounter,
                            d(s.prefix_cache_queried_tokens_total())));
  families.push_back(Single("tandem_prefix_cache_hits_total",
                            "Prefix-cache lookups, in tokens found.", kCounter,
                            d(s.prefix_cache_hit_tokens_total())));
  families.push_back(Single("tandem_preemptions_total",
                            "Sequences preempted (their KV freed, recomputed later).", kCounter,
                            d(s.preemptions_total())));
  families.push_back(TransportBytes(kv));
  families.push_back(Directions("tandem_kv_transfers_total", "KV transfers that ended.",
                                d(s.kv_transfers_sent_total()),
                                d(s.kv_transfers_received_total())));
  families.push_back(Directions("tandem_kv_transfer_seconds_total",
                                "Seconds the ended KV transfers took, summed per transfer.",
                                s.kv_transfer_seconds_sent_total(),
                                s.kv_transfer_seconds_received_total()));
  families.push_back(SumCount("tandem_kv_transfer_stream_seconds",
                              "Decode side: first frame to FINAL of each completed KV transfer.",
                              kv.transfer_seconds_sum, kv.transfers));
  families.push_back(SumCount("tandem_kv_load_to_first_decode_seconds",
                              "Decode side: a remote KV load's FINAL to its sequence's first "
                              "decode step.",
                              kv.load_to_first_decode_seconds_sum, kv.loads));
  const uint32_t waiting = s.waiting_requests();
  const uint32_t running = s.running_requests() > waiting ? s.running_requests() - waiting : 0;
  families.push_back(Single("tandem_num_requests_running",
                            "Requests with a sequence scheduled or waiting for remote KV.", kGauge,
                            d(running)));
  families.push_back(Single("tandem_num_requests_waiting",
                            "Requests waiting to be admitted (new or preempted).", kGauge,
                            d(waiting)));
  families.push_back(Family("tandem_kv_cache_blocks", "KV cache blocks by state.", kGauge,
                            {Value(kGauge, d(s.kv_blocks_in_use()), {{"state", "used"}}),
                             Value(kGauge, d(s.kv_blocks_cached()), {{"state", "cached"}}),
                             Value(kGauge, d(s.kv_blocks_total()), {{"state", "total"}})}));
  families.push_back(Single("tandem_kv_transfers_in_flight", "KV transfers open now.", kGauge,
                            d(s.transfers_in_flight())));
  families.push_back(Family("tandem_engine_step_duration_seconds",
                            "Wall time of engine steps that ran the model.", MetricType::Histogram,
                            {step_.Collect()}));
  std::vector<ClientMetric> phase_metrics;
  for (size_t i = 0; i < kPhases.size(); ++i) {
    phase_metrics.push_back(phases_[i]->Collect());
    phase_metrics.back().label = {{"phase", kPhases[i]}};
  }
  families.push_back(Family("tandem_worker_request_phase_seconds",
                            "Where each request's time went on this worker, by phase.",
                            MetricType::Histogram, std::move(phase_metrics)));
  AddStepModel(s.step_model(), &families);
  return families;
}

}  // namespace tandem
