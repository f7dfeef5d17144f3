// Tests for tools/status: the per-process line, the JSON form and the exit
// status rules of `tandem status`.
#include "tools/status.h"

#include <stdlib.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

tandem::v1::WorkerStatus Decode() {
  tandem::v1::WorkerStatus w;
  w.set_name("decode-0");
  w.set_role(tandem::v1::ROLE_DECODE);
  w.set_address("127.0.0.1:40001");
  w.set_kv_endpoint("127.0.0.1:40002");
  w.set_ready(true);
  w.set_healthy(true);
  w.set_running_requests(2);
  w.set_kv_blocks_in_use(5);
  w.set_kv_blocks_total(2048);
  w.set_transfers_in_flight(1);
  w.set_decode_tokens_total(77);
  w.set_kv_bytes_received_total(1ull << 33);
  w.set_max_decode_batch_size(2);
  w.set_kv_index_blocks(3);
  return w;
}

TEST(StatusFormatTest, OneLinePerProcess) {
  EXPECT_EQ(FormatStatusLine(Decode()),
            "decode-0 decode 127.0.0.1:40001 kv=127.0.0.1:40002 ready healthy running=2 "
            "kv_blocks=5/2048 cached=0 kv_index=3 transfers=1 prefill_tokens=0 decode_tokens=77 "
            "kv_sent=0 "
            "kv_received=8589934592 max_batch=2 preemptions=0");
  tandem::v1::WorkerStatus p;
  p.set_name("prefill-0");
  p.set_role(tandem::v1::ROLE_PREFILL);
  p.set_prefill_tokens_computed_total(300);
  EXPECT_EQ(FormatStatusLine(p),
            "prefill-0 prefill - not-ready unhealthy running=0 kv_blocks=0/0 cached=0 kv_index=0 "
            "transfers=0 prefill_tokens=300 decode_tokens=0 kv_sent=0 kv_received=0 max_batch=0 "
            "preemptions=0");
  // Workers report what a KV transfer peer must match and what must match
  // for bit-identical results.
  p.set_kv_layout_id("kv3/abc/L5.H4.D8/f32");
  p.set_bit_exact_class("tandem-cpu/avx2/v2");
  EXPECT_THAT(FormatStatusLine(p),
              ::testing::EndsWith(
                  " preemptions=0 kv_layout=kv3/abc/L5.H4.D8/f32 bit_exact=tandem-cpu/avx2/v2"));
  // Per-transport KV bytes (issue #16), names sorted.
  (*p.mutable_kv_bytes_by_transport())["tcp"] = 1280;
  (*p.mutable_kv_bytes_by_transport())["cuda_ipc"] = 0;
  EXPECT_THAT(FormatStatusLine(p),
              ::testing::HasSubstr(" kv_received=0 kv_by_transport=cuda_ipc:0,tcp:1280 max_batch=0"));
  // The router's line also has its admission queue (router.max_queued).
  tandem::v1::WorkerStatus router;
  router.set_name("router");
  router.set_role(tandem::v1::ROLE_ROUTER);
  router.set_running_requests(512);
  router.set_queued_requests(7);
  EXPECT_THAT(FormatStatusLine(router),
              ::testing::HasSubstr(" running=512 queued=7 kv_blocks=0/0 cached=0 transfers=0 "));
}

// Issue #32: a worker the router got no answer from has no numbers to
// show: zeros would read as idle.
TEST(StatusFormatTest, AnUnreachableWorkerShowsNoLoad) {
  tandem::v1::WorkerStatus w;  // what the router fills in (StatusAllAsync)
  w.set_name("decode-1");
  w.set_role(tandem::v1::ROLE_DECODE);
  w.set_address("127.0.0.1:40003");
  w.set_unreachable(true);
  EXPECT_EQ(FormatStatusLine(w),
            "decode-1 decode 127.0.0.1:40003 unreachable unhealthy (no answer to the router's "
            "GetStatus: its load is unknown)");
  tandem::v1::ClusterStatus s;
  *s.add_workers() = w;
  EXPECT_EQ(ClusterStatusToJson(s)["workers"][0]["unreachable"], true);
}

