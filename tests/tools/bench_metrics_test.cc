// Tests for tools/bench/metrics: vLLM's calculate_metrics on a recorded run
// of five successful requests and one failure, numpy's percentile, goodput
// at its boundaries, the result JSON and the table.
//
// Expected values are computed by hand below (numpy.percentile, linear:
// rank = p/100 * (n-1), value = a[lo] + (rank-lo) * (a[hi]-a[lo]) on the
// sorted list; numpy.std: sqrt(mean((x-mean)^2))). Times are multiples of
// 1/8 s, so seconds -> ms is exact.
#include "tools/bench/metrics.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

constexpr double kTol = 1e-9;

RequestOutput Ok(int32_t prompt, int32_t tokens, double start, double ttft, double latency,
                 std::vector<double> itl) {
  RequestOutput o;
  o.success = true;
  o.prompt_len = prompt;
  o.output_tokens = tokens;
  o.start_s = start;
  o.ttft_s = ttft;
  o.latency_s = latency;
  o.itl_s = std::move(itl);
  o.generated_text = "t" + std::to_string(prompt);
  return o;
}

// The recorded run (seconds). Per successful request:
//   #  prompt out start  ttft   e2el   itl             TPOT = (e2el-ttft)/(out-1)
//   1  10     5   0      0.125  0.625  4 x 0.125       0.5/4   = 0.125
//   2  20     3   0.25   0.25   0.75   2 x 0.25        0.5/2   = 0.25
//   3  30     1   0.5    0.375  0.375  -               (1 token: none; 0 for goodput)
//   4  40     2   1.0    0.5    1.25   0.75            0.75/1  = 0.75
//   5  50     4   1.5    0.625  1.0    3 x 0.125       0.375/3 = 0.125
// and a failure that would change every number if it were counted.
std::vector<RequestOutput> RecordedRun() {
  std::vector<RequestOutput> run = {
      Ok(10, 5, 0.0, 0.125, 0.625, {0.125, 0.125, 0.125, 0.125}),
      Ok(20, 3, 0.25, 0.25, 0.75, {0.25, 0.25}),
      Ok(30, 1, 0.5, 0.375, 0.375, {}),
      Ok(40, 2, 1.0, 0.5, 1.25, {0.75}),
      Ok(50, 4, 1.5, 0.625, 1.0, {0.125, 0.125, 0.125}),
  };
  RequestOutput failed;
  failed.success = false;
  failed.error = "UNAVAILABLE: no decode worker";
  failed.prompt_len = 60;
  failed.output_tokens = 7;
  failed.start_s = 0.25;
  failed.ttft_s = 0.01;
  failed.latency_s = 0.0625;
  failed.itl_s = {9.0};
  run.push_back(failed);
  return run;
}
constexpr double kDuration = 2.5;

SloSpec Slo(std::optional<double> ttft_ms, std::optional<double> tpot_ms = std::nullopt,
            std::optional<double> e2el_ms = std::nullopt) {
  SloSpec slo;
  slo.ttft_ms = ttft_ms;
  slo.tpot_ms = tpot_ms;
  slo.e2el_ms = e2el_ms;
  return slo;
}

TEST(BenchMetricsTest, PercentileFollowsNumpyLinear) {
  // numpy's docstring example: a = [[10, 7, 4], [3, 2, 1]]; percentile(a, 50) = 3.5.
  EXPECT_DOUBLE_EQ(Percentile({10, 7, 4, 3, 2, 1}, 50), 3.5);
  // [1,2,3,4]: p40 -> rank 1.2 -> 2 + 0.2 * 1 = 2.2; p0 / p100 the ends.
  EXPECT_NEAR(Percentile({4, 1, 3, 2}, 40), 2.2, kTol);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 99), 0);
}

TEST(BenchMetricsTest, CountsAndThroughputsUseOnlySuccessfulOutputs) {
  BenchmarkMetrics m = ComputeMetrics(RecordedRun(), kDuration, std::nullopt, {99});
  EXPECT_EQ(m.completed, 5);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input_tokens, 150);  // 10+20+30+40+50
  EXPECT_EQ(m.total_output_tokens, 15);  // 5+3+1+2+4
  EXPECT_DOUBLE_EQ(m.duration_s, 2.5);
  EXPECT_DOUBLE_EQ(m.request_throughput, 2.0);       // 5 / 2.5
  EXPECT_DOUBLE_EQ(m.output_throughput, 6.0);        // 15 / 2.5
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 66.0);  // 165 / 2.5
  EXPECT_FALSE(m.request_goodput.has_value());
}

