// router::RouterMetrics and RequestTimer alone: synthetic timings in, the
// registry serialized with prometheus::TextSerializer (what /metrics serves)
// and every bucket count, sum and counter checked exactly.
#include "router/router_metrics.h"

#include <map>
#include <string>
#include <vector>

#include <prometheus/text_serializer.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using Route = RouterMetrics::Route;

// The registry's text exposition as {series (name and labels, as
// printed) -> value}.
std::map<std::string, double> Scrape(const RouterMetrics& metrics) {
  const std::string text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double v = 0;
    EXPECT_TRUE(absl::SimpleAtod(line.substr(space + 1), &v)) << line;
    out[std::string(line.substr(0, space))] = v;
  }
  return out;
}

// A histogram's cumulative bucket counts at each `le` (as printed), then
// its _count.
std::vector<double> Buckets(const std::map<std::string, double>& s, const std::string& name,
                            const std::vector<std::string>& les) {
  std::vector<double> out;
  for (const std::string& le : les) {
    auto it = s.find(name + "_bucket{le=\"" + le + "\"}");
    out.push_back(it == s.end() ? -1 : it->second);
  }
  out.push_back(s.at(name + "_count"));
  return out;
}

std::string Requests(const char* route, const char* reason) {
  return std::string("tandem_requests_total{finish_reason=\"") + reason + "\",route=\"" + route +
         "\"}";
}

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);
absl::Time At(double ms) { return kT0 + absl::Milliseconds(ms); }

TEST(RouterMetricsTest, FreshRegistryShowsEverySeriesAtZero) {
  RouterMetrics metrics;
  const auto s = Scrape(metrics);
  for (const char* route : {"none", "local", "remote"}) {
    for (const char* reason : {"stop", "length", "context", "cancelled", "error"}) {
      ASSERT_EQ(s.count(Requests(route, reason)), 1u) << route << " " << reason;
      EXPECT_EQ(s.at(Requests(route, reason)), 0);
    }
  }
  for (const char* h :
       {"tandem_time_to_first_token_seconds", "tandem_inter_token_latency_seconds",
        "tandem_time_per_output_token_seconds", "tandem_e2e_request_latency_seconds",
        "tandem_request_queue_time_seconds"}) {
    EXPECT_EQ(s.at(std::string(h) + "_count"), 0) << h;
    EXPECT_EQ(s.at(std::string(h) + "_bucket{le=\"+Inf\"}"), 0) << h;
  }
  for (const char* c : {"tandem_prompt_tokens_total", "tandem_generation_tokens_total",
                        "tandem_prompt_tokens_cached_total", "tandem_num_requests_running",
                        "tandem_num_requests_waiting"}) {
    EXPECT_EQ(s.at(c), 0) << c;
  }
  for (const char* phase : {"router_queue", "placement", "prefill_queue", "prefill", "kv_transfer",
                            "decode_admission", "first_decode"}) {
    const std::string h =
        std::string("tandem_request_phase_seconds_count{phase=\"") + phase + "\"}";
    ASSERT_EQ(s.count(h), 1u) << h;
    EXPECT_EQ(s.at(h), 0) << h;
  }
  // Error series appear with their first error; no label is a request id.
  for (const auto& [series, value] : s) {
    EXPECT_EQ(series.find("tandem_request_errors_total"), std::string::npos) << series;
    EXPECT_EQ(series.find("request_id"), std::string::npos) << series;
  }
}

TEST(RouterMetricsTest, BucketListsAreTheDocumentedOnes) {
  EXPECT_THAT(RouterMetrics::TimeToFirstTokenBuckets(),
              testing::ElementsAre(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                   0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                                   640.0, 2560.0));
  EXPECT_THAT(RouterMetrics::TokenLatencyBuckets(),
              testing::ElementsAre(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                   0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                                   40.0, 80.0));
  EXPECT_THAT(RouterMetrics::RequestLatencyBuckets(),
              testing::ElementsAre(0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5,
                                   5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                                   480.0, 960.0, 1920.0, 7680.0));
  EXPECT_THAT(RouterMetrics::PhaseBuckets(),
              testing::ElementsAre(0.0001, 0.00025, 0.0005, 0.001, 0.005, 0.01, 0.02, 0.04, 0.06,
                                   0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                                   80.0, 160.0, 640.0, 2560.0));
}