TEST(StatusFormatTest, JsonKeepsNumbersAsNumbers) {
  tandem::v1::ClusterStatus s;
  s.set_can_serve(true);
  s.mutable_router()->set_name("router");
  s.mutable_router()->set_role(tandem::v1::ROLE_ROUTER);
  *s.add_workers() = Decode();
  const nlohmann::ordered_json j = ClusterStatusToJson(s);
  EXPECT_EQ(j["can_serve"], true);
  EXPECT_EQ(j["router"]["role"], "router");
  ASSERT_EQ(j["workers"].size(), 1u);
  EXPECT_EQ(j["workers"][0].dump(),
            R"({"name":"decode-0","role":"decode","address":"127.0.0.1:40001",)"
            R"("kv_endpoint":"127.0.0.1:40002","ready":true,"healthy":true,"unreachable":false,)"
            R"("running_requests":2,)"
            R"("queued_requests":0,"kv_blocks_in_use":5,"kv_blocks_total":2048,"kv_blocks_cached":0,)"
            R"("kv_index_blocks":3,"transfers_in_flight":1,)"
            R"("prefill_tokens_computed_total":0,"kv_bytes_sent_total":0,)"
            R"("kv_bytes_received_total":8589934592,"kv_bytes_by_transport":{},)"
            R"("decode_tokens_total":77,)"
            R"("max_decode_batch_size":2,"preemptions_total":0,"model_fingerprint":"",)"
            R"("kv_layout_id":"","bit_exact_class":"","prompt_tokens_total":0,)"
            R"("prompt_tokens_cached_total":0,"generation_tokens_total":0,)"
            R"("prefix_cache_queried_tokens_total":0,"prefix_cache_hit_tokens_total":0,)"
            R"("engine_steps_total":0,"kv_transfers_sent_total":0,)"
            R"("kv_transfers_received_total":0,"kv_transfer_seconds_sent_total":0.0,)"
            R"("kv_transfer_seconds_received_total":0.0,"step_model":null})");
  // The router's counters under their own names.
  EXPECT_EQ(j["router"]["router_requests_total"], 0);
  EXPECT_FALSE(j["router"].contains("prompt_tokens_total"));
}

TEST(StatusFormatTest, ApiKeyUsageLineAndJson) {
  tandem::v1::ClusterStatus s;
  s.set_can_serve(true);
  EXPECT_EQ(ClusterStatusToJson(s)["api_keys_required"], false);
  EXPECT_EQ(ClusterStatusToJson(s)["api_keys"].dump(), "[]");
  s.set_api_keys_required(true);
  tandem::v1::ApiKeyUsage* u = s.add_api_keys();
  u->set_name("alice");
  u->set_requests(3);
  u->set_refused(1);
  u->set_prompt_tokens(30);
  u->set_generated_tokens(48);
  u->set_in_flight(1);
  u->set_tokens_available(-5);
  u->set_tokens_per_minute(120);
  EXPECT_EQ(FormatApiKeyLine(*u),
            "api_key alice requests=3 refused=1 prompt_tokens=30 generated_tokens=48 "
            "in_flight=1 tokens_available=-5 tokens_per_minute=120 "
            "max_concurrent_requests=unlimited");
  u->set_tokens_per_minute(0);
  u->set_tokens_available(0);
  u->set_max_concurrent_requests(4);
  EXPECT_THAT(FormatApiKeyLine(*u),
              ::testing::EndsWith(" tokens_available=unlimited tokens_per_minute=unlimited "
                                  "max_concurrent_requests=4"));
  u->set_tokens_per_minute(120);
  u->set_tokens_available(-5);
  u->set_max_concurrent_requests(0);
  const nlohmann::ordered_json j = ClusterStatusToJson(s);
  EXPECT_EQ(j["api_keys_required"], true);
  EXPECT_EQ(j["api_keys"].dump(),
            R"([{"name":"alice","requests":3,"refused":1,"prompt_tokens":30,)"
            R"("generated_tokens":48,"in_flight":1,"tokens_available":-5,)"
            R"("tokens_per_minute":120,"max_concurrent_requests":0}])");
}

