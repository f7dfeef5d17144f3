// Each worker's GET /metrics (metrics_listen) through a real cluster:
// scraped over HTTP (cpp-httplib), parsed by an independent parser
// (python3-prometheus-client), every counter and gauge equal to that
// worker's own GetStatus once the cluster is idle, the step histogram's
// _count equal to the steps GetStatus counted, and the totals consistent
// with what the Generate streams returned (local and remote routes).
#include <httplib.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/common/prometheus_text.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

using Samples = std::map<std::string, PromSample>;

// KV bytes per prompt token of stories260K.gguf: 5 layers x (K, V) x 4 KV
// heads x head_dim 8 x 4 bytes (as counters_cancel_test.cc).
constexpr uint64_t kKvBytesPerToken = 5 * 2 * 4 * 8 * 4;

// "host:port" of worker `name`'s metrics server, from its log line
// "<time> <name>: metrics: serving http://HOST:PORT/metrics"; "" if absent.
std::string MetricsAddress(const std::string& logs, const std::string& name) {
  const std::string marker = name + ": metrics: serving http://";
  for (absl::string_view line : absl::StrSplit(logs, '\n')) {
    const size_t at = line.find(marker);
    if (at == absl::string_view::npos) continue;
    absl::string_view rest = line.substr(at + marker.size());
    const size_t end = rest.find("/metrics");
    if (end != absl::string_view::npos) return std::string(rest.substr(0, end));
  }
  return "";
}

// GET http://address/metrics, checked (200, content type) and parsed.
Samples Scrape(const std::string& address) {
  std::vector<std::string> hp = absl::StrSplit(address, ':');
  int port = 0;
  if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &port)) {
    ADD_FAILURE() << "bad metrics address '" << address << "'";
    return {};
  }
  httplib::Client client(hp[0], port);
  httplib::Result r = client.Get("/metrics");
  if (!r) {
    ADD_FAILURE() << "GET " << address << "/metrics: " << httplib::to_string(r.error());
    return {};
  }
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  absl::StatusOr<Samples> parsed = ParsePrometheusText(r->body);
  EXPECT_TRUE(parsed.ok()) << parsed.status() << "\n" << r->body;
  return parsed.value_or(Samples());
}

double Value(const Samples& s, const std::string& key) {
  auto it = s.find(key);
  if (it == s.end()) {
    ADD_FAILURE() << "no sample " << key;
    return -1;
  }
  return it->second.value;
}