// Phase `phase`'s cumulative bucket counts at each `le`, then its _count.
std::vector<double> PhaseBuckets(const std::map<std::string, double>& s, const std::string& phase,
                                 const std::vector<std::string>& les) {
  std::vector<double> out;
  for (const std::string& le : les) {
    auto it =
        s.find("tandem_request_phase_seconds_bucket{phase=\"" + phase + "\",le=\"" + le + "\"}");
    out.push_back(it == s.end() ? -1 : it->second);
  }
  out.push_back(s.at("tandem_request_phase_seconds_count{phase=\"" + phase + "\"}"));
  return out;
}

double PhaseSum(const std::map<std::string, double>& s, const std::string& phase) {
  return s.at("tandem_request_phase_seconds_sum{phase=\"" + phase + "\"}");
}

TEST(RouterMetricsTest, RemoteRequestObservesEveryPhaseOnce) {
  RouterMetrics metrics;
  RequestTimer timer(&metrics, kT0, 1);
  v1::RequestTiming t;
  t.set_ttft_ms(20);
  t.set_router_queue_ms(0.2);    // (0.0001, 0.00025] s
  t.set_placement_ms(3);         // (0.001, 0.005]
  t.set_prefill_queue_ms(4);     // (0.001, 0.005]
  t.set_prefill_ms(12.8);        // (0.01, 0.02]
  t.set_kv_transfer_ms(0.3);     // (0.00025, 0.0005]
  t.set_decode_admission_ms(0);  // (0, 0.0001]
  t.set_first_decode_ms(2);      // (0.001, 0.005]
  timer.PhasesKnown(t, /*remote=*/true);
  timer.PhasesKnown(t, /*remote=*/true);  // another sample's: not observed again
  const auto s = Scrape(metrics);
  const std::vector<std::string> les = {"0.0001", "0.00025", "0.0005", "0.001",
                                        "0.005",  "0.01",    "0.02",   "+Inf"};
  EXPECT_THAT(PhaseBuckets(s, "router_queue", les),
              testing::ElementsAre(0, 1, 1, 1, 1, 1, 1, 1, 1));
  EXPECT_THAT(PhaseBuckets(s, "placement", les), testing::ElementsAre(0, 0, 0, 0, 1, 1, 1, 1, 1));
  EXPECT_THAT(PhaseBuckets(s, "prefill_queue", les),
              testing::ElementsAre(0, 0, 0, 0, 1, 1, 1, 1, 1));
  EXPECT_THAT(PhaseBuckets(s, "prefill", les), testing::ElementsAre(0, 0, 0, 0, 0, 0, 1, 1, 1));
  EXPECT_THAT(PhaseBuckets(s, "kv_transfer", les), testing::ElementsAre(0, 0, 1, 1, 1, 1, 1, 1, 1));
  EXPECT_THAT(PhaseBuckets(s, "decode_admission", les),
              testing::ElementsAre(1, 1, 1, 1, 1, 1, 1, 1, 1));
  EXPECT_THAT(PhaseBuckets(s, "first_decode", les),
              testing::ElementsAre(0, 0, 0, 0, 1, 1, 1, 1, 1));
  EXPECT_DOUBLE_EQ(PhaseSum(s, "prefill"), 0.0128);
  EXPECT_DOUBLE_EQ(PhaseSum(s, "kv_transfer"), 0.0003);
}

TEST(RouterMetricsTest, LocalRequestObservesOnlyThePhasesOfItsRoute) {
  RouterMetrics metrics;
  RequestTimer timer(&metrics, kT0, 1);
  v1::RequestTiming t;
  t.set_ttft_ms(10);
  t.set_router_queue_ms(1);
  t.set_placement_ms(0.5);
  t.set_prefill_queue_ms(0.5);
  t.set_prefill_ms(8);
  timer.PhasesKnown(t, /*remote=*/false);
  const auto s = Scrape(metrics);
  for (const char* phase : {"router_queue", "placement", "prefill_queue", "prefill"}) {
    EXPECT_EQ(s.at(std::string("tandem_request_phase_seconds_count{phase=\"") + phase + "\"}"), 1)
        << phase;
  }
  for (const char* phase : {"kv_transfer", "decode_admission", "first_decode"}) {
    EXPECT_EQ(s.at(std::string("tandem_request_phase_seconds_count{phase=\"") + phase + "\"}"), 0)
        << phase;
  }
  EXPECT_DOUBLE_EQ(PhaseSum(s, "router_queue"), 0.001);
  EXPECT_DOUBLE_EQ(PhaseSum(s, "prefill"), 0.008);
}

