// Statistics of a `tandem bench` run, as vLLM's `bench serve` computes and
// names them (benchmarks/serve.py: calculate_metrics, the result JSON).
//
//   TTFT   send -> first token, per request
//   TPOT   (E2EL - TTFT) / (output_tokens - 1), per request with > 1 token
//   ITL    every gap between token-bearing chunks, over all requests
//   E2EL   send -> end of stream, per request
// Percentiles are numpy.percentile's default (linear interpolation between
// closest ranks: rank = p/100 * (n-1)); std is the population standard
// deviation (numpy.std); an empty list gives 0 for every statistic.
// Goodput (DistServe, Zhong et al., OSDI 2024; vLLM `--goodput`): completed
// requests meeting every given SLO (TTFT, TPOT, E2EL <= the limit in ms; a
// request with one token has TPOT 0) per second of the run.
#ifndef TANDEM_TOOLS_BENCH_METRICS_H_
#define TANDEM_TOOLS_BENCH_METRICS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "tools/bench/bench_types.h"

namespace tandem::bench {

// SLO limits of --goodput, milliseconds; absent = not checked.
struct SloSpec {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2el_ms;
};

// Parses --goodput's items ("ttft:500", "tpot:50", "e2el:2000"; each name at
// most once, value a finite number > 0). INVALID_ARGUMENT naming the item:
// unknown name (not ttft, tpot or e2el), missing ':', bad number, repeated
// name, or no items.
[[nodiscard]] absl::StatusOr<SloSpec> ParseGoodput(const std::vector<std::string>& items);

// Parses --metric-percentiles ("50,90,99": comma-separated numbers in
// (0, 100]). INVALID_ARGUMENT naming the bad item.
[[nodiscard]] absl::StatusOr<std::vector<double>> ParsePercentiles(const std::string& text);

// numpy.percentile(values, p) with linear interpolation; `values` need not
// be sorted; 0 when empty. p in [0, 100].
double Percentile(std::vector<double> values, double p);

// mean / median / std / percentiles of one latency, milliseconds.
struct LatencySummary {
  double mean_ms = 0;
  double median_ms = 0;
  double std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value), in the order asked
};

// Everything the table and the JSON print. Throughputs per second of
// `duration_s` (the wall time of the measured requests, warm-ups excluded).
struct BenchmarkMetrics {
  int32_t completed = 0;  // successful requests
  int32_t failed = 0;
  int64_t total_input_tokens = 0;   // over completed requests
  int64_t total_output_tokens = 0;  // over completed requests
  double duration_s = 0;
  double request_throughput = 0;          // completed / s
  std::optional<double> request_goodput;  // SLO-meeting completed / s; absent without --goodput
  double output_throughput = 0;           // output tokens / s
  double total_token_throughput = 0;      // (input + output) tokens / s
  // Peak of output tokens per 1-second bucket of completion times of
  // tokens, and peak number of requests in flight (vLLM's
  // max_output_tokens_per_s / max_concurrent_requests). Exactly as
  // serve.py, over successful outputs: buckets are whole seconds from the
  // earliest start_s; a request has one token event at start_s + ttft_s and
  // one more after each itl_s gap (cumulative), so a chunk of several
  // tokens counts once; it is in flight in every bucket from
  // int(start_s - origin) to int(start_s + latency_s - origin), both
  // included. Each is the maximum over all buckets (not necessarily the
  // same one); 0 without successes.
  double max_output_tokens_per_s = 0;
  int32_t max_concurrent_requests = 0;
  LatencySummary ttft, tpot, itl, e2el;
};

// Computes the metrics of `outputs` (failed ones count only in `failed`).
// `percentiles` as ParsePercentiles returns them. With duration_s <= 0 the
// per-second rates are 0 (serve.py would divide by zero).
BenchmarkMetrics ComputeMetrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                const std::optional<SloSpec>& slo,
                                const std::vector<double>& percentiles);

// What the run was, for the table header and the JSON.
struct RunInfo {
  std::string date;      // "20261202-153000" (vLLM's %Y%m%d-%H%M%S), local time
  std::string backend;   // "tandem-grpc" | "openai"
  std::string model_id;  // GetModelInfo.name / the served model name
  std::string dataset;   // dataset name
  int32_t num_prompts = 0;
  double request_rate = 0;  // requests/s; +inf = all at once ("inf" in the JSON)
  double burstiness = 1;
  std::optional<int32_t> max_concurrency;
  std::optional<SloSpec> goodput;
};

// The result JSON with vLLM's field names: date, backend, model_id,
// dataset (Tandem's addition), num_prompts, request_rate, burstiness,
// max_concurrency (null when unlimited), duration,
// completed, failed, total_input_tokens, total_output_tokens,
// request_throughput, request_goodput (null without --goodput),
// output_throughput, total_token_throughput, max_output_tokens_per_s,
// max_concurrent_requests, input_lens, output_lens, ttfts (s),
// predicted_ttfts (s: the server's prediction for the placement it chose,
// null when it made none) and placements ("local" | "remote", null when
// the server reported none) (Tandem's additions), itls (s, one list per
// request), start_times (s), generated_texts, errors, and per
// metric m in ttft, tpot, itl, e2el: mean_m_ms, median_m_ms, std_m_ms,
// p<P>_m_ms (P printed as "99", "99.9"). `outputs` in request order;
// output_lens is 0 for a failed request (as serve.py). generated_texts may
// hold invalid UTF-8 (a stream cut mid-character): dump with
// nlohmann::json::error_handler_t::replace.
nlohmann::json ResultJson(const BenchmarkMetrics& metrics,
                          const std::vector<RequestOutput>& outputs, const RunInfo& info);

// The human-readable table: serve.py's "Serving Benchmark Result" block,
// its lines "{:<40} {:<10}" / "{:<40} {:<10.2f}" (label left-aligned in 40
// columns, a space, the value in 10 with 2 decimals for rates and times).
// "Maximum request concurrency:" only with a limit, "Request rate
// configured (RPS):" only for a finite rate, "Request goodput (req/s):" only
// when metrics.request_goodput is set, "Peak output token throughput
// (tok/s):" and "Peak concurrent requests:" (vLLM prints both); then the TTFT, TPOT, ITL and E2EL
// sections (mean, median, each percentile) and a closing line of 50 '='.
std::string FormatResultTable(const BenchmarkMetrics& metrics, const RunInfo& info);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_METRICS_H_