TEST(BenchMetricsTest, LatencySummariesMatchHandComputation) {
  BenchmarkMetrics m = ComputeMetrics(RecordedRun(), kDuration, std::nullopt, {50, 90, 99, 99.9});
  // TTFT ms [125 250 375 500 625]: mean 375, median 375,
  // std sqrt((250^2*2 + 125^2*2)/5) = sqrt(31250); p90 rank 3.6 -> 500 + .6*125 = 575;
  // p99 rank 3.96 -> 500 + .96*125 = 620; p99.9 rank 3.996 -> 624.5.
  EXPECT_DOUBLE_EQ(m.ttft.mean_ms, 375);
  EXPECT_DOUBLE_EQ(m.ttft.median_ms, 375);
  EXPECT_NEAR(m.ttft.std_ms, std::sqrt(31250.0), kTol);
  ASSERT_EQ(m.ttft.percentiles_ms.size(), 4u);
  EXPECT_EQ(m.ttft.percentiles_ms[0].first, 50);
  EXPECT_NEAR(m.ttft.percentiles_ms[0].second, 375, kTol);
  EXPECT_NEAR(m.ttft.percentiles_ms[1].second, 575, kTol);
  EXPECT_NEAR(m.ttft.percentiles_ms[2].second, 620, kTol);
  EXPECT_EQ(m.ttft.percentiles_ms[3].first, 99.9);
  EXPECT_NEAR(m.ttft.percentiles_ms[3].second, 624.5, kTol);
  // TPOT ms [125 250 750 125] (request 3 has one token): sorted [125 125 250 750],
  // mean 312.5, median (125+250)/2 = 187.5,
  // std sqrt((187.5^2*2 + 62.5^2 + 437.5^2)/4) = sqrt(66406.25); p99 rank 2.97 -> 250 + .97*500.
  EXPECT_DOUBLE_EQ(m.tpot.mean_ms, 312.5);
  EXPECT_DOUBLE_EQ(m.tpot.median_ms, 187.5);
  EXPECT_NEAR(m.tpot.std_ms, std::sqrt(66406.25), kTol);
  EXPECT_NEAR(m.tpot.percentiles_ms[2].second, 735, kTol);
  // ITL ms pooled: 7 x 125, 2 x 250, 750 (the failure's 9 s gap is left out):
  // mean 2125/10 = 212.5, median 125,
  // std sqrt((87.5^2*7 + 37.5^2*2 + 537.5^2)/10) = sqrt(34531.25);
  // p90 rank 8.1 -> 250 + .1*500 = 300; p99 rank 8.91 -> 250 + .91*500 = 705.
  EXPECT_DOUBLE_EQ(m.itl.mean_ms, 212.5);
  EXPECT_DOUBLE_EQ(m.itl.median_ms, 125);
  EXPECT_NEAR(m.itl.std_ms, std::sqrt(34531.25), kTol);
  EXPECT_NEAR(m.itl.percentiles_ms[1].second, 300, kTol);
  EXPECT_NEAR(m.itl.percentiles_ms[2].second, 705, kTol);
  // E2EL ms [625 750 375 1250 1000]: sorted [375 625 750 1000 1250], mean 800,
  // median 750, std sqrt((425^2 + 175^2 + 50^2 + 200^2 + 450^2)/5) = sqrt(91250);
  // p99 rank 3.96 -> 1000 + .96*250 = 1240.
  EXPECT_DOUBLE_EQ(m.e2el.mean_ms, 800);
  EXPECT_DOUBLE_EQ(m.e2el.median_ms, 750);
  EXPECT_NEAR(m.e2el.std_ms, std::sqrt(91250.0), kTol);
  EXPECT_NEAR(m.e2el.percentiles_ms[2].second, 1240, kTol);
}