TEST(StatusFormatTest, ClusterAuthLine) {
  tandem::v1::ClusterStatus s;
  s.set_cluster_auth("hmac-sha256");
  EXPECT_EQ(FormatClusterAuthLine(s), "cluster: authenticated (HMAC-SHA256)");
  EXPECT_EQ(ClusterStatusToJson(s)["cluster_auth"], "hmac-sha256");
  s.set_cluster_auth("open");
  EXPECT_EQ(FormatClusterAuthLine(s),
            "cluster: open (no cluster.secret_file: any host that reaches a worker port can "
            "register or call it)");
  s.clear_cluster_auth();
  EXPECT_EQ(FormatClusterAuthLine(s),
            "cluster: authentication unknown (the router does not report it)");
}

// A step model as a worker reports it (values exact in binary, so the
// JSON below is exact too).
tandem::v1::StepModel StepModel() {
  tandem::v1::StepModel m;
  m.set_samples(57);
  m.set_base_ms(1.25);
  m.set_prefill_ms_per_token(0.0625);
  m.set_prefill_ms_per_kilo_pair(0.015625);
  m.set_decode_ms_per_seq(0.375);
  m.set_decode_ms_per_kilo_context(0.03125);
  m.set_prefill_tokens_per_s(1234.5);
  m.set_decode_step_ms(3.5);
  m.set_mean_abs_error_ms(0.25);
  return m;
}

// Issue #34: the objectives and placement the router reports, in one line
// before the cluster line, and in JSON (null for an objective not set).
TEST(StatusFormatTest, SloLineAndJson) {
  struct Case {
    double ttft_ms, tpot_ms;
    const char* placement;
    const char* line;
    const char* json;  // "slo" and "placement"
  };
  const Case cases[] = {
      {2000, 50, "slo", "slo: ttft 2000 ms, tpot 50 ms; placement: slo",
       R"({"ttft_ms":2000.0,"tpot_ms":50.0}|"slo")"},
      {0, 12.5, "slo", "slo: tpot 12.5 ms; placement: slo",
       R"({"ttft_ms":null,"tpot_ms":12.5}|"slo")"},
      {800, 0, "threshold", "slo: ttft 800 ms; placement: threshold",
       R"({"ttft_ms":800.0,"tpot_ms":null}|"threshold")"},
      {0, 0, "threshold", "slo: none; placement: threshold",
       R"({"ttft_ms":null,"tpot_ms":null}|"threshold")"},
      // A router that does not report them (before issue #34).
      {0, 0, "", "slo: none; placement: unknown (the router does not report it)",
       R"({"ttft_ms":null,"tpot_ms":null}|"")"},
  };
  for (const Case& c : cases) {
    tandem::v1::ClusterStatus s;
    s.mutable_slo()->set_ttft_ms(c.ttft_ms);
    s.mutable_slo()->set_tpot_ms(c.tpot_ms);
    s.set_placement(c.placement);
    EXPECT_EQ(FormatSloLine(s), c.line);
    const nlohmann::ordered_json j = ClusterStatusToJson(s);
    EXPECT_EQ(j["slo"].dump() + "|" + j["placement"].dump(), c.json) << c.line;
  }
}

