// Statistics of a `tandem bench` run: vLLM's benchmarks/serve.py
// (calculate_metrics, the result dict and the printed table), numpy's
// percentile / median / std. See metrics.h.
#include "tools/bench/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem::bench {
namespace {

constexpr double kMsPerS = 1000.0;

// Longest run, in seconds, whose per-second peaks are computed (two vectors
// of this many counters; 2^22 s is about 48 days). A longer span can only
// come from a broken clock: the peaks stay 0 then.
constexpr int64_t kMaxPeakBins = int64_t{1} << 22;

// numpy's _lerp (numpy/lib/function_base.py), which interpolates from the
// nearer end so that t = 1 gives exactly b.
double Lerp(double a, double b, double t) {
  const double diff = b - a;
  return t >= 0.5 ? b - diff * (1 - t) : a + diff * t;
}

double Mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

// numpy.std: population standard deviation, sqrt(mean((x - mean)^2)).
double PopulationStd(const std::vector<double>& values) {
  if (values.empty()) return 0;
  const double mean = Mean(values);
  double sum = 0;
  for (double v : values) sum += (v - mean) * (v - mean);
  return std::sqrt(sum / static_cast<double>(values.size()));
}

// numpy.median: the middle value, or the mean of the two middle values.
double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  if (n % 2 == 1) return values[n / 2];
  return (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Summary in milliseconds of `values_s` (seconds).
LatencySummary Summarize(std::vector<double> values_s, const std::vector<double>& percentiles) {
  for (double& v : values_s) v *= kMsPerS;
  LatencySummary out;
  out.mean_ms = Mean(values_s);
  out.std_ms = PopulationStd(values_s);
  out.median_ms = Median(values_s);
  for (double p : percentiles) out.percentiles_ms.emplace_back(p, Percentile(values_s, p));
  return out;
}

// vLLM's goodput test: every given limit >= the request's value, the limit
// converted to seconds first (slo_ms / 1000, as serve.py does) so that a
// value equal to the limit passes.
bool MeetsSlo(const SloSpec& slo, double ttft_s, double tpot_s, double e2el_s) {
  if (slo.ttft_ms && !(*slo.ttft_ms / kMsPerS >= ttft_s)) return false;
  if (slo.tpot_ms && !(*slo.tpot_ms / kMsPerS >= tpot_s)) return false;
  if (slo.e2el_ms && !(*slo.e2el_ms / kMsPerS >= e2el_s)) return false;
  return true;
}

// Python's int(x) for the bucket of a time: truncation toward zero, or -1
// for a value that is not a usable number (never counted).
int64_t Bucket(double seconds) {
  if (!std::isfinite(seconds) || std::fabs(seconds) >= static_cast<double>(kMaxPeakBins)) {
    return -1;
  }
  return static_cast<int64_t>(std::trunc(seconds));
}

// vLLM's max_output_tokens_per_s / max_concurrent_requests (serve.py,
// calculate_metrics), over successful outputs only:
//   origin = min start_s; bins = ceil(max(start_s + latency_s) - origin) + 1
//   one token event at start_s + ttft_s and one more after each itl_s gap
//     (cumulative), each counted in bin int(t - origin) when in range; a
//     chunk of several tokens counts once, as in vLLM;
//   a request counts as in flight in every bin from int(start_s - origin)
//     to int(start_s + latency_s - origin), both included.
// Each result is the maximum over all bins (the two maxima may fall in
// different bins).
void ComputePeaks(const std::vector<RequestOutput>& outputs, BenchmarkMetrics* metrics) {
  double origin = std::numeric_limits<double>::infinity();
  double last_end = -std::numeric_limits<double>::infinity();
  for (const RequestOutput& o : outputs) {
    if (!o.success) continue;
    origin = std::min(origin, o.start_s);
    last_end = std::max(last_end, o.start_s + o.latency_s);
  }
  const int64_t span = Bucket(std::ceil(last_end - origin));
  if (span < 0 || span + 1 > kMaxPeakBins) return;  // no success, or a broken clock
  const int64_t bins = span + 1;
  std::vector<int64_t> tokens(bins, 0);
  std::vector<int32_t> in_flight(bins, 0);
  for (const RequestOutput& o : outputs) {
    if (!o.success) continue;
    double t = o.start_s + o.ttft_s;
    auto count_token = [&](double when) {
      const int64_t b = Bucket(when - origin);
      if (b >= 0 && b < bins) ++tokens[b];
    };
    count_token(t);
    for (double gap : o.itl_s) {
      t += gap;
      count_token(t);
    }
    const int64_t first = std::max<int64_t>(Bucket(o.start_s - origin), 0);
    const int64_t last = std::min<int64_t>(Bucket(o.start_s + o.latency_s - origin), bins - 1);
    for (int64_t b = first; b <= last; ++b) ++in_flight[b];
  }
  metrics->max_output_tokens_per_s =
      static_cast<double>(*std::max_element(tokens.begin(), tokens.end()));
  metrics->max_concurrent_requests = *std::max_element(in_flight.begin(), in_flight.end());
}

// The percentile's name in keys and labels, as serve.py writes it:
// str(int(p)) when whole, else Python's str(p) ("99.9").
std::string PercentileWord(double p) {
  if (p == std::floor(p) && std::fabs(p) < 1e15) return absl::StrCat(static_cast<int64_t>(p));
  char buf[64];
  // Shortest round-trip digits in fixed notation: Python's repr for the
  // (0, 100] range ParsePercentiles admits, down to 1e-4.
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), p, std::chars_format::fixed);
  if (ec != std::errc()) return absl::StrCat(p);
  return std::string(buf, end);
}

