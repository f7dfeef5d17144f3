// WorkerMetrics: every family's value comes from the status snapshot it is
// given, read back through metrics::Scrape (prometheus-cpp's text
// serializer) and an independent parser (python3-prometheus-client); the
// step histogram's buckets and counts; ServeMetrics over real HTTP.
#include "worker/worker_metrics.h"

#include <map>
#include <memory>
#include <string>

#include <httplib.h>

#include "common/http/http_server.h"
#include "common/metrics/metrics_server.h"
#include "gtest/gtest.h"
#include "tests/common/prometheus_text.h"

namespace tandem {
namespace {

using testing::ParsePrometheusText;
using testing::PromSample;

// A status with a distinct value in every field the metrics read.
v1::WorkerStatus DistinctStatus() {
  v1::WorkerStatus s;
  s.set_running_requests(7);
  s.set_waiting_requests(3);
  s.set_kv_blocks_in_use(11);
  s.set_kv_blocks_cached(13);
  s.set_kv_blocks_total(512);
  s.set_transfers_in_flight(2);
  s.set_prefill_tokens_computed_total(1001);
  s.set_kv_bytes_sent_total(123456789012ull);
  s.set_kv_bytes_received_total(2002);
  s.set_preemptions_total(5);
  s.set_prompt_tokens_total(3003);
  s.set_prompt_tokens_cached_total(404);
  s.set_generation_tokens_total(5005);
  s.set_prefix_cache_queried_tokens_total(6006);
  s.set_prefix_cache_hit_tokens_total(707);
  s.set_engine_steps_total(8008);
  s.set_kv_transfers_sent_total(17);
  s.set_kv_transfers_received_total(19);
  s.set_kv_transfer_seconds_sent_total(1.25);
  s.set_kv_transfer_seconds_received_total(2.5);
  v1::StepModel* m = s.mutable_step_model();
  m->set_samples(57);
  m->set_base_ms(1.5);
  m->set_prefill_ms_per_token(0.25);
  m->set_prefill_ms_per_kilo_pair(0.125);
  m->set_decode_ms_per_seq(0.75);
  m->set_decode_ms_per_kilo_context(0.0625);
  m->set_prefill_tokens_per_s(3000);
  m->set_decode_step_ms(2.5);
  m->set_mean_abs_error_ms(0.5);
  (*m->mutable_kv_link_bytes_per_s())["prefill-0"] = 1e9;
  return s;
}

std::map<std::string, PromSample> ScrapeAndParse(const std::shared_ptr<WorkerMetrics>& m) {
  const std::string text = metrics::Scrape({m});
  absl::StatusOr<std::map<std::string, PromSample>> parsed = ParsePrometheusText(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  return parsed.ok() ? *parsed : std::map<std::string, PromSample>{};
}

void ExpectSample(const std::map<std::string, PromSample>& samples, const std::string& key,
                  const std::string& type, double value) {
  auto it = samples.find(key);
  ASSERT_NE(it, samples.end()) << key;
  EXPECT_EQ(it->second.type, type) << key;
  EXPECT_EQ(it->second.value, value) << key;
}

TEST(WorkerMetricsTest, EveryFamilyReadsTheStatusSnapshot) {
  int snapshots = 0;
  auto m = std::make_shared<WorkerMetrics>([&] {
    ++snapshots;
    return DistinctStatus();
  });
  const std::map<std::string, PromSample> s = ScrapeAndParse(m);
  EXPECT_EQ(snapshots, 1);  // one snapshot per scrape: the values agree
  ExpectSample(s, "tandem_prompt_tokens_total{}", "counter", 3003);
  ExpectSample(s, "tandem_prompt_tokens_cached_total{}", "counter", 404);
  ExpectSample(s, "tandem_generation_tokens_total{}", "counter", 5005);
  ExpectSample(s, "tandem_prefill_tokens_computed_total{}", "counter", 1001);
  ExpectSample(s, "tandem_prefix_cache_queries_total{}", "counter", 6006);
  ExpectSample(s, "tandem_prefix_cache_hits_total{}", "counter", 707);
  ExpectSample(s, "tandem_preemptions_total{}", "counter", 5);
  // No counters source: every byte went over tcp.
  ExpectSample(s, "tandem_kv_transfer_bytes_total{direction=\"sent\",transport=\"tcp\"}",
               "counter", 123456789012.0);
  ExpectSample(s, "tandem_kv_transfer_bytes_total{direction=\"received\",transport=\"tcp\"}",
               "counter", 2002);
  for (const char* direction : {"sent", "received"}) {
    for (const char* transport : {"nccl", "cuda_ipc"}) {
      ExpectSample(s,
                   std::string("tandem_kv_transfer_bytes_total{direction=\"") + direction +
                       "\",transport=\"" + transport + "\"}",
                   "counter", 0);
    }
  }
  ExpectSample(s, "tandem_kv_transfer_stream_seconds_sum{}", "summary", 0);
  ExpectSample(s, "tandem_kv_transfer_stream_seconds_count{}", "summary", 0);
  ExpectSample(s, "tandem_kv_load_to_first_decode_seconds_sum{}", "summary", 0);
  ExpectSample(s, "tandem_kv_load_to_first_decode_seconds_count{}", "summary", 0);
  ExpectSample(s, "tandem_kv_transfers_total{direction=\"sent\"}", "counter", 17);
  ExpectSample(s, "tandem_kv_transfers_total{direction=\"received\"}", "counter", 19);
  ExpectSample(s, "tandem_kv_transfer_seconds_total{direction=\"sent\"}", "counter", 1.25);
  ExpectSample(s, "tandem_kv_transfer_seconds_total{direction=\"received\"}", "counter", 2.5);
  ExpectSample(s, "tandem_num_requests_running{}", "gauge", 7 - 3);
  ExpectSample(s, "tandem_num_requests_waiting{}", "gauge", 3);
  ExpectSample(s, "tandem_kv_cache_blocks{state=\"used\"}", "gauge", 11);
  ExpectSample(s, "tandem_kv_cache_blocks{state=\"cached\"}", "gauge", 13);
  ExpectSample(s, "tandem_kv_cache_blocks{state=\"total\"}", "gauge", 512);
  ExpectSample(s, "tandem_kv_transfers_in_flight{}", "gauge", 2);
  ExpectSample(s, "tandem_engine_step_duration_seconds_count{}", "histogram", 0);
  ExpectSample(s, "tandem_step_model_coefficient{term=\"base_ms\"}", "gauge", 1.5);
  ExpectSample(s, "tandem_step_model_coefficient{term=\"prefill_ms_per_token\"}", "gauge", 0.25);
  ExpectSample(s, "tandem_step_model_coefficient{term=\"prefill_ms_per_kilo_pair\"}", "gauge",
               0.125);
  ExpectSample(s, "tandem_step_model_coefficient{term=\"decode_ms_per_seq\"}", "gauge", 0.75);
  ExpectSample(s, "tandem_step_model_coefficient{term=\"decode_ms_per_kilo_context\"}", "gauge",
               0.0625);
  ExpectSample(s, "tandem_step_model_prefill_tokens_per_second{}", "gauge", 3000);
  ExpectSample(s, "tandem_step_model_decode_step_seconds{}", "gauge", 0.0025);
  ExpectSample(s, "tandem_step_model_error_seconds{}", "gauge", 0.0005);
  ExpectSample(s, "tandem_kv_link_bytes_per_second{peer=\"prefill-0\"}", "gauge", 1e9);
  for (const char* phase : WorkerMetrics::kPhases) {
    ExpectSample(s, std::string("tandem_worker_request_phase_seconds_count{phase=\"") + phase +
                        "\"}",
                 "histogram", 0);
  }
  // Nothing else: 10 single samples, 2 x 2 directions, 2 x 3 transports,
  // 3 states, 2 summaries' _sum + _count, the step histogram's 14 buckets +
  // _count + _sum, the step model's 5 terms + 3 single gauges + 1 link,
  // and 6 phase histograms of 16 samples each.
  EXPECT_EQ(s.size(), 10u + 4u + 6u + 3u + 4u + 14u + 2u + 9u + 6u * 16u);
}

// Each phase a request went through is observed once, in seconds; phases
// it did not go through (0 ms) are not.
TEST(WorkerMetricsTest, PhasesAreObservedInSeconds) {
  auto m = std::make_shared<WorkerMetrics>([] { return v1::WorkerStatus(); });
  core::RequestPhases local;
  local.placement_ms = 0.5;
  local.prefill_queue_ms = 2;
  local.prefill_ms = 30;
  m->ObservePhases(local);
  core::RequestPhases remote;
  remote.placement_ms = 0.25;
  remote.kv_transfer_ms = 40;
  remote.decode_admission_ms = 1;
  remote.first_decode_ms = 3;
  m->ObservePhases(remote);
  const std::map<std::string, PromSample> s = ScrapeAndParse(m);
  const auto count = [&](const std::string& phase) {
    return s.at("tandem_worker_request_phase_seconds_count{phase=\"" + phase + "\"}").value;
  };
  const auto sum = [&](const std::string& phase) {
    return s.at("tandem_worker_request_phase_seconds_sum{phase=\"" + phase + "\"}").value;
  };
  EXPECT_EQ(count("placement"), 2);
  EXPECT_DOUBLE_EQ(sum("placement"), 0.00075);
  EXPECT_EQ(count("prefill"), 1);
  EXPECT_DOUBLE_EQ(sum("prefill"), 0.03);
  EXPECT_EQ(count("kv_transfer"), 1);
  EXPECT_DOUBLE_EQ(sum("kv_transfer"), 0.04);
  EXPECT_EQ(count("first_decode"), 1);
  // 30 ms lands in the le="0.05" bucket, not in le="0.025".
  EXPECT_EQ(s.at("tandem_worker_request_phase_seconds_bucket{le=\"0.025\",phase=\"prefill\"}")
                .value,
            0);
  EXPECT_EQ(s.at("tandem_worker_request_phase_seconds_bucket{le=\"0.05\",phase=\"prefill\"}")
                .value,
            1);
}

// With a KvTransportCounters source: the bytes by direction and transport,
// the stream and load timings, exactly as given; one counters snapshot per
// scrape, beside the one status snapshot.
TEST(WorkerMetricsTest, TransportFamiliesReadTheCountersSnapshot) {
  int snapshots = 0;
  auto m = std::make_shared<WorkerMetrics>([] { return DistinctStatus(); },
                                           [&] {
                                             ++snapshots;
                                             KvTransportCounters c;
                                             c.bytes_sent = {11, 222, 3333};
                                             c.bytes_received = {44, 555, 6666666666ull};
                                             c.transfer_seconds_sum = 1.5;
                                             c.transfers = 3;
                                             c.load_to_first_decode_seconds_sum = 0.25;
                                             c.loads = 2;
                                             return c;
                                           });
  const std::map<std::string, PromSample> s = ScrapeAndParse(m);
  EXPECT_EQ(snapshots, 1);
  const std::string bytes = "tandem_kv_transfer_bytes_total{direction=\"";
  ExpectSample(s, bytes + "sent\",transport=\"tcp\"}", "counter", 11);
  ExpectSample(s, bytes + "sent\",transport=\"nccl\"}", "counter", 222);
  ExpectSample(s, bytes + "sent\",transport=\"cuda_ipc\"}", "counter", 3333);
  ExpectSample(s, bytes + "received\",transport=\"tcp\"}", "counter", 44);
  ExpectSample(s, bytes + "received\",transport=\"nccl\"}", "counter", 555);
  ExpectSample(s, bytes + "received\",transport=\"cuda_ipc\"}", "counter", 6666666666.0);
  ExpectSample(s, "tandem_kv_transfer_stream_seconds_sum{}", "summary", 1.5);
  ExpectSample(s, "tandem_kv_transfer_stream_seconds_count{}", "summary", 3);
  ExpectSample(s, "tandem_kv_load_to_first_decode_seconds_sum{}", "summary", 0.25);
  ExpectSample(s, "tandem_kv_load_to_first_decode_seconds_count{}", "summary", 2);
  // The status-backed families are unchanged by the counters.
  ExpectSample(s, "tandem_kv_transfers_total{direction=\"received\"}", "counter", 19);
}

// The exposition text itself (what a scraper reads): the bytes family's
// samples carry both labels, the summaries have no quantile lines.
TEST(WorkerMetricsTest, TransportFamiliesExpositionText) {
  auto m = std::make_shared<WorkerMetrics>([] { return v1::WorkerStatus(); }, [] {
    KvTransportCounters c;
    c.received(kvtransfer::KvTransport::kNccl) = 4096;
    c.transfer_seconds_sum = 0.5;
    c.transfers = 1;
    return c;
  });
  const std::string text = metrics::Scrape({m});
  EXPECT_NE(text.find("# TYPE tandem_kv_transfer_bytes_total counter\n"), std::string::npos)
      << text;
  EXPECT_NE(
      text.find("tandem_kv_transfer_bytes_total{direction=\"received\",transport=\"nccl\"} 4096\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE tandem_kv_transfer_stream_seconds summary\n"
                      "tandem_kv_transfer_stream_seconds_count 1\n"
                      "tandem_kv_transfer_stream_seconds_sum 0.5\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("quantile"), std::string::npos) << text;
}

TEST(WorkerMetricsTest, CountersFromStatusPutsEveryByteOnTcp) {
  const KvTransportCounters c = CountersFromStatus(DistinctStatus());
  EXPECT_EQ(c.bytes_sent, (std::array<uint64_t, 3>{123456789012ull, 0, 0}));
  EXPECT_EQ(c.bytes_received, (std::array<uint64_t, 3>{2002, 0, 0}));
  EXPECT_EQ(c.transfers, 0u);
  EXPECT_EQ(c.loads, 0u);
  EXPECT_EQ(kKvTransportLabels[static_cast<int>(kvtransfer::KvTransport::kCudaIpc)], "cuda_ipc");
}

TEST(WorkerMetricsTest, StepHistogramHasTheDocumentedBuckets) {
  auto m = std::make_shared<WorkerMetrics>([] { return v1::WorkerStatus(); });
  const std::vector<double> expected = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                        0.25,  0.5,    1.0,   2.5,  5.0,   10.0};
  EXPECT_EQ(WorkerMetrics::StepBuckets(), expected);
  m->ObserveStep(0.0004);  // first bucket
  m->ObserveStep(0.003);   // le 0.005
  m->ObserveStep(0.003);
  m->ObserveStep(20.0);    // only +Inf
  const std::map<std::string, PromSample> s = ScrapeAndParse(m);
  const std::string h = "tandem_engine_step_duration_seconds";
  ExpectSample(s, h + "_bucket{le=\"0.001\"}", "histogram", 1);
  ExpectSample(s, h + "_bucket{le=\"0.0025\"}", "histogram", 1);
  ExpectSample(s, h + "_bucket{le=\"0.005\"}", "histogram", 3);
  ExpectSample(s, h + "_bucket{le=\"10\"}", "histogram", 3);
  ExpectSample(s, h + "_bucket{le=\"+Inf\"}", "histogram", 4);
  ExpectSample(s, h + "_count{}", "histogram", 4);
  ExpectSample(s, h + "_sum{}", "histogram", 0.0004 + 0.003 + 0.003 + 20.0);
  // Every counter of an empty status is 0, not absent.
  ExpectSample(s, "tandem_prompt_tokens_total{}", "counter", 0);
}

TEST(WorkerMetricsTest, ScrapeSkipsExpiredCollectables) {
  std::weak_ptr<prometheus::Collectable> gone;
  {
    auto m = std::make_shared<WorkerMetrics>([] { return DistinctStatus(); });
    gone = m;
  }
  EXPECT_EQ(metrics::Scrape({gone}), "");
}

// GET /metrics over real HTTP: 200, the exposition content type, a body
// collected at scrape time; another method on the path is 405.
TEST(MetricsServerTest, ServesTheCollectablesOverHttp) {
  uint32_t steps = 0;
  auto m = std::make_shared<WorkerMetrics>([&] {
    v1::WorkerStatus s;
    s.set_engine_steps_total(++steps);  // a new value per scrape
    return s;
  });
  http::HttpServer server{http::HttpServer::Options{}};
  metrics::ServeMetrics(&server, {m});
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Client client("127.0.0.1", *port);
  for (int scrape = 1; scrape <= 2; ++scrape) {
    httplib::Result r = client.Get("/metrics");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), metrics::kContentType);
    absl::StatusOr<std::map<std::string, PromSample>> parsed = ParsePrometheusText(r->body);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->size(), 43u + 8u + 6u * 16u);  // no link rate measured
    EXPECT_EQ(steps, static_cast<uint32_t>(scrape));
  }
  httplib::Result post = client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  server.Stop();
}

}  // namespace
}  // namespace tandem