TEST(StatusFormatTest, StepModelLineAndJson) {
  tandem::v1::StepModel m = StepModel();
  EXPECT_EQ(FormatStepModelLine(m),
            "  step model: 1.25 ms + 0.0625 ms/prefill token + 0.0156 ms/1k prefill pairs + "
            "0.375 ms/decode seq + 0.0312 ms/1k decode context; prefill 1234 tok/s, decode step "
            "3.5 ms, error 0.25 ms, n=57");
  // Measured KV links, by name, each in the unit that keeps it >= 1.
  (*m.mutable_kv_link_bytes_per_s())["prefill-1"] = 850e6;
  (*m.mutable_kv_link_bytes_per_s())["prefill-0"] = 1.25e9;
  (*m.mutable_kv_link_bytes_per_s())["prefill-2"] = 512;
  EXPECT_THAT(FormatStepModelLine(m),
              ::testing::EndsWith(
                  " n=57; kv link prefill-0 1.25 GB/s, prefill-1 850 MB/s, prefill-2 512 B/s"));
  EXPECT_EQ(StepModelToJson(m).dump(),
            R"({"samples":57,"base_ms":1.25,"prefill_ms_per_token":0.0625,)"
            R"("prefill_ms_per_kilo_pair":0.015625,"decode_ms_per_seq":0.375,)"
            R"("decode_ms_per_kilo_context":0.03125,"prefill_tokens_per_s":1234.5,)"
            R"("decode_step_ms":3.5,"mean_abs_error_ms":0.25,)"
            R"("kv_link_bytes_per_s":{"prefill-0":1250000000.0,"prefill-1":850000000.0,)"
            R"("prefill-2":512.0}})");
  // Per worker: the object, or null for one that reports none; the router has none.
  tandem::v1::ClusterStatus s;
  s.mutable_router()->set_role(tandem::v1::ROLE_ROUTER);
  *s.add_workers() = Decode();
  *s.mutable_workers(0)->mutable_step_model() = m;
  s.add_workers()->set_role(tandem::v1::ROLE_PREFILL);
  const nlohmann::ordered_json j = ClusterStatusToJson(s);
  EXPECT_EQ(j["workers"][0]["step_model"], StepModelToJson(m));
  EXPECT_TRUE(j["workers"][1]["step_model"].is_null());
  EXPECT_FALSE(j["router"].contains("step_model"));
}

// The whole text output: the process lines (a step model under the worker
// that reports one), the SLO line, the cluster line, then the API keys.
TEST(StatusFormatTest, TextOutputOrder) {
  tandem::v1::ClusterStatus s;
  s.mutable_router()->set_name("router");
  s.mutable_router()->set_role(tandem::v1::ROLE_ROUTER);
  *s.add_workers() = Decode();
  *s.mutable_workers(0)->mutable_step_model() = StepModel();
  tandem::v1::WorkerStatus* p = s.add_workers();
  p->set_name("prefill-0");
  p->set_role(tandem::v1::ROLE_PREFILL);
  s.mutable_slo()->set_ttft_ms(2000);
  s.set_placement("slo");
  s.set_cluster_auth("open");
  s.add_api_keys()->set_name("alice");
  const std::string text = FormatClusterStatus(s);
  EXPECT_EQ(text, absl::StrCat(FormatStatusLine(s.router()), "\n",                  //
                               FormatStatusLine(s.workers(0)), "\n",                //
                               FormatStepModelLine(s.workers(0).step_model()), "\n",  //
                               FormatStatusLine(s.workers(1)), "\n",                //
                               "slo: ttft 2000 ms; placement: slo\n",               //
                               FormatClusterAuthLine(s), "\n",                      //
                               FormatApiKeyLine(s.api_keys(0)), "\n"));
}