[[nodiscard]] absl::Status GoodputError(const std::string& item, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--goodput: '", item, "': ", why));
}

}  // namespace

absl::StatusOr<SloSpec> ParseGoodput(const std::vector<std::string>& items) {
  if (items.empty()) {
    return absl::InvalidArgumentError(
        "--goodput: expected one or more NAME:MS items (NAME ttft, tpot or e2el)");
  }
  SloSpec slo;
  for (const std::string& item : items) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    if (parts.size() != 2) return GoodputError(item, "expected NAME:MS, e.g. ttft:500");
    const std::string& name = parts[0];
    std::optional<double>* slot = name == "ttft"   ? &slo.ttft_ms
                                  : name == "tpot" ? &slo.tpot_ms
                                  : name == "e2el" ? &slo.e2el_ms
                                                   : nullptr;
    if (slot == nullptr) {
      return GoodputError(
          item, absl::StrCat("unknown metric '", name, "' (expected ttft, tpot or e2el)"));
    }
    double ms = 0;
    if (!absl::SimpleAtod(parts[1], &ms) || !std::isfinite(ms) || !(ms > 0)) {
      return GoodputError(
          item, absl::StrCat("expected a finite number of milliseconds > 0, got '", parts[1], "'"));
    }
    if (slot->has_value()) return GoodputError(item, absl::StrCat(name, " given twice"));
    *slot = ms;
  }
  return slo;
}

absl::StatusOr<std::vector<double>> ParsePercentiles(const std::string& text) {
  std::vector<double> out;
  for (absl::string_view raw : absl::StrSplit(text, ',')) {
    const absl::string_view item = absl::StripAsciiWhitespace(raw);
    double p = 0;
    if (!absl::SimpleAtod(item, &p) || !std::isfinite(p) || !(p > 0) || p > 100) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metric-percentiles: '", item, "' is not a number in (0, 100] (in '", text, "')"));
    }
    out.push_back(p);
  }
  return out;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100 * static_cast<double>(values.size() - 1);
  // rank > 0 is false for NaN: a p outside [0, 100] is clamped, never UB.
  const double clamped = rank > 0 ? std::min(rank, static_cast<double>(values.size() - 1)) : 0.0;
  const size_t lo = static_cast<size_t>(std::floor(clamped));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return Lerp(values[lo], values[hi], clamped - static_cast<double>(lo));
}