TEST(BenchMetricsTest, PeaksCountTokenEventsAndRequestsPerSecondBin) {
  BenchmarkMetrics m = ComputeMetrics(RecordedRun(), kDuration, std::nullopt, {99});
  // Origin 0 (earliest successful start), last end 2.5 -> ceil(2.5) + 1 = 4 bins.
  // Token events (start+ttft, then each itl): #1 .125 .25 .375 .5 .625; #2 .5 .75 1.0;
  // #3 .875; #4 1.5 2.25; #5 2.125 2.25 2.375 2.5 -> bins [5+2+1, 1+1, 1+4, 0] = [8, 2, 5, 0].
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 8);
  // In flight, bins int(start)..int(start+e2el): #1 0..0, #2 0..1, #3 0..0, #4 1..2,
  // #5 1..2 -> [3, 3, 2, 0]. The failure (start .25, token at .26) is in neither.
  EXPECT_EQ(m.max_concurrent_requests, 3);
}

TEST(BenchMetricsTest, PeakConcurrencyCountsOverlappingRequests) {
  // Four requests all in flight during second 1; a fifth alone in second 5.
  std::vector<RequestOutput> run = {Ok(1, 1, 0.0, 1.5, 1.5, {}), Ok(1, 1, 0.5, 1.0, 1.0, {}),
                                    Ok(1, 1, 1.0, 0.5, 0.5, {}), Ok(1, 1, 1.9, 0.1, 0.1, {}),
                                    Ok(1, 1, 5.0, 0.1, 0.1, {})};
  BenchmarkMetrics m = ComputeMetrics(run, 6, std::nullopt, {99});
  EXPECT_EQ(m.max_concurrent_requests, 4);
  // One token each: times 1.5 1.5 1.5 2.0 5.1 -> bins 1:3, 2:1, 5:1.
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 3);
}

TEST(BenchMetricsTest, GoodputPassesAtTheLimitAndFailsJustBelow) {
  auto goodput = [](SloSpec slo) {
    return ComputeMetrics(RecordedRun(), kDuration, slo, {99}).request_goodput.value();
  };
  // TTFT <= 375 ms: #1 #2 #3 (#3 exactly at the limit) -> 3 / 2.5.
  EXPECT_DOUBLE_EQ(goodput(Slo(375)), 1.2);
  EXPECT_DOUBLE_EQ(goodput(Slo(374.9)), 0.8);
  // TPOT <= 125 ms: #1 and #5 at the limit, #3 (one token, TPOT 0) -> 3.
  EXPECT_DOUBLE_EQ(goodput(Slo(std::nullopt, 125)), 1.2);
  EXPECT_DOUBLE_EQ(goodput(Slo(std::nullopt, 124.9)), 0.4);  // only #3
  // E2EL <= 750 ms: #1, #2 (at the limit), #3. The failure (62.5 ms) never counts.
  EXPECT_DOUBLE_EQ(goodput(Slo(std::nullopt, std::nullopt, 750)), 1.2);
  // Every SLO must hold: TTFT <= 375 and TPOT <= 125 -> #1 and #3.
  EXPECT_DOUBLE_EQ(goodput(Slo(375, 125)), 0.8);
  // TTFT <= 500, TPOT <= 250, E2EL <= 1000: #1 #2 #3 (#4 TPOT 750, #5 TTFT 625).
  EXPECT_DOUBLE_EQ(goodput(Slo(500, 250, 1000)), 1.2);
}

TEST(BenchMetricsTest, EmptyAndAllFailedRunsGiveZeros) {
  for (const auto& outputs : {std::vector<RequestOutput>{},
                              std::vector<RequestOutput>{RecordedRun().back()}}) {
    BenchmarkMetrics m = ComputeMetrics(outputs, 0, Slo(100), {50, 99});
    EXPECT_EQ(m.completed, 0);
    EXPECT_EQ(m.total_input_tokens, 0);
    EXPECT_EQ(m.total_output_tokens, 0);
    EXPECT_EQ(m.request_throughput, 0);
    EXPECT_EQ(m.request_goodput, 0);
    EXPECT_EQ(m.max_output_tokens_per_s, 0);
    EXPECT_EQ(m.max_concurrent_requests, 0);
    for (const LatencySummary* s : {&m.ttft, &m.tpot, &m.itl, &m.e2el}) {
      EXPECT_EQ(s->mean_ms, 0);
      EXPECT_EQ(s->median_ms, 0);
      EXPECT_EQ(s->std_ms, 0);
      EXPECT_THAT(s->percentiles_ms, ElementsAre(Pair(50, 0), Pair(99, 0)));
    }
  }
  EXPECT_EQ(ComputeMetrics({RecordedRun().back()}, 1, std::nullopt, {}).failed, 1);
}