TEST(StatusExitCodeTest, Rules) {
  tandem::v1::ClusterStatus s;
  tandem::v1::WorkerStatus* w = s.add_workers();
  w->set_name("decode-0");
  s.set_can_serve(false);
  EXPECT_EQ(StatusExitCode(s, false), 1);
  EXPECT_EQ(StatusExitCode(s, true), 1);
  s.set_can_serve(true);
  EXPECT_EQ(CheckIdleness(s), Idleness::kIdle);
  EXPECT_EQ(StatusExitCode(s, false), 0);
  EXPECT_EQ(StatusExitCode(s, true), 0);
  // Each of the three counters alone makes the cluster busy.
  for (int field = 0; field < 3; ++field) {
    tandem::v1::WorkerStatus busy;
    if (field == 0) busy.set_kv_blocks_in_use(1);
    if (field == 1) busy.set_transfers_in_flight(1);
    if (field == 2) busy.set_running_requests(1);
    *w = busy;
    EXPECT_EQ(CheckIdleness(s), Idleness::kBusy) << field;
    EXPECT_EQ(StatusExitCode(s, true), 3) << field;
    EXPECT_EQ(StatusExitCode(s, false), 0) << field;
  }
  // Cached (ref 0) blocks do not count as in use.
  w->Clear();
  w->set_kv_blocks_total(10);
  EXPECT_EQ(StatusExitCode(s, true), 0);

  // Issue #32: an unreachable worker is unknown, not idle (exit 4); a busy
  // worker that answered still says busy (3); without --check-idle the
  // cluster serves (0).
  tandem::v1::WorkerStatus* frozen = s.add_workers();
  frozen->set_name("decode-1");
  frozen->set_unreachable(true);
  EXPECT_EQ(CheckIdleness(s), Idleness::kUnknown);
  EXPECT_EQ(StatusExitCode(s, true), 4);
  EXPECT_EQ(StatusExitCode(s, false), 0);
  // The only decode worker frozen: the cluster cannot serve (1), but a
  // drain's question is whether work may be held: still 4 (and 3 below).
  s.set_can_serve(false);
  EXPECT_EQ(StatusExitCode(s, true), 4);
  EXPECT_EQ(StatusExitCode(s, false), 1);
  s.set_can_serve(true);
  w->set_running_requests(1);
  EXPECT_EQ(CheckIdleness(s), Idleness::kBusy);
  EXPECT_EQ(StatusExitCode(s, true), 3);
  // Dropped from the registry: no longer listed, no longer counted.
  w->set_running_requests(0);
  s.mutable_workers()->RemoveLast();
  EXPECT_EQ(StatusExitCode(s, true), 0);
}

TEST(StatusArgsTest, ParsesAndRejects) {
  absl::StatusOr<StatusOptions> o = ParseStatusArgs({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->router, "127.0.0.1:50051");
  EXPECT_FALSE(o->check_idle);
  EXPECT_FALSE(o->json);
  o = ParseStatusArgs({"--router=h:1", "--check-idle", "--json", "--timeout-ms", "100"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->router, "h:1");
  EXPECT_TRUE(o->check_idle);
  EXPECT_TRUE(o->json);
  EXPECT_EQ(o->timeout_ms, 100);
  unsetenv("TANDEM_API_KEY");
  EXPECT_EQ(o->api_key, "");
  o = ParseStatusArgs({"--api-key", "sk-1"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->api_key, "sk-1");
  // $TANDEM_API_KEY when the flag is absent; the flag wins.
  setenv("TANDEM_API_KEY", "sk-env", 1);
  EXPECT_EQ(ParseStatusArgs({})->api_key, "sk-env");
  EXPECT_EQ(ParseStatusArgs({"--api-key=sk-1"})->api_key, "sk-1");
  unsetenv("TANDEM_API_KEY");
  EXPECT_EQ(ParseStatusArgs({"extra"}).status().message(), "unexpected argument 'extra'");
  EXPECT_EQ(ParseStatusArgs({"--api-key", ""}).status().message(), "--api-key: must not be empty");
  EXPECT_EQ(ParseStatusArgs({"--timeout-ms", "0"}).status().message(),
            "--timeout-ms: must be > 0, got 0");
}

}  // namespace
}  // namespace tandem::cli