BenchmarkMetrics ComputeMetrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                const std::optional<SloSpec>& slo,
                                const std::vector<double>& percentiles) {
  BenchmarkMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els;
  int32_t good = 0;
  for (const RequestOutput& o : outputs) {
    if (!o.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input_tokens += o.prompt_len;
    m.total_output_tokens += o.output_tokens;
    double tpot_s = 0;  // vLLM: a request with <= 1 token has TPOT 0 for goodput
    if (o.output_tokens > 1) {
      tpot_s = (o.latency_s - o.ttft_s) / (o.output_tokens - 1);
      tpots.push_back(tpot_s);
    }
    itls.insert(itls.end(), o.itl_s.begin(), o.itl_s.end());
    ttfts.push_back(o.ttft_s);
    e2els.push_back(o.latency_s);
    if (slo && MeetsSlo(*slo, o.ttft_s, tpot_s, o.latency_s)) ++good;
  }
  // serve.py divides by the duration unguarded; a zero or negative one
  // (nothing measured) leaves the rates at 0 here.
  const bool timed = duration_s > 0;
  auto per_s = [&](double count) { return timed ? count / duration_s : 0.0; };
  m.request_throughput = per_s(m.completed);
  if (slo) m.request_goodput = per_s(good);
  m.output_throughput = per_s(static_cast<double>(m.total_output_tokens));
  m.total_token_throughput =
      per_s(static_cast<double>(m.total_input_tokens + m.total_output_tokens));
  ComputePeaks(outputs, &m);
  m.ttft = Summarize(std::move(ttfts), percentiles);
  m.tpot = Summarize(std::move(tpots), percentiles);
  m.itl = Summarize(std::move(itls), percentiles);
  m.e2el = Summarize(std::move(e2els), percentiles);
  return m;
}

nlohmann::json ResultJson(const BenchmarkMetrics& metrics,
                          const std::vector<RequestOutput>& outputs, const RunInfo& info) {
  using nlohmann::json;
  json j;
  j["date"] = info.date;
  j["backend"] = info.backend;
  j["model_id"] = info.model_id;
  j["dataset"] = info.dataset;
  j["num_prompts"] = info.num_prompts;
  j["request_rate"] = std::isinf(info.request_rate) ? json("inf") : json(info.request_rate);
  j["burstiness"] = info.burstiness;
  j["max_concurrency"] = info.max_concurrency ? json(*info.max_concurrency) : json(nullptr);
  j["duration"] = metrics.duration_s;
  j["completed"] = metrics.completed;
  j["failed"] = metrics.failed;
  j["total_input_tokens"] = metrics.total_input_tokens;
  j["total_output_tokens"] = metrics.total_output_tokens;
  j["request_throughput"] = metrics.request_throughput;
  j["request_goodput"] = metrics.request_goodput ? json(*metrics.request_goodput) : json(nullptr);
  j["output_throughput"] = metrics.output_throughput;
  j["total_token_throughput"] = metrics.total_token_throughput;
  j["max_output_tokens_per_s"] = metrics.max_output_tokens_per_s;
  j["max_concurrent_requests"] = metrics.max_concurrent_requests;
  json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(),
       itls = json::array(), start_times = json::array(), texts = json::array(),
       errors = json::array(), predicted_ttfts = json::array(), placements = json::array();
  for (const RequestOutput& o : outputs) {
    input_lens.push_back(o.prompt_len);
    output_lens.push_back(o.success ? o.output_tokens : 0);  // serve.py: 0 for a failure
    ttfts.push_back(o.ttft_s);
    predicted_ttfts.push_back(o.predicted_ttft_s ? json(*o.predicted_ttft_s) : json(nullptr));
    placements.push_back(o.placement.empty() ? json(nullptr) : json(o.placement));
    itls.push_back(o.itl_s);
    start_times.push_back(o.start_s);
    texts.push_back(o.generated_text);
    errors.push_back(o.error);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["predicted_ttfts"] = std::move(predicted_ttfts);
  j["placements"] = std::move(placements);
  j["itls"] = std::move(itls);
  j["start_times"] = std::move(start_times);
  j["generated_texts"] = std::move(texts);
  j["errors"] = std::move(errors);
  const std::pair<const char*, const LatencySummary*> summaries[] = {{"ttft", &metrics.ttft},
                                                                     {"tpot", &metrics.tpot},
                                                                     {"itl", &metrics.itl},
                                                                     {"e2el", &metrics.e2el}};
  for (const auto& [name, s] : summaries) {
    j[absl::StrCat("mean_", name, "_ms")] = s->mean_ms;
    j[absl::StrCat("median_", name, "_ms")] = s->median_ms;
    j[absl::StrCat("std_", name, "_ms")] = s->std_ms;
    for (const auto& [p, value] : s->percentiles_ms) {
      j[absl::StrCat("p", PercentileWord(p), "_", name, "_ms")] = value;
    }
  }
  return j;
}

namespace {

// Python's "{s:{c}^{n}}".format(...): `title` centred in `width` columns of
// `fill`, the odd column on the right.
std::string Centered(absl::string_view title, size_t width, char fill) {
  if (title.size() >= width) return std::string(title);
  const size_t left = (width - title.size()) / 2;
  return absl::StrCat(std::string(left, fill), title,
                      std::string(width - title.size() - left, fill));
}

// serve.py's "{:<40} {:<10}" and "{:<40} {:<10.2f}" lines.
void IntLine(std::string* out, absl::string_view label, int64_t value) {
  absl::StrAppendFormat(out, "%-40s %-10d\n", label, value);
}
void FloatLine(std::string* out, absl::string_view label, double value) {
  absl::StrAppendFormat(out, "%-40s %-10.2f\n", label, value);
}

void SummaryLines(std::string* out, const LatencySummary& s, absl::string_view name,
                  absl::string_view header) {
  absl::StrAppend(out, Centered(header, 50, '-'), "\n");
  FloatLine(out, absl::StrCat("Mean ", name, " (ms):"), s.mean_ms);
  FloatLine(out, absl::StrCat("Median ", name, " (ms):"), s.median_ms);
  for (const auto& [p, value] : s.percentiles_ms) {
    FloatLine(out, absl::StrCat("P", PercentileWord(p), " ", name, " (ms):"), value);
  }
}

}  // namespace

std::string FormatResultTable(const BenchmarkMetrics& metrics, const RunInfo& info) {
  std::string out = Centered(" Serving Benchmark Result ", 50, '=') + "\n";
  IntLine(&out, "Successful requests:", metrics.completed);
  IntLine(&out, "Failed requests:", metrics.failed);
  if (info.max_concurrency) IntLine(&out, "Maximum request concurrency:", *info.max_concurrency);
  if (!std::isinf(info.request_rate)) {
    FloatLine(&out, "Request rate configured (RPS):", info.request_rate);
  }
  FloatLine(&out, "Benchmark duration (s):", metrics.duration_s);
  IntLine(&out, "Total input tokens:", metrics.total_input_tokens);
  IntLine(&out, "Total generated tokens:", metrics.total_output_tokens);
  FloatLine(&out, "Request throughput (req/s):", metrics.request_throughput);
  if (metrics.request_goodput) {
    FloatLine(&out, "Request goodput (req/s):", *metrics.request_goodput);
  }
  FloatLine(&out, "Output token throughput (tok/s):", metrics.output_throughput);
  FloatLine(&out, "Peak output token throughput (tok/s):", metrics.max_output_tokens_per_s);
  FloatLine(&out, "Peak concurrent requests:", metrics.max_concurrent_requests);
  FloatLine(&out, "Total Token throughput (tok/s):", metrics.total_token_throughput);
  SummaryLines(&out, metrics.ttft, "TTFT", "Time to First Token");
  SummaryLines(&out, metrics.tpot, "TPOT", "Time per Output Token (excl. 1st token)");
  SummaryLines(&out, metrics.itl, "ITL", "Inter-token Latency");
  SummaryLines(&out, metrics.e2el, "E2EL", "End-to-end Latency");
  absl::StrAppend(&out, std::string(50, '='), "\n");
  return out;
}

}  // namespace tandem::bench