TEST(RouterMetricsTest, OneRequestsTimingsLandInTheirBuckets) {
  RouterMetrics metrics;
  metrics.RequestStarted(7);
  RequestTimer timer(&metrics, kT0, 1);
  timer.TokensSent(0, 1, At(30));   // TTFT 0.030 s: (0.02, 0.04]
  timer.TokensSent(0, 1, At(32));   // gap 0.002 s: (0.001, 0.0025]
  timer.TokensSent(0, 2, At(40));   // gap 0.008 s: (0.005, 0.01]; 4 tokens
  timer.Finished(At(70), Route::kRemote, absl::StatusCode::kOk, v1::FINISH_LENGTH, 3);
  const auto s = Scrape(metrics);

  EXPECT_THAT(Buckets(s, "tandem_time_to_first_token_seconds", {"0.02", "0.04", "+Inf"}),
              testing::ElementsAre(0, 1, 1, 1));
  EXPECT_DOUBLE_EQ(s.at("tandem_time_to_first_token_seconds_sum"), 0.030);
  EXPECT_THAT(Buckets(s, "tandem_inter_token_latency_seconds",
                      {"0.001", "0.0025", "0.005", "0.01", "+Inf"}),
              testing::ElementsAre(0, 1, 1, 2, 2, 2));
  EXPECT_DOUBLE_EQ(s.at("tandem_inter_token_latency_seconds_sum"), 0.010);
  // (40 - 30) ms / (4 - 1) tokens.
  EXPECT_THAT(Buckets(s, "tandem_time_per_output_token_seconds", {"0.0025", "0.005", "+Inf"}),
              testing::ElementsAre(0, 1, 1, 1));
  EXPECT_DOUBLE_EQ(s.at("tandem_time_per_output_token_seconds_sum"), 0.010 / 3);
  EXPECT_THAT(Buckets(s, "tandem_e2e_request_latency_seconds", {"0.05", "0.1", "+Inf"}),
              testing::ElementsAre(0, 1, 1, 1));
  EXPECT_DOUBLE_EQ(s.at("tandem_e2e_request_latency_seconds_sum"), 0.070);

  EXPECT_EQ(s.at(Requests("remote", "length")), 1);
  EXPECT_EQ(s.at("tandem_prompt_tokens_total"), 7);
  EXPECT_EQ(s.at("tandem_generation_tokens_total"), 4);
  EXPECT_EQ(s.at("tandem_prompt_tokens_cached_total"), 3);
  const RouterMetrics::Totals t = metrics.totals();
  EXPECT_EQ(t.requests, 1u);
  EXPECT_EQ(t.request_errors, 0u);
  EXPECT_EQ(t.prompt_tokens, 7u);
  EXPECT_EQ(t.generation_tokens, 4u);
  EXPECT_EQ(t.prompt_tokens_cached, 3u);
}