TEST(BenchMetricsTest, ParseGoodputReadsEachMetricOnce) {
  absl::StatusOr<SloSpec> slo = ParseGoodput({"ttft:500", "tpot:50.5", "e2el:2000"});
  ASSERT_TRUE(slo.ok()) << slo.status();
  EXPECT_EQ(slo->ttft_ms, 500);
  EXPECT_EQ(slo->tpot_ms, 50.5);
  EXPECT_EQ(slo->e2el_ms, 2000);
  slo = ParseGoodput({"tpot:40"});
  ASSERT_TRUE(slo.ok());
  EXPECT_FALSE(slo->ttft_ms.has_value());
  EXPECT_FALSE(slo->e2el_ms.has_value());
}

TEST(BenchMetricsTest, ParseGoodputErrorsNameTheItem) {
  struct Case {
    std::vector<std::string> items;
    std::string message;
  };
  const Case cases[] = {
      {{}, "--goodput: expected one or more"},
      {{"ttft500"}, "--goodput: 'ttft500': expected NAME:MS"},
      {{"ttft:1:2"}, "'ttft:1:2': expected NAME:MS"},
      {{"itl:5"}, "'itl:5': unknown metric 'itl'"},
      {{"ttft:abc"}, "'ttft:abc': expected a finite number of milliseconds > 0, got 'abc'"},
      {{"ttft:0"}, "'ttft:0': expected a finite number"},
      {{"ttft:-5"}, "'ttft:-5'"},
      {{"ttft:inf"}, "'ttft:inf'"},
      {{"ttft:"}, "'ttft:'"},
      {{"ttft:100", "ttft:200"}, "'ttft:200': ttft given twice"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SloSpec> slo = ParseGoodput(c.items);
    ASSERT_FALSE(slo.ok()) << c.message;
    EXPECT_EQ(slo.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(slo.status().message()), HasSubstr(c.message));
  }
}

TEST(BenchMetricsTest, ParsePercentilesKeepsOrderAndRejectsOutOfRange) {
  absl::StatusOr<std::vector<double>> ps = ParsePercentiles("50,90, 99.9,100");
  ASSERT_TRUE(ps.ok()) << ps.status();
  EXPECT_THAT(*ps, ElementsAre(50, 90, 99.9, 100));
  for (const auto& [text, item] : std::vector<std::pair<std::string, std::string>>{
           {"50,abc", "'abc'"}, {"0", "'0'"}, {"100.5", "'100.5'"}, {"-1", "'-1'"},
           {"50,,99", "''"}, {"", "''"}, {"nan", "'nan'"}}) {
    ps = ParsePercentiles(text);
    ASSERT_FALSE(ps.ok()) << text;
    EXPECT_EQ(ps.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(ps.status().message()),
                HasSubstr("--metric-percentiles: " + item + " is not a number in (0, 100]"));
  }
}

RunInfo Info() {
  RunInfo info;
  info.date = "20261202-153000";
  info.backend = "tandem-grpc";
  info.model_id = "tiny-llama";
  info.dataset = "random";
  info.num_prompts = 6;
  info.request_rate = 4;
  info.burstiness = 0.5;
  info.max_concurrency = 8;
  info.goodput = Slo(375);
  return info;
}

TEST(BenchMetricsTest, ResultJsonUsesVllmFieldNames) {
  const std::vector<RequestOutput> run = RecordedRun();
  BenchmarkMetrics m = ComputeMetrics(run, kDuration, Slo(375), {50, 99, 99.9});
  nlohmann::json j = ResultJson(m, run, Info());
  EXPECT_EQ(j["date"], "20261202-153000");
  EXPECT_EQ(j["backend"], "tandem-grpc");
  EXPECT_EQ(j["model_id"], "tiny-llama");
  EXPECT_EQ(j["dataset"], "random");
  EXPECT_EQ(j["num_prompts"], 6);
  EXPECT_EQ(j["request_rate"], 4.0);
  EXPECT_EQ(j["burstiness"], 0.5);
  EXPECT_EQ(j["max_concurrency"], 8);
  EXPECT_EQ(j["duration"], 2.5);
  EXPECT_EQ(j["completed"], 5);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["total_input_tokens"], 150);
  EXPECT_EQ(j["total_output_tokens"], 15);
  EXPECT_EQ(j["request_throughput"], 2.0);
  EXPECT_EQ(j["request_goodput"], 1.2);
  EXPECT_EQ(j["output_throughput"], 6.0);
  EXPECT_EQ(j["total_token_throughput"], 66.0);
  EXPECT_EQ(j["max_output_tokens_per_s"], 8.0);
  EXPECT_EQ(j["max_concurrent_requests"], 3);
  // Per request, in order, the failure included (serve.py: output_lens 0 for it).
  EXPECT_EQ(j["input_lens"], nlohmann::json({10, 20, 30, 40, 50, 60}));
  EXPECT_EQ(j["output_lens"], nlohmann::json({5, 3, 1, 2, 4, 0}));
  EXPECT_EQ(j["ttfts"], nlohmann::json({0.125, 0.25, 0.375, 0.5, 0.625, 0.01}));
  EXPECT_EQ(j["itls"][1], nlohmann::json({0.25, 0.25}));
  EXPECT_EQ(j["itls"][2], nlohmann::json::array());
  EXPECT_EQ(j["itls"][5], nlohmann::json({9.0}));
  EXPECT_EQ(j["start_times"], nlohmann::json({0.0, 0.25, 0.5, 1.0, 1.5, 0.25}));
  EXPECT_EQ(j["generated_texts"][0], "t10");
  EXPECT_EQ(j["errors"][0], "");
  EXPECT_EQ(j["errors"][5], "UNAVAILABLE: no decode worker");
  EXPECT_EQ(j["mean_ttft_ms"], 375.0);
  EXPECT_EQ(j["median_tpot_ms"], 187.5);
  EXPECT_NEAR(j["std_e2el_ms"].get<double>(), std::sqrt(91250.0), kTol);
  EXPECT_NEAR(j["p99_itl_ms"].get<double>(), 705, kTol);
  EXPECT_NEAR(j["p50_e2el_ms"].get<double>(), 750, kTol);
  EXPECT_NEAR(j["p99.9_ttft_ms"].get<double>(), 624.5, kTol);
  EXPECT_FALSE(j.contains("p99.0_ttft_ms"));
  for (const char* key : {"mean_tpot_ms", "std_itl_ms", "p99.9_e2el_ms", "p50_tpot_ms"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
}

TEST(BenchMetricsTest, ResultJsonHasPlacementsAndPredictedTtfts) {
  // Per request, in order: a remote placement predicted at 300 ms, a local
  // one predicted at 125 ms, a local one without a prediction (placement
  // threshold), and the rest (no placement reported, the failure) null.
  std::vector<RequestOutput> run = RecordedRun();
  run[0].placement = "remote";
  run[0].predicted_ttft_s = 0.3;
  run[1].placement = "local";
  run[1].predicted_ttft_s = 0.125;
  run[2].placement = "local";
  nlohmann::json j = ResultJson(ComputeMetrics(run, kDuration, std::nullopt, {99}), run, Info());
  EXPECT_EQ(j["placements"], nlohmann::json({"remote", "local", "local", nullptr, nullptr, nullptr}));
  EXPECT_EQ(j["predicted_ttfts"], nlohmann::json({0.3, 0.125, nullptr, nullptr, nullptr, nullptr}));
  // Beside the measured ones, one entry per request.
  EXPECT_EQ(j["ttfts"].size(), j["predicted_ttfts"].size());
}

TEST(BenchMetricsTest, ResultJsonPlacementsAreNullWhenNoneReported) {
  const std::vector<RequestOutput> run = RecordedRun();
  nlohmann::json j = ResultJson(ComputeMetrics(run, kDuration, std::nullopt, {99}), run, Info());
  ASSERT_EQ(j["placements"].size(), 6u);
  ASSERT_EQ(j["predicted_ttfts"].size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(j["placements"][i].is_null()) << i;
    EXPECT_TRUE(j["predicted_ttfts"][i].is_null()) << i;
  }
}

TEST(BenchMetricsTest, ResultJsonWritesInfAndNulls) {
  RunInfo info = Info();
  info.request_rate = std::numeric_limits<double>::infinity();
  info.max_concurrency.reset();
  const std::vector<RequestOutput> run = RecordedRun();
  nlohmann::json j = ResultJson(ComputeMetrics(run, kDuration, std::nullopt, {99}), run, info);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["max_concurrency"].is_null());
  EXPECT_TRUE(j["request_goodput"].is_null());
  EXPECT_NE(j.dump().find("\"request_rate\":\"inf\""), std::string::npos);
}

TEST(BenchMetricsTest, TableHasVllmLayout) {
  BenchmarkMetrics m = ComputeMetrics(RecordedRun(), kDuration, Slo(375), {50, 99.9});
  // serve.py's own format strings ("{:<40} {:<10}", "{:<40} {:<10.2f}",
  // "{s:{c}^{n}}") applied to the values above, run in Python.
  EXPECT_EQ(FormatResultTable(m, Info()),
            "============ Serving Benchmark Result ============\n"
            "Successful requests:                     5         \n"
            "Failed requests:                         1         \n"
            "Maximum request concurrency:             8         \n"
            "Request rate configured (RPS):           4.00      \n"
            "Benchmark duration (s):                  2.50      \n"
            "Total input tokens:                      150       \n"
            "Total generated tokens:                  15        \n"
            "Request throughput (req/s):              2.00      \n"
            "Request goodput (req/s):                 1.20      \n"
            "Output token throughput (tok/s):         6.00      \n"
            "Peak output token throughput (tok/s):    8.00      \n"
            "Peak concurrent requests:                3.00      \n"
            "Total Token throughput (tok/s):          66.00     \n"
            "---------------Time to First Token----------------\n"
            "Mean TTFT (ms):                          375.00    \n"
            "Median TTFT (ms):                        375.00    \n"
            "P50 TTFT (ms):                           375.00    \n"
            "P99.9 TTFT (ms):                         624.50    \n"
            "-----Time per Output Token (excl. 1st token)------\n"
            "Mean TPOT (ms):                          312.50    \n"
            "Median TPOT (ms):                        187.50    \n"
            "P50 TPOT (ms):                           187.50    \n"
            "P99.9 TPOT (ms):                         748.50    \n"
            "---------------Inter-token Latency----------------\n"
            "Mean ITL (ms):                           212.50    \n"
            "Median ITL (ms):                         125.00    \n"
            "P50 ITL (ms):                            125.00    \n"
            "P99.9 ITL (ms):                          745.50    \n"
            "----------------End-to-end Latency----------------\n"
            "Mean E2EL (ms):                          800.00    \n"
            "Median E2EL (ms):                        750.00    \n"
            "P50 E2EL (ms):                           750.00    \n"
            "P99.9 E2EL (ms):                         1249.00   \n"
            "==================================================\n");
}

TEST(BenchMetricsTest, TableOmitsGoodputRateAndConcurrencyWhenNotSet) {
  RunInfo info = Info();
  info.request_rate = std::numeric_limits<double>::infinity();
  info.max_concurrency.reset();
  info.goodput.reset();
  const std::string table =
      FormatResultTable(ComputeMetrics(RecordedRun(), kDuration, std::nullopt, {99}), info);
  EXPECT_THAT(table, Not(HasSubstr("Request goodput")));
  EXPECT_THAT(table, Not(HasSubstr("Request rate configured")));
  EXPECT_THAT(table, Not(HasSubstr("Maximum request concurrency")));
  EXPECT_THAT(table, HasSubstr("\nP99 TTFT (ms):                           620.00    \n"));
}

}  // namespace
}  // namespace tandem::bench