// Every sample of a worker's scrape against its GetStatus (taken while
// idle, so the two snapshots agree), and no label but direction (with
// transport), state, le.
void ExpectEqualsStatus(const Samples& m, const v1::WorkerStatus& st) {
  const auto d = [](auto v) { return static_cast<double>(v); };
  EXPECT_EQ(Value(m, "tandem_prompt_tokens_total{}"), d(st.prompt_tokens_total()));
  EXPECT_EQ(Value(m, "tandem_prompt_tokens_cached_total{}"), d(st.prompt_tokens_cached_total()));
  EXPECT_EQ(Value(m, "tandem_generation_tokens_total{}"), d(st.generation_tokens_total()));
  EXPECT_EQ(Value(m, "tandem_prefill_tokens_computed_total{}"),
            d(st.prefill_tokens_computed_total()));
  EXPECT_EQ(Value(m, "tandem_prefix_cache_queries_total{}"),
            d(st.prefix_cache_queried_tokens_total()));
  EXPECT_EQ(Value(m, "tandem_prefix_cache_hits_total{}"), d(st.prefix_cache_hit_tokens_total()));
  EXPECT_EQ(Value(m, "tandem_preemptions_total{}"), d(st.preemptions_total()));
  // A CPU cluster moves KV over tcp only: the totals are tcp's, the device
  // transports 0.
  EXPECT_EQ(Value(m, "tandem_kv_transfer_bytes_total{direction=\"sent\",transport=\"tcp\"}"),
            d(st.kv_bytes_sent_total()));
  EXPECT_EQ(
      Value(m, "tandem_kv_transfer_bytes_total{direction=\"received\",transport=\"tcp\"}"),
      d(st.kv_bytes_received_total()));
  for (const char* direction : {"sent", "received"}) {
    for (const char* transport : {"nccl", "cuda_ipc"}) {
      EXPECT_EQ(Value(m, std::string("tandem_kv_transfer_bytes_total{direction=\"") + direction +
                             "\",transport=\"" + transport + "\"}"),
                0);
    }
  }
  EXPECT_EQ(Value(m, "tandem_kv_transfers_total{direction=\"sent\"}"),
            d(st.kv_transfers_sent_total()));
  EXPECT_EQ(Value(m, "tandem_kv_transfers_total{direction=\"received\"}"),
            d(st.kv_transfers_received_total()));
  EXPECT_EQ(Value(m, "tandem_kv_transfer_seconds_total{direction=\"sent\"}"),
            st.kv_transfer_seconds_sent_total());
  EXPECT_EQ(Value(m, "tandem_kv_transfer_seconds_total{direction=\"received\"}"),
            st.kv_transfer_seconds_received_total());
  EXPECT_EQ(Value(m, "tandem_num_requests_running{}"),
            d(st.running_requests() - st.waiting_requests()));
  EXPECT_EQ(Value(m, "tandem_num_requests_waiting{}"), d(st.waiting_requests()));
  EXPECT_EQ(Value(m, "tandem_kv_cache_blocks{state=\"used\"}"), d(st.kv_blocks_in_use()));
  EXPECT_EQ(Value(m, "tandem_kv_cache_blocks{state=\"cached\"}"), d(st.kv_blocks_cached()));
  EXPECT_EQ(Value(m, "tandem_kv_cache_blocks{state=\"total\"}"), d(st.kv_blocks_total()));
  EXPECT_EQ(Value(m, "tandem_kv_transfers_in_flight{}"), d(st.transfers_in_flight()));
  EXPECT_EQ(Value(m, "tandem_engine_step_duration_seconds_count{}"),
            d(st.engine_steps_total()));
  EXPECT_EQ(Value(m, "tandem_engine_step_duration_seconds_bucket{le=\"+Inf\"}"),
            d(st.engine_steps_total()));
  // Gauges print with 6 significant digits or so: equal to that.
  EXPECT_NEAR(Value(m, "tandem_step_model_coefficient{term=\"base_ms\"}"),
              st.step_model().base_ms(), 1e-5 * (1 + st.step_model().base_ms()));
  EXPECT_NEAR(Value(m, "tandem_step_model_prefill_tokens_per_second{}"),
              st.step_model().prefill_tokens_per_s(),
              1e-5 * st.step_model().prefill_tokens_per_s());
  EXPECT_GT(st.step_model().samples(), 0u);  // the warm-up at least
  for (const auto& [key, sample] : m) {
    const size_t open = key.find('{');
    ASSERT_NE(open, std::string::npos) << key;
    EXPECT_TRUE(absl::StartsWith(key, "tandem_")) << key;
    const std::string labels = key.substr(open + 1, key.size() - open - 2);
    if (labels.empty()) continue;
    EXPECT_TRUE(absl::StartsWith(labels, "direction=") || absl::StartsWith(labels, "state=") ||
                absl::StartsWith(labels, "le=") || absl::StartsWith(labels, "term=") ||
                absl::StartsWith(labels, "phase=") || absl::StartsWith(labels, "peer="))
        << key;
  }
}

class WorkerMetricsClusterTest : public OwnClusterTest {};