TEST(RouterMetricsTest, SamplesAreTimedApartAndTheRequestCountedOnceBySampleZero) {
  RouterMetrics metrics;
  RequestTimer timer(&metrics, kT0, 2);
  timer.TokensSent(1, 1, At(200));  // the request's first token: TTFT 0.2 s
  timer.TokensSent(0, 1, At(300));  // sample 0's first: no gap, no second TTFT
  timer.TokensSent(1, 1, At(350));  // sample 1: gap 0.15 s
  timer.TokensSent(0, 1, At(320));  // sample 0: gap 0.02 s
  timer.TokensSent(0, 2, At(340));  // sample 0: gap 0.02 s; 4 tokens over 40 ms
  timer.TokensSent(5, 1, At(345));  // no such sample: ignored
  timer.Finished(At(400), Route::kLocal, absl::StatusCode::kOk, v1::FINISH_STOP, 0);
  const auto s = Scrape(metrics);

  EXPECT_EQ(s.at("tandem_time_to_first_token_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(s.at("tandem_time_to_first_token_seconds_sum"), 0.2);
  EXPECT_THAT(Buckets(s, "tandem_inter_token_latency_seconds", {"0.01", "0.025", "0.15"}),
              testing::ElementsAre(0, 2, 3, 3));
  EXPECT_DOUBLE_EQ(s.at("tandem_inter_token_latency_seconds_sum"), 0.19);
  // Sample 0: 40 ms / 3; sample 1: 150 ms / 1.
  EXPECT_THAT(Buckets(s, "tandem_time_per_output_token_seconds", {"0.01", "0.025", "0.15"}),
              testing::ElementsAre(0, 1, 2, 2));
  EXPECT_DOUBLE_EQ(s.at("tandem_time_per_output_token_seconds_sum"), 0.040 / 3 + 0.150);
  EXPECT_EQ(s.at("tandem_generation_tokens_total"), 6);
  EXPECT_EQ(s.at(Requests("local", "stop")), 1);
  EXPECT_EQ(metrics.totals().requests, 1u);
}

TEST(RouterMetricsTest, OneTokenRequestHasNoTimePerOutputTokenAndEndsOnce) {
  RouterMetrics metrics;
  RequestTimer timer(&metrics, kT0, 1);
  timer.TokensSent(0, 1, At(5));
  timer.Finished(At(6), Route::kLocal, absl::StatusCode::kOk, v1::FINISH_STOP, 0);
  timer.TokensSent(0, 1, At(7));  // after the end: ignored
  timer.Finished(At(8), Route::kLocal, absl::StatusCode::kCancelled, v1::FINISH_NONE, 9);
  const auto s = Scrape(metrics);
  EXPECT_EQ(s.at("tandem_time_per_output_token_seconds_count"), 0);
  EXPECT_EQ(s.at("tandem_inter_token_latency_seconds_count"), 0);
  EXPECT_EQ(s.at("tandem_e2e_request_latency_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(s.at("tandem_e2e_request_latency_seconds_sum"), 0.006);
  EXPECT_EQ(s.at("tandem_generation_tokens_total"), 1);
  EXPECT_EQ(s.at("tandem_prompt_tokens_cached_total"), 0);
  EXPECT_EQ(s.at(Requests("local", "stop")), 1);
  EXPECT_EQ(s.at(Requests("local", "cancelled")), 0);
}

TEST(RouterMetricsTest, ErrorsAndRefusalsAreCountedByRouteReasonAndCode) {
  RouterMetrics metrics;
  metrics.RequestRefused(absl::StatusCode::kInvalidArgument);
  metrics.RequestRefused(absl::StatusCode::kInvalidArgument);
  metrics.RequestRefused(absl::StatusCode::kResourceExhausted);
  metrics.RequestRefused(absl::StatusCode::kUnauthenticated);
  metrics.RequestRefused(absl::StatusCode::kCancelled);  // left the admission queue
  {
    // Admitted, streamed a token, then the client went away.
    RequestTimer timer(&metrics, kT0, 1);
    timer.TokensSent(0, 1, At(10));
    timer.Finished(At(20), Route::kRemote, absl::StatusCode::kCancelled, v1::FINISH_NONE, 0);
  }
  {
    // Admitted, no healthy decode worker: no token, no TTFT.
    RequestTimer timer(&metrics, kT0, 1);
    timer.Finished(At(1), Route::kNone, absl::StatusCode::kUnavailable, v1::FINISH_NONE, 0);
  }
  {
    // A sample ended by the decode worker's cancel (FINISH_CANCELLED, OK).
    RequestTimer timer(&metrics, kT0, 1);
    timer.TokensSent(0, 1, At(10));
    timer.Finished(At(11), Route::kLocal, absl::StatusCode::kOk, v1::FINISH_CANCELLED, 0);
  }
  {
    RequestTimer timer(&metrics, kT0, 1);
    timer.TokensSent(0, 1, At(10));
    timer.Finished(At(11), Route::kLocal, absl::StatusCode::kOk, v1::FINISH_CONTEXT, 0);
  }
  const auto s = Scrape(metrics);
  // 2 invalid, exhausted, unauthenticated, and the admitted one that found
  // no decode worker.
  EXPECT_EQ(s.at(Requests("none", "error")), 5);
  EXPECT_EQ(s.at(Requests("none", "cancelled")), 1);
  EXPECT_EQ(s.at(Requests("remote", "cancelled")), 1);
  EXPECT_EQ(s.at(Requests("local", "cancelled")), 1);
  EXPECT_EQ(s.at(Requests("local", "context")), 1);
  EXPECT_EQ(s.at("tandem_request_errors_total{code=\"invalid_argument\"}"), 2);
  EXPECT_EQ(s.at("tandem_request_errors_total{code=\"resource_exhausted\"}"), 1);
  EXPECT_EQ(s.at("tandem_request_errors_total{code=\"unauthenticated\"}"), 1);
  EXPECT_EQ(s.at("tandem_request_errors_total{code=\"cancelled\"}"), 2);
  EXPECT_EQ(s.at("tandem_request_errors_total{code=\"unavailable\"}"), 1);
  EXPECT_EQ(s.count("tandem_request_errors_total{code=\"internal\"}"), 0u);
  // Refusals never ran: no latency observed; three admitted requests did.
  EXPECT_EQ(s.at("tandem_e2e_request_latency_seconds_count"), 4);
  EXPECT_EQ(s.at("tandem_time_to_first_token_seconds_count"), 3);
  const RouterMetrics::Totals t = metrics.totals();
  EXPECT_EQ(t.requests, 9u);
  EXPECT_EQ(t.request_errors, 7u);
}

TEST(RouterMetricsTest, AdmissionFeedsTheGaugesAndQueueTime) {
  RouterMetrics metrics;
  Admission::Options options;
  options.max_inflight = 1;
  options.max_queued = 1;
  Admission admission(options, metrics.AdmissionObserver());
  const absl::Time later = absl::Now() + absl::Hours(1);
  int started = 0;
  admission.Submit(later, [&] { ++started; }, [](absl::Status) {});
  admission.Submit(later, [&] { ++started; }, [](absl::Status) {});
  ASSERT_EQ(admission.Submit(later, [&] { ++started; }, [](absl::Status) {}).status.code(),
            absl::StatusCode::kResourceExhausted);
  auto s = Scrape(metrics);
  EXPECT_EQ(s.at("tandem_num_requests_running"), 1);
  EXPECT_EQ(s.at("tandem_num_requests_waiting"), 1);
  EXPECT_EQ(s.at("tandem_request_queue_time_seconds_count"), 1);  // the first, at once
  EXPECT_EQ(s.at("tandem_request_queue_time_seconds_sum"), 0);
  admission.Release();
  s = Scrape(metrics);
  EXPECT_EQ(started, 2);
  EXPECT_EQ(s.at("tandem_num_requests_running"), 1);
  EXPECT_EQ(s.at("tandem_num_requests_waiting"), 0);
  EXPECT_EQ(s.at("tandem_request_queue_time_seconds_count"), 2);  // the refusal never waited
  admission.Release();
  s = Scrape(metrics);
  EXPECT_EQ(s.at("tandem_num_requests_running"), 0);

  // Observed directly: exact buckets.
  RouterMetrics direct;
  direct.ObserveQueueTime(absl::ZeroDuration());
  direct.ObserveQueueTime(absl::Milliseconds(400));
  direct.SetAdmissionCounts(3, 2);
  s = Scrape(direct);
  EXPECT_THAT(Buckets(s, "tandem_request_queue_time_seconds", {"0.01", "0.3", "0.5"}),
              testing::ElementsAre(1, 1, 2, 2));
  EXPECT_DOUBLE_EQ(s.at("tandem_request_queue_time_seconds_sum"), 0.4);
  EXPECT_EQ(s.at("tandem_num_requests_running"), 3);
  EXPECT_EQ(s.at("tandem_num_requests_waiting"), 2);
}

TEST(RouterMetricsTest, NullMetricsRecordNothing) {
  RequestTimer timer(nullptr, kT0, 1);
  timer.TokensSent(0, 1, At(1));
  timer.Finished(At(2), Route::kLocal, absl::StatusCode::kOk, v1::FINISH_STOP, 0);
  timer.PhasesKnown(v1::RequestTiming(), true);
}

}  // namespace
}  // namespace tandem::router
