// A worker's Prometheus metrics (docs/architecture.md, "Metrics"): every
// counter and gauge is read at scrape time from the same WorkerStatus
// snapshot GetStatus answers with (WorkerContext::status), so /metrics and
// GetStatus never disagree; the step-time histogram is observed by the
// engine loop (EngineCoreOptions::step_observer -> ObserveStep); the
// per-transport KV families read a KvTransportCounters snapshot
// (kv_transport_counters.h) taken in the same scrape.
//
// Owns: the metric names, types, labels and step-time buckets. Does not
// touch: the counters themselves (the engine core counts), HTTP
// (common/metrics serves any collectable).
// Threads: ObserveStep and Collect are thread-safe.
#ifndef TANDEM_WORKER_WORKER_METRICS_H_
#define TANDEM_WORKER_WORKER_METRICS_H_

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "engine/core/request.h"
#include "worker/kv_transport_counters.h"
#include "prometheus/collectable.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

class WorkerMetrics : public prometheus::Collectable {
 public:
  // Upper bounds (seconds) of tandem_engine_step_duration_seconds: 1 ms ..
  // 10 s, roughly x2.5 apart (+Inf implied).
  static const std::vector<double>& StepBuckets();

  // `status`: the worker's status snapshot (thread-safe, quick).
  // `kv_counters`: the KV data paths' counters (thread-safe, quick); null:
  // CountersFromStatus (everything over tcp, no stream or load timings),
  // right for a worker without device data paths.
  explicit WorkerMetrics(std::function<v1::WorkerStatus()> status,
                         std::function<KvTransportCounters()> kv_counters = nullptr);

  // One engine step that ran the model took `seconds`.
  void ObserveStep(double seconds);
  // One request's phases on this worker (EngineCoreOptions::phase_observer):
  // each phase it went through (> 0 ms) is observed in seconds.
  void ObservePhases(const core::RequestPhases& phases);

  // The phase label values of tandem_worker_request_phase_seconds, in
  // core::RequestPhases' field order.
  static constexpr std::array<const char*, 6> kPhases = {
      "placement", "prefill_queue", "prefill", "kv_transfer", "decode_admission", "first_decode"};

  // Families (names by Prometheus conventions, prefix tandem_, no request
  // ids in labels):
  //  counters  tandem_prompt_tokens_total, tandem_prompt_tokens_cached_total,
  //            tandem_generation_tokens_total, tandem_prefill_tokens_computed_total,
  //            tandem_prefix_cache_queries_total, tandem_prefix_cache_hits_total
  //            (tokens), tandem_preemptions_total,
  //            tandem_kv_transfer_bytes_total{direction, transport}
  //            (transport "tcp" | "nccl" | "cuda_ipc": KvTransportCounters;
  //            the sum over transports is GetStatus's kv_bytes_*_total),
  //            tandem_kv_transfers_total{direction},
  //            tandem_kv_transfer_seconds_total{direction}
  //            (direction "sent" | "received"; HELLO .. end of each
  //            transfer, summed);
  //  summaries (_sum and _count, no quantiles)
  //            tandem_kv_transfer_stream_seconds (D: first frame .. FINAL
  //            of each completed transfer),
  //            tandem_kv_load_to_first_decode_seconds (D: FINAL .. the
  //            sequence's first decode step);
  //  gauges    tandem_num_requests_running (running_requests minus
  //            waiting_requests), tandem_num_requests_waiting,
  //            tandem_kv_cache_blocks{state="used"|"cached"|"total"},
  //            tandem_kv_transfers_in_flight;
  //  gauges    the step model (WorkerStatus.step_model):
  //            tandem_step_model_coefficient{term="base_ms" |
  //            "prefill_ms_per_token" | "prefill_ms_per_kilo_pair" |
  //            "decode_ms_per_seq" | "decode_ms_per_kilo_context"},
  //            tandem_step_model_prefill_tokens_per_second,
  //            tandem_step_model_decode_step_seconds,
  //            tandem_step_model_error_seconds (mean absolute),
  //            tandem_kv_link_bytes_per_second{peer} (per prefill worker);
  //  histogram tandem_engine_step_duration_seconds (StepBuckets()),
  //            tandem_worker_request_phase_seconds{phase} (kPhases,
  //            StepBuckets()).
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::function<v1::WorkerStatus()> status_;
  const std::function<KvTransportCounters()> kv_counters_;  // may be null
  prometheus::Histogram step_;
  std::array<std::unique_ptr<prometheus::Histogram>, kPhases.size()> phases_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_METRICS_H_