TEST_F(WorkerMetricsClusterTest, EveryWorkersMetricsEqualItsGetStatus) {
  ClusterOptions options;
  options.worker_metrics = true;
  options.capture_stderr = true;
  ASSERT_NO_FATAL_FAILURE(StartCluster(options));
  const std::string logs = cluster().CapturedStderr();
  const std::string p_addr = MetricsAddress(logs, LocalCluster::kPrefillName);
  const std::string d_addr = MetricsAddress(logs, LocalCluster::kDecodeName);
  ASSERT_FALSE(p_addr.empty()) << logs;
  ASSERT_FALSE(d_addr.empty()) << logs;

  // Before any request: every counter 0, the pool's size known.
  for (const std::string& address : {p_addr, d_addr}) {
    const Samples m = Scrape(address);
    EXPECT_EQ(Value(m, "tandem_prompt_tokens_total{}"), 0);
    EXPECT_EQ(Value(m, "tandem_engine_step_duration_seconds_count{}"), 0);
    EXPECT_EQ(Value(m, "tandem_kv_cache_blocks{state=\"total\"}"), 512);
  }

  const GoldenCase& short_case = Golden("boundary_32tok");  // 2 full blocks
  const GoldenCase& long_case = Golden("long_repeated_313tok");
  // Local (twice: the second hits the decode worker's prefix cache), then
  // remote.
  StreamResult local1 = RunGenerate(cluster().stub(), MakeRequest(short_case.prompt, 8,
                                                                  v1::ROUTE_LOCAL));
  StreamResult local2 = RunGenerate(cluster().stub(), MakeRequest(short_case.prompt, 8,
                                                                  v1::ROUTE_LOCAL));
  StreamResult remote = RunGenerate(cluster().stub(), MakeRequest(long_case.prompt, 8,
                                                                  v1::ROUTE_REMOTE));
  for (const StreamResult* r : {&local1, &local2, &remote}) {
    ASSERT_TRUE(r->status.ok()) << r->status.error_message();
  }
  EXPECT_EQ(remote.route, "remote");
  v1::ClusterStatus last;
  ASSERT_TRUE(cluster().WaitForIdleWorkers(absl::Seconds(10), &last)) << last.DebugString();

  absl::StatusOr<v1::WorkerStatus> p = cluster().PrefillStatus();
  absl::StatusOr<v1::WorkerStatus> d = cluster().DecodeStatus();
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(d.ok()) << d.status();
  const Samples pm = Scrape(p_addr);
  const Samples dm = Scrape(d_addr);
  {
    SCOPED_TRACE("prefill-0");
    ExpectEqualsStatus(pm, *p);
  }
  {
    SCOPED_TRACE("decode-0");
    ExpectEqualsStatus(dm, *d);
  }

  // Phases: P prefilled the remote request, D the two local ones and
  // received the remote one's KV.
  EXPECT_EQ(Value(pm, "tandem_worker_request_phase_seconds_count{phase=\"prefill\"}"), 1);
  EXPECT_EQ(Value(dm, "tandem_worker_request_phase_seconds_count{phase=\"prefill\"}"), 2);
  EXPECT_EQ(Value(dm, "tandem_worker_request_phase_seconds_count{phase=\"kv_transfer\"}"), 1);

  // The totals against what the streams returned.
  const uint64_t short_len = short_case.prompt_ids.size();
  const uint64_t long_len = long_case.prompt_ids.size();
  EXPECT_EQ(p->prompt_tokens_total(), long_len);
  EXPECT_EQ(d->prompt_tokens_total(), 2 * short_len + long_len);
  EXPECT_EQ(p->generation_tokens_total() + d->generation_tokens_total(),
            uint64_t{local1.completion_tokens} + local2.completion_tokens +
                remote.completion_tokens);
  EXPECT_EQ(p->generation_tokens_total(), 1u);  // the remote request's token 0
  EXPECT_EQ(d->prompt_tokens_cached_total(),
            uint64_t{local1.cached_prompt_tokens} + local2.cached_prompt_tokens +
                remote.cached_prompt_tokens);
  // The repeat finds block 0 (the block holding the last prompt token is
  // computed again for its logits).
  EXPECT_EQ(local1.cached_prompt_tokens, 0u);
  EXPECT_EQ(local2.cached_prompt_tokens, 16u);
  EXPECT_EQ(p->prompt_tokens_cached_total(), 0u);
  EXPECT_GE(d->prefix_cache_hit_tokens_total(), d->prompt_tokens_cached_total());
  EXPECT_GE(d->prefix_cache_queried_tokens_total(), d->prefix_cache_hit_tokens_total());
  // One KV transfer, measured at both ends, the same bytes.
  EXPECT_EQ(p->kv_transfers_sent_total(), 1u);
  EXPECT_EQ(p->kv_transfers_received_total(), 0u);
  EXPECT_EQ(d->kv_transfers_received_total(), 1u);
  EXPECT_EQ(d->kv_transfers_sent_total(), 0u);
  EXPECT_EQ(p->kv_bytes_sent_total(), kKvBytesPerToken * long_len);
  EXPECT_EQ(d->kv_bytes_received_total(), kKvBytesPerToken * long_len);
  EXPECT_GT(p->kv_transfer_seconds_sent_total(), 0.0);
  EXPECT_GT(d->kv_transfer_seconds_received_total(), 0.0);
  EXPECT_GT(p->engine_steps_total(), 0u);
  EXPECT_GT(d->engine_steps_total(), 0u);
  EXPECT_EQ(Value(dm, "tandem_num_requests_running{}"), 0);
}

// --metrics-listen wins over the entry's key; a port that cannot be bound
// is a start-up error naming the key.
TEST(WorkerMetricsStartupTest, MetricsListenThatCannotBindIsAStartupError) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  // Hold a port so the worker's bind fails.
  httplib::Server holder;
  const int held = holder.bind_to_any_port("127.0.0.1");
  ASSERT_GT(held, 0);
  ClusterOptions options;
  const std::string config = dir + "/cluster.yaml";
  ASSERT_TRUE(WriteFile(config, ClusterYaml(options)));
  ProcessResult r = RunProcess(
      {BinaryPath("tandem-prefill-worker"), "--config", config, "--name", "prefill-0",
       "--model", ModelPath(), "--router", "127.0.0.1:1", "--metrics-listen",
       "127.0.0.1:" + std::to_string(held)},
      absl::Seconds(30));
  EXPECT_TRUE(r.exited) << r.Describe();
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("prefill_workers[prefill-0].metrics_listen"), std::string::npos)
      << r.err;
  r = RunProcess({BinaryPath("tandem-prefill-worker"), "--config", config, "--name",
                  "prefill-0", "--model", ModelPath(), "--metrics-listen", "nohost"},
                 absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("--metrics-listen"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem::testing
