// Tests for common/cluster_config: the shipped local config, defaults, every
// class of error (unknown keys, types, ranges, host:port, YAML syntax) and
// the model path resolution order.
#include "common/cluster_config.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/scheduler/prefill_placement.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// A minimal valid file: only the required decode worker.
constexpr char kMinimal[] = "decode_workers:\n  - name: decode-0\n";

// Parses `text` and returns the error message ("" when it parsed).
std::string ErrorOf(const std::string& text) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(text);
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  return std::string(c.status().message());
}

// ---- Colocated mode (issue #17) ----------------------------------------------

TEST(ColocatedConfigTest, UnboundedParsesToTheLargestThreshold) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(
      std::string(kMinimal) +
      "prefill_workers: []\nconditional: {max_local_prefill_tokens: unbounded}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->prefill_workers.empty());
  EXPECT_EQ(c->conditional.max_local_prefill_tokens, 2147483647);  // INT32_MAX
  EXPECT_EQ(c->conditional.max_local_prefill_tokens, kUnboundedLocalPrefillTokens);
  // The largest integer is accepted as itself.
  c = ParseClusterConfig(std::string(kMinimal) +
                         "conditional: {max_local_prefill_tokens: 2147483647}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->conditional.max_local_prefill_tokens, 2147483647);
}

// The scheduler's rule (L - hit > threshold -> remote) with the stored value
// never picks remote, even for the longest int32 prompt with no cached
// prefix (L - hit = INT32_MAX, no overflow); an explicit REMOTE still does.
TEST(ColocatedConfigTest, UnboundedNeverChoosesRemote) {
  using scheduler::PrefillRemotely;
  using scheduler::RouteChoice;
  EXPECT_FALSE(PrefillRemotely(RouteChoice::kAuto, INT32_MAX, 0, kUnboundedLocalPrefillTokens));
  EXPECT_FALSE(PrefillRemotely(RouteChoice::kAuto, 33, 0, kUnboundedLocalPrefillTokens));
  EXPECT_TRUE(PrefillRemotely(RouteChoice::kRemote, 33, 0, kUnboundedLocalPrefillTokens));
  EXPECT_TRUE(PrefillRemotely(RouteChoice::kAuto, 33, 0, 32));  // a finite threshold does
}

TEST(ColocatedConfigTest, BadThresholdsAreRefusedNamingTheField) {
  const std::string field = "conditional.max_local_prefill_tokens: ";
  const std::string what = "expected an integer >= 0 or unbounded, got ";
  // Column 41: the value after the 40 characters "conditional: {max_local_prefill_tokens: ".
  EXPECT_THAT(
      ErrorOf(std::string(kMinimal) + "conditional: {max_local_prefill_tokens: infinite}\n"),
      HasSubstr(field + what + "'infinite' (line 3, column 41)"));
  EXPECT_THAT(
      ErrorOf(std::string(kMinimal) + "conditional: {max_local_prefill_tokens: Unbounded}\n"),
      HasSubstr(field + what + "'Unbounded'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "conditional: {max_local_prefill_tokens: 3.5}\n"),
              HasSubstr(field + what + "'3.5'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "conditional: {max_local_prefill_tokens: -5}\n"),
              HasSubstr(field + what + "'-5'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "conditional: {max_local_prefill_tokens: [1]}\n"),
              HasSubstr(field + what + "'<non-scalar>'"));
  EXPECT_THAT(
      ErrorOf(std::string(kMinimal) + "conditional: {max_local_prefill_tokens: 2147483648}\n"),
      HasSubstr(field + what + "'2147483648' (the largest integer is 2147483647)"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "conditional:\n  max_local_prefill_tokens:\n"),
              HasSubstr(field + "has no value (remove the key to use the default)"));
}

TEST(ColocatedConfigTest, ParsesTheShippedColocatedConfig) {
  absl::StatusOr<ClusterConfig> c =
      LoadClusterConfig(std::string(TANDEM_SOURCE_DIR) + "/deploy/local/colocated.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->prefill_workers.empty());
  ASSERT_EQ(c->decode_workers.size(), 2u);
  EXPECT_EQ(c->decode_workers[0].name, "decode-0");
  EXPECT_EQ(c->decode_workers[1].name, "decode-1");
  EXPECT_EQ(c->conditional.max_local_prefill_tokens, kUnboundedLocalPrefillTokens);
  EXPECT_EQ(c->router.listen.ToString(), "127.0.0.1:50051");
  EXPECT_EQ(PrefillPlacementSummary(*c),
            "prefill placement: colocated (no prefill workers, "
            "conditional.max_local_prefill_tokens unbounded: every prompt is prefilled by its "
            "decode worker)");
}

TEST(ColocatedConfigTest, PlacementSummaryOfEachCombination) {
  const std::string two_prefill =
      "prefill_workers:\n  - name: p0\n    listen: 127.0.0.1:0\n"
      "  - name: p1\n    listen: 127.0.0.1:0\n";
  absl::StatusOr<ClusterConfig> c =
      ParseClusterConfig(std::string(kMinimal) + "conditional: {max_local_prefill_tokens: 32}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(PrefillPlacementSummary(*c),
            "prefill placement: colocated while no prefill worker registers (none in the config; "
            "conditional.max_local_prefill_tokens 32 applies to any that does)");
  c = ParseClusterConfig(std::string(kMinimal) + two_prefill);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(PrefillPlacementSummary(*c),
            "prefill placement: conditional (local when prompt tokens - cached prefix <= 32, "
            "else a prefill worker)");
  // Unbounded with prefill workers is allowed; the router warns that they idle.
  c = ParseClusterConfig(std::string(kMinimal) + two_prefill +
                         "conditional: {max_local_prefill_tokens: unbounded}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(PrefillPlacementSummary(*c),
            "warning: conditional.max_local_prefill_tokens is unbounded, so the 2 prefill "
            "workers get only requests with route_override REMOTE");
}

// ---- SLOs and conditional.placement (issue #34) ------------------------------

// Good values of `slo`: each key optional, integers and decimals, and the
// placement each resolves to when conditional.placement is not given.
TEST(SloConfigTest, GoodValuesAndTheDefaultPlacement) {
  struct Case {
    const char* yaml;  // appended to kMinimal
    std::optional<double> ttft_ms;
    std::optional<double> tpot_ms;
    PlacementMode placement;
  };
  const Case cases[] = {
      {"", std::nullopt, std::nullopt, PlacementMode::kThreshold},
      {"slo: {}\n", std::nullopt, std::nullopt, PlacementMode::kThreshold},
      {"slo: {ttft_ms: 2000, tpot_ms: 50}\n", 2000.0, 50.0, PlacementMode::kSlo},
      {"slo: {ttft_ms: 1500.5}\n", 1500.5, std::nullopt, PlacementMode::kSlo},
      {"slo:\n  tpot_ms: 0.25\n", std::nullopt, 0.25, PlacementMode::kSlo},
      {"slo: {tpot_ms: \"40\"}\n", std::nullopt, 40.0, PlacementMode::kSlo},
      {"slo: {ttft_ms: 1e3}\n", 1000.0, std::nullopt, PlacementMode::kSlo},
      // Given explicitly, either way.
      {"slo: {ttft_ms: 2000}\nconditional: {placement: threshold}\n", 2000.0, std::nullopt,
       PlacementMode::kThreshold},
      {"conditional: {placement: slo}\nslo: {tpot_ms: 50}\n", std::nullopt, 50.0,
       PlacementMode::kSlo},
      {"conditional: {placement: threshold}\n", std::nullopt, std::nullopt,
       PlacementMode::kThreshold},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ClusterConfig> config = ParseClusterConfig(std::string(kMinimal) + c.yaml);
    ASSERT_TRUE(config.ok()) << c.yaml << ": " << config.status();
    EXPECT_EQ(config->slo.ttft_ms, c.ttft_ms) << c.yaml;
    EXPECT_EQ(config->slo.tpot_ms, c.tpot_ms) << c.yaml;
    EXPECT_EQ(config->conditional.placement, c.placement) << c.yaml;
  }
  EXPECT_STREQ(PlacementModeName(PlacementMode::kThreshold), "threshold");
  EXPECT_STREQ(PlacementModeName(PlacementMode::kSlo), "slo");
}

// Each bad `slo` / `conditional.placement` value is refused naming its key.
TEST(SloConfigTest, BadValuesAreRefusedNamingTheKey) {
  struct Case {
    const char* yaml;      // appended to kMinimal
    const char* expected;  // a substring of the message
  };
  const Case cases[] = {
      {"slo: {tpot_ms: -5}\n", "slo.tpot_ms: expected a number > 0, got -5 (line 3, column 16)"},
      {"slo: {ttft_ms: 0}\n", "slo.ttft_ms: expected a number > 0, got 0"},
      {"slo: {ttft_ms: 0.0}\n", "slo.ttft_ms: expected a number > 0, got 0.0"},
      {"slo: {ttft_ms: -0.5}\n", "slo.ttft_ms: expected a number > 0, got -0.5"},
      {"slo: {ttft_ms: fast}\n", "slo.ttft_ms: expected a number > 0, got 'fast'"},
      {"slo: {tpot_ms: inf}\n", "slo.tpot_ms: expected a number > 0, got 'inf'"},
      {"slo: {tpot_ms: .inf}\n", "slo.tpot_ms: expected a number > 0, got '.inf'"},
      {"slo: {tpot_ms: nan}\n", "slo.tpot_ms: expected a number > 0, got 'nan'"},
      {"slo: {tpot_ms: [50]}\n", "slo.tpot_ms: expected a number > 0, got '<non-scalar>'"},
      {"slo:\n  ttft_ms:\n", "slo.ttft_ms: has no value (remove the key to use the default)"},
      {"slo: {ttft: 2000}\n",
       "unknown key 'slo.ttft' (line 3, column 7); known keys: ttft_ms, "
       "tpot_ms"},
      {"slo: 2000\n", "slo: expected a mapping"},
      {"slo: [2000, 50]\n", "slo: expected a mapping"},
      {"slo:\n", "slo: expected a mapping"},
      {"conditional: {placement: auto}\n",
       "conditional.placement: must be one of threshold, slo; got 'auto' (line 3, column 26)"},
      {"conditional: {placement: SLO}\n",
       "conditional.placement: must be one of threshold, slo; got 'SLO'"},
      {"conditional:\n  placement:\n", "conditional.placement: has no value"},
      {"conditional: {placement: slo}\n",
       "conditional.placement: slo needs slo.ttft_ms or slo.tpot_ms (line 3, column 26)"},
      {"conditional: {placement: slo}\nslo: {}\n",
       "conditional.placement: slo needs slo.ttft_ms or slo.tpot_ms"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ErrorOf(std::string(kMinimal) + c.yaml), HasSubstr(c.expected)) << c.yaml;
  }
}

// The router's start-up line under placement slo names the objectives
// set; under threshold it is the line before issue #34.
TEST(SloConfigTest, PlacementSummaryUnderSlo) {
  const std::string prefill = "prefill_workers:\n  - name: p0\n    listen: 127.0.0.1:0\n";
  struct Case {
    std::string yaml;  // appended to kMinimal
    const char* summary;
  };
  const Case cases[] = {
      {prefill + "slo: {ttft_ms: 2000, tpot_ms: 50}\n",
       "prefill placement: conditional (local when prompt tokens - cached prefix <= 32, else "
       "local or a prefill worker by predicted SLO miss: ttft 2000 ms, tpot 50 ms)"},
      {prefill + "slo: {tpot_ms: 12.5}\nconditional: {max_local_prefill_tokens: 0}\n",
       "prefill placement: conditional (local when prompt tokens - cached prefix <= 0, else "
       "local or a prefill worker by predicted SLO miss: tpot 12.5 ms)"},
      {prefill + "slo: {ttft_ms: 2000}\nconditional: {placement: threshold}\n",
       "prefill placement: conditional (local when prompt tokens - cached prefix <= 32, else a "
       "prefill worker)"},
      {"slo: {ttft_ms: 800}\n",
       "prefill placement: colocated while no prefill worker registers (none in the config; "
       "conditional.max_local_prefill_tokens 32 and placement by predicted SLO miss (ttft 800 "
       "ms) apply to any that does)"},
      // Unbounded: colocated whatever the placement (the threshold is a floor).
      {"prefill_workers: []\nslo: {ttft_ms: 2000}\n"
       "conditional: {max_local_prefill_tokens: unbounded}\n",
       "prefill placement: colocated (no prefill workers, conditional.max_local_prefill_tokens "
       "unbounded: every prompt is prefilled by its decode worker)"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ClusterConfig> config = ParseClusterConfig(std::string(kMinimal) + c.yaml);
    ASSERT_TRUE(config.ok()) << c.yaml << ": " << config.status();
    EXPECT_EQ(PrefillPlacementSummary(*config), c.summary) << c.yaml;
  }
}

// A `conditional:` section without on_prefill_failure takes the documented
// default (retry), as a file without the section does; it read as `fail`.
TEST(ClusterConfigTest, ConditionalSectionWithoutOnPrefillFailureKeepsRetry) {
  absl::StatusOr<ClusterConfig> c =
      ParseClusterConfig(std::string(kMinimal) + "conditional: {max_local_prefill_tokens: 8}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->conditional.on_prefill_failure, OnPrefillFailure::kRetry);
}

TEST(ClusterConfigTest, ParsesLocalConfig) {
  absl::StatusOr<ClusterConfig> c =
      LoadClusterConfig(std::string(TANDEM_SOURCE_DIR) + "/deploy/local/cluster.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model, "");
  EXPECT_EQ(c->router.name, "router");
  EXPECT_EQ(c->router.listen.ToString(), "127.0.0.1:50051");
  ASSERT_EQ(c->prefill_workers.size(), 1u);
  EXPECT_EQ(c->prefill_workers[0].name, "prefill-0");
  EXPECT_EQ(c->prefill_workers[0].listen.ToString(), "127.0.0.1:0");
  ASSERT_EQ(c->decode_workers.size(), 1u);
  EXPECT_EQ(c->decode_workers[0].name, "decode-0");
  EXPECT_EQ(c->decode_workers[0].listen.ToString(), "127.0.0.1:0");
  EXPECT_EQ(c->decode_workers[0].kv_listen.ToString(), "127.0.0.1:0");
  ASSERT_TRUE(c->prefill_workers[0].metrics_listen.has_value());
  EXPECT_EQ(c->prefill_workers[0].metrics_listen->ToString(), "127.0.0.1:9101");
  ASSERT_TRUE(c->decode_workers[0].metrics_listen.has_value());
  EXPECT_EQ(c->decode_workers[0].metrics_listen->ToString(), "127.0.0.1:9102");
  ASSERT_TRUE(c->router.http_listen.has_value());
  EXPECT_EQ(c->router.http_listen->ToString(), "127.0.0.1:8000");
  EXPECT_EQ(c->engine.block_size, 16);
  EXPECT_EQ(c->conditional.max_local_prefill_tokens, 32);
  EXPECT_EQ(c->conditional.on_prefill_failure, OnPrefillFailure::kRetry);
  EXPECT_EQ(c->kv.transfer_timeout_ms, 5000);
  EXPECT_EQ(c->kv.handshake_timeout_ms, 5000);
  EXPECT_EQ(c->router.policy, RouterPolicy::kKvAware);
  EXPECT_EQ(c->router.kv_aware.free_blocks_weight, 0.25);
  EXPECT_EQ(c->FindWorker("decode-0"), &c->decode_workers[0]);
  EXPECT_EQ(c->FindWorker("prefill-0"), &c->prefill_workers[0]);
  EXPECT_EQ(c->FindWorker("router"), nullptr);
}

TEST(ClusterConfigTest, MinimalFileTakesHeaderDefaults) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(kMinimal);
  ASSERT_TRUE(c.ok()) << c.status();
  // Defaults as documented in common/cluster_config.h.
  EXPECT_EQ(c->router.name, "router");
  EXPECT_EQ(c->router.listen.ToString(), "127.0.0.1:50051");
  EXPECT_EQ(c->router.poll_interval_ms, 500);
  EXPECT_EQ(c->router.unhealthy_after_missed_polls, 3);
  EXPECT_EQ(c->router.rpc_timeout_ms, 2000);
  EXPECT_TRUE(c->prefill_workers.empty());
  EXPECT_EQ(c->decode_workers[0].listen.ToString(), "127.0.0.1:0");
  EXPECT_EQ(c->engine.block_size, 16);
  EXPECT_EQ(c->engine.num_kv_blocks, 2048);
  EXPECT_EQ(c->engine.max_num_seqs, 64);
  EXPECT_EQ(c->engine.threads, 1);
  EXPECT_EQ(c->conditional.max_local_prefill_tokens, 32);
  // The same default as every example config (issue #32).
  EXPECT_EQ(c->conditional.on_prefill_failure, OnPrefillFailure::kRetry);
  EXPECT_EQ(c->kv.transfer_timeout_ms, 5000);
  EXPECT_EQ(c->kv.send_buffer_bytes, 268435456u);
  EXPECT_EQ(c->shutdown_grace_s, 5);
}

TEST(ClusterConfigTest, ReadsEveryField) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(R"(
model: /m/x.gguf
router: {name: r, listen: "[::1]:7000", poll_interval_ms: 50,
         unhealthy_after_missed_polls: 2, rpc_timeout_ms: 300}
prefill_workers: [{name: p0, listen: "10.0.0.1:7001"}, {name: p1}]
decode_workers: [{name: d0, listen: "h:7002", kv_listen: "h:7003"}]
engine: {block_size: 32, num_kv_blocks: 10, max_num_seqs: 4, threads: 2}
conditional: {max_local_prefill_tokens: 0, on_prefill_failure: retry}
kv: {transfer_timeout_ms: 7, handshake_timeout_ms: 8, send_buffer_bytes: 5000000000}
shutdown_grace_s: 0
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model, "/m/x.gguf");
  EXPECT_EQ(c->router.name, "r");
  EXPECT_EQ(c->router.listen.host, "::1");
  EXPECT_EQ(c->router.listen.ToString(), "[::1]:7000");
  EXPECT_EQ(c->router.poll_interval_ms, 50);
  EXPECT_EQ(c->router.unhealthy_after_missed_polls, 2);
  EXPECT_EQ(c->router.rpc_timeout_ms, 300);
  ASSERT_EQ(c->prefill_workers.size(), 2u);
  EXPECT_EQ(c->prefill_workers[0].listen.ToString(), "10.0.0.1:7001");
  EXPECT_EQ(c->prefill_workers[1].name, "p1");
  EXPECT_EQ(c->decode_workers[0].kv_listen.ToString(), "h:7003");
  EXPECT_EQ(c->engine.block_size, 32);
  EXPECT_EQ(c->engine.num_kv_blocks, 10);
  EXPECT_EQ(c->engine.max_num_seqs, 4);
  EXPECT_EQ(c->engine.threads, 2);
  EXPECT_EQ(c->conditional.max_local_prefill_tokens, 0);
  EXPECT_EQ(c->conditional.on_prefill_failure, OnPrefillFailure::kRetry);
  EXPECT_EQ(c->kv.transfer_timeout_ms, 7);
  EXPECT_EQ(c->kv.handshake_timeout_ms, 8);
  EXPECT_EQ(c->kv.send_buffer_bytes, 5000000000u);  // above 2^32: read as 64 bits
  EXPECT_EQ(c->shutdown_grace_s, 0);
  absl::StatusOr<ClusterConfig> local =
      ParseClusterConfig(std::string(kMinimal) + "conditional: {on_prefill_failure: local}\n");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->conditional.on_prefill_failure, OnPrefillFailure::kLocal);
}

TEST(ClusterConfigTest, EngineBatchingAndIsaKeys) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(
      "decode_workers: [{name: d, listen: '127.0.0.1:0', kv_listen: '127.0.0.1:0'}]\n"
      "engine: {max_num_batched_tokens: 64, prefill_chunk_tokens: 7,\n"
      "         enable_prefix_caching: false, kernel_isa: generic}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->engine.max_num_batched_tokens, 64);
  EXPECT_EQ(c->engine.prefill_chunk_tokens, 7);
  EXPECT_FALSE(c->engine.enable_prefix_caching);
  EXPECT_EQ(c->engine.kernel_isa, "generic");
  absl::StatusOr<ClusterConfig> bad = ParseClusterConfig(
      "decode_workers: [{name: d, listen: '127.0.0.1:0', kv_listen: '127.0.0.1:0'}]\n"
      "engine: {kernel_isa: sse9}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("engine.kernel_isa"));
  EXPECT_EQ(c->engine.q8_matmul, model::Q8MatMul::kExact);  // the default
  absl::StatusOr<ClusterConfig> int8 = ParseClusterConfig(
      "decode_workers: [{name: d, listen: '127.0.0.1:0', kv_listen: '127.0.0.1:0'}]\n"
      "engine: {q8_matmul: int8}\n");
  ASSERT_TRUE(int8.ok()) << int8.status();
  EXPECT_EQ(int8->engine.q8_matmul, model::Q8MatMul::kInt8);
  absl::StatusOr<ClusterConfig> exact = ParseClusterConfig(
      "decode_workers: [{name: d, listen: '127.0.0.1:0', kv_listen: '127.0.0.1:0'}]\n"
      "engine: {q8_matmul: exact}\n");
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->engine.q8_matmul, model::Q8MatMul::kExact);
  absl::StatusOr<ClusterConfig> bad_q8 = ParseClusterConfig(
      "decode_workers: [{name: d, listen: '127.0.0.1:0', kv_listen: '127.0.0.1:0'}]\n"
      "engine: {q8_matmul: int4}\n");
  ASSERT_FALSE(bad_q8.ok());
  EXPECT_THAT(bad_q8.status().message(), HasSubstr("engine.q8_matmul"));
  EXPECT_THAT(bad_q8.status().message(), HasSubstr("expected exact or int8, got 'int4'"));
  absl::StatusOr<ClusterConfig> bad_bool = ParseClusterConfig(
      "decode_workers: [{name: d, listen: '127.0.0.1:0', kv_listen: '127.0.0.1:0'}]\n"
      "engine: {enable_prefix_caching: maybe}\n");
  ASSERT_FALSE(bad_bool.ok());
  EXPECT_THAT(bad_bool.status().message(), HasSubstr("engine.enable_prefix_caching"));
}

TEST(ClusterConfigTest, ChatTemplateOverride) {
  absl::StatusOr<ClusterConfig> none = ParseClusterConfig(kMinimal);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->chat_template, "");  // detect from the model
  for (absl::string_view name : kChatTemplateNames) {
    absl::StatusOr<ClusterConfig> c =
        ParseClusterConfig(absl::StrCat(kMinimal, "chat_template: ", name, "\n"));
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_EQ(c->chat_template, name);
  }
  const std::string error = ErrorOf(std::string(kMinimal) + "chat_template: chatml2\n");
  EXPECT_THAT(error, HasSubstr("chat_template: unknown chat format 'chatml2'"));
  EXPECT_THAT(error, HasSubstr("mistral-v7"));  // the known names are listed
  EXPECT_THAT(error, HasSubstr("line 3"));
}

TEST(ClusterConfigTest, ApiKeysFile) {
  absl::StatusOr<ClusterConfig> none = ParseClusterConfig(kMinimal);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->router.api_keys_file, "");  // open: no key required
  absl::StatusOr<ClusterConfig> c =
      ParseClusterConfig(std::string(kMinimal) + "router:\n  api_keys_file: secrets/keys.yaml\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->router.api_keys_file, "secrets/keys.yaml");  // as written
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router:\n  api_keys_file: \"\"\n"),
              HasSubstr("router.api_keys_file: must not be empty"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router:\n  api_keys_file:\n"),
              HasSubstr("router.api_keys_file: has no value"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router:\n  api_keys_file: [a]\n"),
              HasSubstr("router.api_keys_file: expected a string"));
}

TEST(ClusterConfigTest, HttpKeys) {
  absl::StatusOr<ClusterConfig> none = ParseClusterConfig(kMinimal);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->router.http_listen.has_value());     // gRPC only
  EXPECT_FALSE(none->router.metrics_listen.has_value());  // no metrics listener
  EXPECT_EQ(none->router.served_model_name, "");          // the model file's stem
  EXPECT_EQ(none->router.http_max_streams, 1024);
  EXPECT_EQ(none->router.http_max_body_bytes, 8 << 20);
  EXPECT_EQ(none->router.http_read_timeout_ms, 30000);
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(
      std::string(kMinimal) +
      "router:\n  http_listen: 0.0.0.0:0\n  served_model_name: my-model\n"
      "  http_max_streams: 7\n  http_max_body_bytes: 4096\n  http_read_timeout_ms: 250\n"
      "  metrics_listen: 0.0.0.0:9100\n");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->router.http_listen.has_value());
  EXPECT_EQ(c->router.http_listen->ToString(), "0.0.0.0:0");
  EXPECT_EQ(c->router.served_model_name, "my-model");
  EXPECT_EQ(c->router.http_max_streams, 7);
  EXPECT_EQ(c->router.http_max_body_bytes, 4096);
  EXPECT_EQ(c->router.http_read_timeout_ms, 250);
  ASSERT_TRUE(c->router.metrics_listen.has_value());
  EXPECT_EQ(c->router.metrics_listen->ToString(), "0.0.0.0:9100");
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router:\n  metrics_listen: 9100\n"),
              HasSubstr("router.metrics_listen"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router:\n  http_read_timeout_ms: 0\n"),
              HasSubstr("router.http_read_timeout_ms"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router:\n  http_read_timeout_ms: 1.5\n"),
              HasSubstr("router.http_read_timeout_ms"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router:\n  served_model_name: \"\"\n"),
              HasSubstr("router.served_model_name: must not be empty"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router:\n  http_max_body_bytes: 100\n"),
              HasSubstr("router.http_max_body_bytes"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router:\n  http_max_streams: 0\n"),
              HasSubstr("router.http_max_streams"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router:\n  http_listen: nowhere\n"),
              HasSubstr("router.http_listen"));
}

TEST(ClusterConfigTest, UnknownTopLevelKeyIsNamed) {
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "shutdown_grace: 3\n"),
              HasSubstr("unknown key 'shutdown_grace'"));
}

TEST(ClusterConfigTest, UnknownNestedKeyIsNamedWithPath) {
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv:\n  foo: 1\n"),
              HasSubstr("unknown key 'kv.foo'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "engine: {block_size: 16, blocksize: 8}\n"),
              HasSubstr("unknown key 'engine.blocksize'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "prefill_workers: [{name: p, kv_port: 3}]\n"),
              HasSubstr("unknown key 'prefill_workers[0].kv_port'"));
  EXPECT_THAT(ErrorOf("decode_workers: [{name: a}, {name: b, port: 3}]\n"),
              HasSubstr("unknown key 'decode_workers[1].port'"));
}

TEST(ClusterConfigTest, UnknownKeyReportsLine) {
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv:\n  foo: 1\n"), HasSubstr("line 4"));
}

TEST(ClusterConfigTest, DuplicateKeyIsAnError) {
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "engine:\n  threads: 1\n  threads: 2\n"),
              HasSubstr("duplicate key 'engine.threads'"));
}

TEST(ClusterConfigTest, BadTypesNameTheField) {
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "engine: {block_size: abc}\n"),
              HasSubstr("engine.block_size: expected an integer, got 'abc'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "engine: {block_size: 1.5}\n"),
              HasSubstr("engine.block_size: expected an integer"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "engine: [1, 2]\n"),
              HasSubstr("engine: expected a mapping"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router: {name: [a, b]}\n"),
              HasSubstr("router.name: expected a string"));
  EXPECT_THAT(ErrorOf("decode_workers: {name: d}\n"), HasSubstr("decode_workers: expected a list"));
  EXPECT_THAT(ErrorOf("- a\n- b\n"), HasSubstr("cluster config: expected a mapping"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv: {transfer_timeout_ms: 99999999999}\n"),
              HasSubstr("kv.transfer_timeout_ms: must be in [1, 2147483647], got 99999999999"));
}

TEST(ClusterConfigTest, RangesAreChecked) {
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv: {send_buffer_bytes: 1048575}\n"),
              HasSubstr("kv.send_buffer_bytes: must be in [1048576, 1099511627776], got 1048575"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv: {send_buffer_bytes: 1099511627777}\n"),
              HasSubstr("kv.send_buffer_bytes: must be in [1048576, 1099511627776]"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv: {send_buffer_bytes: lots}\n"),
              HasSubstr("kv.send_buffer_bytes: expected an integer, got 'lots'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "engine: {block_size: 0}\n"),
              HasSubstr("engine.block_size: must be in [1, 2147483647], got 0"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "engine: {num_kv_blocks: -1}\n"),
              HasSubstr("engine.num_kv_blocks: must be in [1, 2147483647], got -1"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "conditional: {max_local_prefill_tokens: -1}\n"),
              HasSubstr("conditional.max_local_prefill_tokens: expected an integer >= 0 or "
                        "unbounded, got '-1'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "shutdown_grace_s: -2\n"),
              HasSubstr("shutdown_grace_s: must be in [0, 2147483647], got -2"));
  // The engine's thread pool takes 1 to 256 threads (LlamaModel::kMaxThreads).
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "engine: {threads: 257}\n"),
              HasSubstr("engine.threads: must be in [1, 256], got 257"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "conditional: {on_prefill_failure: panic}\n"),
              HasSubstr("conditional.on_prefill_failure: must be one of fail, retry, local; got "
                        "'panic'"));
  // A key with nothing after it is refused, not read as "use the default".
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "conditional:\n  on_prefill_failure:\n"),
              HasSubstr("conditional.on_prefill_failure: has no value (remove the key to use "
                        "the default)"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router:\n  name: r\n  max_inflight:\n"),
              HasSubstr("router.max_inflight: has no value"));
}

// router.policy and router.kv_aware (router/routing_policy.h): defaults,
// every key read, bad values refused naming the key.
TEST(ClusterConfigTest, RoutingPolicyAndWeights) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(kMinimal);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->router.policy, RouterPolicy::kKvAware);
  EXPECT_EQ(c->router.kv_aware.prefix_weight, 1.0);
  EXPECT_EQ(c->router.kv_aware.free_blocks_weight, 0.25);
  EXPECT_EQ(c->router.kv_aware.load_weight, 1.0);
  EXPECT_EQ(c->router.kv_aware.prefill_queue_weight, 1.0);

  c = ParseClusterConfig(std::string(kMinimal) + R"(router:
  policy: kv_aware
  kv_aware: {prefix_weight: 2.5, free_blocks_weight: 0, load_weight: 0.125,
             prefill_queue_weight: 3}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->router.policy, RouterPolicy::kKvAware);
  EXPECT_EQ(c->router.kv_aware.prefix_weight, 2.5);
  EXPECT_EQ(c->router.kv_aware.free_blocks_weight, 0.0);
  EXPECT_EQ(c->router.kv_aware.load_weight, 0.125);
  EXPECT_EQ(c->router.kv_aware.prefill_queue_weight, 3.0);
  // Weights without the policy key: kv_aware is the default.
  c = ParseClusterConfig(std::string(kMinimal) + "router: {kv_aware: {load_weight: 2}}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->router.kv_aware.load_weight, 2.0);
  EXPECT_EQ(c->router.kv_aware.prefix_weight, 1.0);

  for (const auto& [text, policy] :
       {std::pair<const char*, RouterPolicy>{"least_loaded", RouterPolicy::kLeastLoaded},
        {"round_robin", RouterPolicy::kRoundRobin}}) {
    c = ParseClusterConfig(std::string(kMinimal) + "router: {policy: " + text + "}\n");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->router.policy, policy);
    EXPECT_STREQ(RouterPolicyName(policy), text);
  }
  EXPECT_STREQ(RouterPolicyName(RouterPolicy::kKvAware), "kv_aware");

  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router: {policy: random}\n"),
              HasSubstr("router.policy: must be one of kv_aware, least_loaded, round_robin; "
                        "got 'random'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router:\n  policy:\n"),
              HasSubstr("router.policy: has no value"));
  // Weights that would be ignored are refused.
  EXPECT_THAT(ErrorOf(std::string(kMinimal) +
                      "router: {policy: round_robin, kv_aware: {load_weight: 1}}\n"),
              HasSubstr("router.kv_aware: weights of router.policy kv_aware, but router.policy "
                        "is round_robin"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router: {kv_aware: {load: 1}}\n"),
              HasSubstr("unknown key 'router.kv_aware.load'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router: {kv_aware: {prefix_weight: -0.5}}\n"),
              HasSubstr("router.kv_aware.prefix_weight: must be >= 0, got -0.5"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router: {kv_aware: {free_blocks_weight: x}}\n"),
              HasSubstr("router.kv_aware.free_blocks_weight: expected a number, got 'x'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router: {kv_aware: {load_weight: .nan}}\n"),
              HasSubstr("router.kv_aware.load_weight: expected a number, got '.nan'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router: {kv_aware: {prefill_queue_weight: inf}}\n"),
              HasSubstr("router.kv_aware.prefill_queue_weight: expected a number, got 'inf'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router: {kv_aware: {load_weight: }}\n"),
              HasSubstr("router.kv_aware.load_weight: has no value"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router: {kv_aware: [1]}\n"),
              HasSubstr("router.kv_aware: expected a mapping"));
}

TEST(ClusterConfigTest, CrossFieldChecks) {
  EXPECT_THAT(ErrorOf("router: {name: r}\n"),
              HasSubstr("decode_workers: at least one decode worker is required"));
  EXPECT_THAT(ErrorOf("decode_workers: []\n"),
              HasSubstr("decode_workers: at least one decode worker is required"));
  EXPECT_THAT(ErrorOf("decode_workers: [{name: w}]\nprefill_workers: [{name: w}]\n"),
              HasSubstr("duplicate process name 'w'"));
  EXPECT_THAT(ErrorOf("decode_workers: [{name: router}]\n"),
              HasSubstr("duplicate process name 'router'"));
  EXPECT_THAT(ErrorOf("decode_workers: [{listen: '127.0.0.1:1'}]\n"),
              HasSubstr("decode_workers[0].name: is required"));
  EXPECT_THAT(ErrorOf(""), HasSubstr("cluster config: the file is empty"));
}

TEST(ClusterConfigTest, BadListenAddressNamesTheField) {
  EXPECT_THAT(ErrorOf("decode_workers: [{name: d, kv_listen: 'localhost'}]\n"),
              HasSubstr("decode_workers[0].kv_listen: expected host:port, got 'localhost'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "router: {listen: '127.0.0.1:65536'}\n"),
              HasSubstr("router.listen: expected host:port, got '127.0.0.1:65536'"));
}

TEST(ClusterConfigTest, YamlSyntaxErrorHasLineAndColumn) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig("decode_workers:\n  - name: [d\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("YAML error at line"));
  EXPECT_THAT(c.status().message(), HasSubstr("column"));
}

TEST(ClusterConfigTest, MissingFileIsNotFound) {
  absl::StatusOr<ClusterConfig> c = LoadClusterConfig("/nonexistent/cluster.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/cluster.yaml"));
}

TEST(HostPortTest, ParsesValidForms) {
  struct Case {
    const char* text;
    const char* host;
    int port;
  } cases[] = {{"127.0.0.1:50051", "127.0.0.1", 50051},
               {"localhost:0", "localhost", 0},
               {"0.0.0.0:65535", "0.0.0.0", 65535},
               {"[::1]:80", "::1", 80},
               {"decode-0.tandem.svc:9000", "decode-0.tandem.svc", 9000}};
  for (const Case& c : cases) {
    absl::StatusOr<HostPort> hp = ParseHostPort(c.text, "f");
    ASSERT_TRUE(hp.ok()) << c.text << ": " << hp.status();
    EXPECT_EQ(hp->host, c.host);
    EXPECT_EQ(hp->port, c.port);
    EXPECT_EQ(hp->ToString(), c.text);
  }
}

TEST(HostPortTest, RejectsBadForms) {
  for (const char* text : {"", "127.0.0.1", "127.0.0.1:", ":80", "h:-1", "h:65536", "h:80x",
                           "h: 80", "::1:80", "[::1]80", "[::1", "h:123456"}) {
    absl::StatusOr<HostPort> hp = ParseHostPort(text, "router.listen");
    ASSERT_FALSE(hp.ok()) << text;
    EXPECT_EQ(hp.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(hp.status().message(),
                HasSubstr(std::string("router.listen: expected host:port, got '") + text + "'"));
  }
}

// What a Kubernetes manifest gets wrong: an env var the pod does not
// define ($(POD_IP) passed as is), a URL, a stray character.
TEST(HostPortTest, NamesTheMistakeOfAManifest) {
  struct Case {
    const char* text;
    const char* why;
  } cases[] = {
      {"$(POD_IP):50051", "an unexpanded $(VAR): the pod must define that environment variable"},
      {"http://127.0.0.1:50051", "no scheme such as http://"},
      {"router!:80", "the host is no DNS name or IP address"}};
  for (const Case& c : cases) {
    absl::StatusOr<HostPort> hp = ParseHostPort(c.text, "--router");
    ASSERT_FALSE(hp.ok()) << c.text;
    EXPECT_EQ(hp.status().message(),
              absl::StrCat("--router: expected host:port, got '", c.text, "' (", c.why, ")"));
  }
  absl::StatusOr<Advertise> a = ParseAdvertise("$(POD_IP)", "--advertise");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message(),
            "--advertise: expected host or host:port, got '$(POD_IP)' (an unexpanded $(VAR): the "
            "pod must define that environment variable)");
}

TEST(AdvertiseTest, ParsesHostOrHostPortAndRefusesWildcards) {
  struct Case {
    const char* text;
    const char* host;
    int port;
  } cases[] = {{"10.0.0.7", "10.0.0.7", 0},
               {"10.0.0.7:9000", "10.0.0.7", 9000},
               {"decode-0.tandem.svc", "decode-0.tandem.svc", 0},
               {"[fd00::7]", "fd00::7", 0},
               {"[fd00::7]:81", "fd00::7", 81}};
  for (const Case& c : cases) {
    absl::StatusOr<Advertise> a = ParseAdvertise(c.text, "f");
    ASSERT_TRUE(a.ok()) << c.text << ": " << a.status();
    EXPECT_EQ(a->host, c.host);
    EXPECT_EQ(a->port, c.port);
  }
  for (const char* text : {"", "h:", "h:70000", "::1", "[::1"}) {
    absl::StatusOr<Advertise> a = ParseAdvertise(text, "router.advertise");
    ASSERT_FALSE(a.ok()) << text;
    EXPECT_EQ(a.status().message(),
              std::string("router.advertise: expected host or host:port, got '") + text + "'");
  }
  for (const char* text : {"0.0.0.0", "0.0.0.0:80", "[::]", "[::]:80"}) {
    absl::StatusOr<Advertise> a = ParseAdvertise(text, "--advertise");
    ASSERT_FALSE(a.ok()) << text;
    EXPECT_EQ(a.status().message(), std::string("--advertise: '") + text +
                                        "' is a wildcard address; give one other hosts can dial");
  }
}

TEST(AdvertiseTest, AdvertisedAddressTakesTheBoundPortUnlessGiven) {
  const HostPort loopback{"127.0.0.1", 0};
  const HostPort wildcard{"0.0.0.0", 0};
  EXPECT_EQ(AdvertisedAddress(loopback, 4242, {}, "k.listen", "k.advertise")->ToString(),
            "127.0.0.1:4242");
  EXPECT_EQ(
      AdvertisedAddress(wildcard, 4242, {"10.1.2.3", 0}, "k.listen", "k.advertise")->ToString(),
      "10.1.2.3:4242");
  EXPECT_EQ(
      AdvertisedAddress(wildcard, 4242, {"10.1.2.3", 30000}, "k.listen", "k.advertise")->ToString(),
      "10.1.2.3:30000");
  absl::StatusOr<HostPort> refused = AdvertisedAddress(
      wildcard, 4242, {}, "decode_workers[d].kv_listen", "decode_workers[d].kv_advertise");
  EXPECT_EQ(refused.status().message(),
            "decode_workers[d].kv_listen: binds the wildcard address 0.0.0.0, which other hosts "
            "cannot dial; set decode_workers[d].kv_advertise (or --advertise) to the address "
            "they should use");
  EXPECT_FALSE(AdvertisedAddress({"::", 0}, 1, {}, "l", "a").ok());
}

TEST(ClusterConfigTest, ParsesTheMultiHostExample) {
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/deploy/multi-host/";
  absl::StatusOr<ClusterConfig> router = LoadClusterConfig(dir + "router.yaml");
  ASSERT_TRUE(router.ok()) << router.status();
  EXPECT_EQ(router->router.advertise.host, "10.0.0.1");
  absl::StatusOr<ClusterConfig> prefill = LoadClusterConfig(dir + "prefill-host.yaml");
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_EQ(prefill->router.listen.ToString(), "10.0.0.1:50051");
  EXPECT_EQ(prefill->prefill_workers.at(0).advertise.host, "10.0.0.2");
  absl::StatusOr<ClusterConfig> decode = LoadClusterConfig(dir + "decode-host.yaml");
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_EQ(decode->decode_workers.at(0).kv_advertise.host, "10.0.0.3");
  EXPECT_EQ(prefill->prefill_workers.at(0).metrics_listen.value_or(HostPort{}).ToString(),
            "0.0.0.0:9101");
  EXPECT_EQ(decode->decode_workers.at(0).metrics_listen.value_or(HostPort{}).ToString(),
            "0.0.0.0:9101");
  // The KV layout must match across hosts.
  for (const ClusterConfig* c : {&*prefill, &*decode}) {
    EXPECT_EQ(c->engine.block_size, router->engine.block_size);
    EXPECT_EQ(c->engine.num_kv_blocks, router->engine.num_kv_blocks);
  }
}

TEST(ClusterConfigTest, ClusterAuthKeys) {
  absl::StatusOr<ClusterConfig> none = ParseClusterConfig(kMinimal);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->cluster.secret_file, "");
  EXPECT_EQ(none->cluster.auth_max_skew_ms, 30000);
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(
      absl::StrCat(kMinimal, "cluster:\n  secret_file: s/x.secret\n  auth_max_skew_ms: 5000\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.secret_file, "s/x.secret");
  EXPECT_EQ(c->cluster.auth_max_skew_ms, 5000);
  EXPECT_THAT(ErrorOf(absl::StrCat(kMinimal, "cluster:\n  secret_file: ''\n")),
              HasSubstr("cluster.secret_file: must not be empty (remove the key to run open)"));
  EXPECT_THAT(ErrorOf(absl::StrCat(kMinimal, "cluster:\n  auth_max_skew_ms: 999\n")),
              HasSubstr("cluster.auth_max_skew_ms: must be in [1000, 600000], got 999"));
  // A window with no secret to check would be parsed and ignored: refused.
  EXPECT_THAT(ErrorOf(absl::StrCat(kMinimal, "cluster:\n  auth_max_skew_ms: 5000\n")),
              HasSubstr("cluster.auth_max_skew_ms: has no effect without cluster.secret_file "
                        "(the cluster runs open)"));
  EXPECT_THAT(ErrorOf(absl::StrCat(kMinimal, "cluster:\n  secret: x\n")),
              HasSubstr("unknown key 'cluster.secret'"));
}

TEST(ClusterConfigTest, AcceptedSecretFilesForRotation) {
  absl::StatusOr<ClusterConfig> none =
      ParseClusterConfig(absl::StrCat(kMinimal, "cluster:\n  secret_file: s/new.secret\n"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->cluster.accepted_secret_files.empty());
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(
      absl::StrCat(kMinimal,
                   "cluster:\n  secret_file: s/new.secret\n"
                   "  accepted_secret_files: [s/old.secret, /abs/older.secret]\n"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.accepted_secret_files,
            (std::vector<std::string>{"s/old.secret", "/abs/older.secret"}));
  // Step 3 of a rotation: the old secret retired, the key still written.
  absl::StatusOr<ClusterConfig> empty = ParseClusterConfig(absl::StrCat(
      kMinimal, "cluster:\n  secret_file: s/new.secret\n  accepted_secret_files: []\n"));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->cluster.accepted_secret_files.empty());

  EXPECT_EQ(ErrorOf(absl::StrCat(kMinimal, "cluster:\n  accepted_secret_files: [s/old.secret]\n")),
            "cluster.accepted_secret_files: needs cluster.secret_file (an open cluster has no "
            "secret to rotate) (line 4, column 26)");
  EXPECT_THAT(ErrorOf(absl::StrCat(kMinimal,
                                   "cluster:\n  secret_file: s/new.secret\n"
                                   "  accepted_secret_files: s/old.secret\n")),
              HasSubstr("cluster.accepted_secret_files: expected a list of paths ([] for none)"));
  EXPECT_THAT(ErrorOf(absl::StrCat(kMinimal,
                                   "cluster:\n  secret_file: s/new.secret\n"
                                   "  accepted_secret_files:\n")),
              HasSubstr("cluster.accepted_secret_files: has no value"));
  EXPECT_THAT(ErrorOf(absl::StrCat(kMinimal,
                                   "cluster:\n  secret_file: s/new.secret\n"
                                   "  accepted_secret_files: [a, '']\n")),
              HasSubstr("cluster.accepted_secret_files[1]: expected a non-empty path"));
  EXPECT_THAT(ErrorOf(absl::StrCat(kMinimal,
                                   "cluster:\n  secret_file: s/new.secret\n"
                                   "  accepted_secret_files: [a, [b]]\n")),
              HasSubstr("cluster.accepted_secret_files[1]: expected a non-empty path"));
}

TEST(ClusterConfigTest, ParsesTheSecuredExample) {
  absl::StatusOr<ClusterConfig> c =
      LoadClusterConfig(std::string(TANDEM_SOURCE_DIR) + "/deploy/secured/cluster.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.secret_file, "deploy/secured/cluster.secret");
  EXPECT_EQ(c->cluster.auth_max_skew_ms, 30000);
  EXPECT_EQ(c->router.api_keys_file, "deploy/secured/api-keys.yaml");
  EXPECT_EQ(c->decode_workers.at(0).name, "decode-0");
}

TEST(ClusterConfigTest, AdvertiseKeys) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(R"(
router: {listen: "0.0.0.0:50051", advertise: "10.0.0.1"}
prefill_workers:
  - {name: p, listen: "0.0.0.0:0", advertise: "10.0.0.2:7000"}
decode_workers:
  - {name: d, listen: "0.0.0.0:0", advertise: "10.0.0.3", kv_listen: "0.0.0.0:0",
     kv_advertise: "10.0.0.4"}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->router.advertise.host, "10.0.0.1");
  EXPECT_EQ(c->prefill_workers[0].advertise.port, 7000);
  EXPECT_EQ(c->decode_workers[0].advertise.host, "10.0.0.3");
  EXPECT_EQ(c->decode_workers[0].kv_advertise.host, "10.0.0.4");
  absl::StatusOr<ClusterConfig> bad = ParseClusterConfig(
      "decode_workers:\n  - {name: d, listen: \"0.0.0.0:0\", kv_advertise: \"0.0.0.0\"}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("decode_workers[0].kv_advertise: '0.0.0.0'"));
  // kv_advertise is a decode worker's key only.
  EXPECT_FALSE(
      ParseClusterConfig("prefill_workers:\n  - {name: p, listen: \"h:0\", kv_advertise: x}\n")
          .ok());
}

TEST(ClusterConfigTest, MetricsListenKey) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(R"(
prefill_workers:
  - {name: p, listen: "127.0.0.1:0", metrics_listen: "0.0.0.0:9101"}
decode_workers:
  - {name: d, listen: "127.0.0.1:0", kv_listen: "127.0.0.1:0", metrics_listen: "127.0.0.1:0"}
  - {name: e, listen: "127.0.0.1:0"}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->prefill_workers[0].metrics_listen.has_value());
  EXPECT_EQ(c->prefill_workers[0].metrics_listen->ToString(), "0.0.0.0:9101");
  ASSERT_TRUE(c->decode_workers[0].metrics_listen.has_value());
  EXPECT_EQ(c->decode_workers[0].metrics_listen->ToString(), "127.0.0.1:0");
  EXPECT_FALSE(c->decode_workers[1].metrics_listen.has_value());  // absent: no server
  EXPECT_THAT(ErrorOf("decode_workers:\n  - {name: d, metrics_listen: \"h:99999\"}\n"),
              HasSubstr("decode_workers[0].metrics_listen"));
  EXPECT_THAT(ErrorOf("decode_workers:\n  - {name: d, metrics_listen: 9101}\n"),
              HasSubstr("decode_workers[0].metrics_listen"));
}

TEST(ClusterConfigTest, DeviceKeysDefaults) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(kMinimal);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->engine.device.ToString(), "cpu");
  EXPECT_FALSE(c->engine.kv_cache_dtype.has_value());
  EXPECT_EQ(c->engine.gpu_memory_fraction, 0.9);
  EXPECT_TRUE(c->engine.batch_invariant);
  EXPECT_FALSE(c->engine.num_kv_blocks_set);
  const WorkerConfig& d = c->decode_workers[0];
  EXPECT_FALSE(d.device.has_value());
  EXPECT_EQ(c->WorkerDevice(d).ToString(), "cpu");
  EXPECT_EQ(c->WorkerDeviceKey(d), "engine.device");
  EXPECT_EQ(c->WorkerKvDtype(d), kv::KvDtype::kF32);
  absl::StatusOr<ClusterConfig> blocks =
      ParseClusterConfig(std::string(kMinimal) + "engine: {num_kv_blocks: 2048}\n");
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_TRUE(blocks->engine.num_kv_blocks_set);  // the default value, but given
}

TEST(ClusterConfigTest, DevicePerWorkerOverridesEngineDevice) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(R"(
prefill_workers:
  - {name: p0, device: "cuda:1"}
  - {name: p1}
decode_workers:
  - {name: d0, device: cpu}
  - {name: d1}
engine: {device: "cuda:0", kv_cache_dtype: f32, gpu_memory_fraction: 0.45}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->engine.device.ToString(), "cuda:0");
  EXPECT_EQ(c->engine.gpu_memory_fraction, 0.45);
  EXPECT_TRUE(c->engine.batch_invariant);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"p0", "cuda:1"}, {"p1", "cuda:0"}, {"d0", "cpu"}, {"d1", "cuda:0"}};
  for (const auto& [name, device] : expected) {
    const WorkerConfig* w = c->FindWorker(name);
    ASSERT_NE(w, nullptr) << name;
    EXPECT_EQ(c->WorkerDevice(*w).ToString(), device) << name;
    EXPECT_EQ(c->WorkerKvDtype(*w), kv::KvDtype::kF32) << name;  // given: every device
  }
  EXPECT_EQ(c->WorkerDeviceKey(*c->FindWorker("p0")), "prefill_workers[p0].device");
  EXPECT_EQ(c->WorkerDeviceKey(*c->FindWorker("p1")), "engine.device");
  EXPECT_EQ(c->WorkerDeviceKey(*c->FindWorker("d0")), "decode_workers[d0].device");
}

TEST(ClusterConfigTest, KvDtypeDefaultsByDevice) {
  // No prefill workers: decode workers may differ (no KV moves between them).
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(R"(
decode_workers:
  - {name: gpu, device: "cuda:0"}
  - {name: host}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->WorkerKvDtype(*c->FindWorker("gpu")), kv::KvDtype::kBF16);
  EXPECT_EQ(c->WorkerKvDtype(*c->FindWorker("host")), kv::KvDtype::kF32);
  for (const char* dtype : {"f32", "f16", "bf16"}) {
    absl::StatusOr<ClusterConfig> d = ParseClusterConfig(
        absl::StrCat(kMinimal, "engine: {device: \"cuda:0\", kv_cache_dtype: ", dtype, "}\n"));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_STREQ(kv::KvDtypeName(d->WorkerKvDtype(d->decode_workers[0])), dtype);
  }
}

// What the CPU backend refuses is refused when the file is read, once,
// naming the key and the worker (tandem up then starts nothing). Every KV
// dtype is held on cpu (f16/bf16 since issue #19).
TEST(ClusterConfigTest, CpuWorkersRefuseWhatTheCpuBackendCannotDo) {
  for (const char* dtype : {"f32", "f16", "bf16"}) {
    absl::StatusOr<ClusterConfig> c =
        ParseClusterConfig(absl::StrCat(kMinimal, "engine: {kv_cache_dtype: ", dtype, "}\n"));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_STREQ(kv::KvDtypeName(c->WorkerKvDtype(c->decode_workers[0])), dtype);
  }
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "engine: {batch_invariant: false}\n"),
            "engine.batch_invariant: false, but decode-0 runs on cpu, whose backend is always "
            "batch-invariant (remove the key, or run every worker on cuda:N)");
  EXPECT_TRUE(ParseClusterConfig(std::string(kMinimal) +
                                 "engine: {device: \"cuda:0\", batch_invariant: "
                                 "false}\n")
                  .ok());
}

TEST(ClusterConfigTest, DeviceKeysRefuseBadValuesNamingTheKey) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "engine: {device: gpu}\n"),
            "engine.device: expected cpu or cuda:N (N in 0..1023), got 'gpu' (line 3, column "
            "18)");
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "engine: {device: \"cuda:1024\"}\n"),
              HasSubstr("engine.device: expected cpu or cuda:N (N in 0..1023), got 'cuda:1024'"));
  EXPECT_THAT(ErrorOf("decode_workers:\n  - {name: d, device: \"cuda:x\"}\n"),
              HasSubstr("decode_workers[0].device: expected cpu or cuda:N"));
  EXPECT_THAT(ErrorOf("decode_workers: [{name: d}]\nprefill_workers:\n  - {name: p, device: "
                      "tpu}\n"),
              HasSubstr("prefill_workers[0].device: expected cpu or cuda:N (N in 0..1023), got "
                        "'tpu'"));
  EXPECT_THAT(ErrorOf("decode_workers:\n  - {name: d, device: }\n"),
              HasSubstr("decode_workers[0].device: has no value"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "engine: {kv_cache_dtype: fp8}\n"),
              HasSubstr("engine.kv_cache_dtype: expected f32, f16 or bf16, got 'fp8'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "engine: {batch_invariant: yes}\n"),
              HasSubstr("engine.batch_invariant: expected true or false"));
  const std::string gpu = "decode_workers:\n  - {name: d, device: \"cuda:0\"}\n";
  for (const char* bad : {"0", "0.0", "-0.5", "1.01", "2"}) {
    EXPECT_THAT(
        ErrorOf(gpu + "engine: {gpu_memory_fraction: " + bad + "}\n"),
        HasSubstr(absl::StrCat("engine.gpu_memory_fraction: must be in (0, 1], got ", bad)));
  }
  for (const char* bad : {"half", "nan", "inf", "[1]"}) {
    EXPECT_THAT(ErrorOf(gpu + "engine: {gpu_memory_fraction: " + bad + "}\n"),
                HasSubstr("engine.gpu_memory_fraction: expected a number"));
  }
  absl::StatusOr<ClusterConfig> one =
      ParseClusterConfig(gpu + "engine: {gpu_memory_fraction: 1}\n");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->engine.gpu_memory_fraction, 1.0);
}

TEST(ClusterConfigTest, GpuMemoryFractionNeedsACudaWorker) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "engine: {gpu_memory_fraction: 0.5}\n"),
            "engine.gpu_memory_fraction: set, but no worker runs on cuda:N (engine.device and "
            "every worker's device are cpu); remove the key");
}

// kv.transport, kv.nccl_socket_ifname, kv.nccl_init_timeout_ms (issue #16).
TEST(KvTransportConfigTest, DefaultsAreAutoNcclsChoiceAndTenSeconds) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(kMinimal);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->kv.transport.automatic);
  EXPECT_EQ(c->kv.nccl_socket_ifname, "");
  EXPECT_EQ(c->kv.nccl_init_timeout_ms, 10000);
}

TEST(KvTransportConfigTest, ReadsEveryValue) {
  const std::string gpu = "decode_workers:\n  - {name: d, device: \"cuda:0\"}\n";
  absl::StatusOr<ClusterConfig> a = ParseClusterConfig(gpu + "kv: {transport: auto}\n");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->kv.transport.automatic);
  const std::pair<const char*, kvtransfer::KvTransport> fixed[] = {
      {"tcp", kvtransfer::KvTransport::kTcp},
      {"nccl", kvtransfer::KvTransport::kNccl},
      {"cuda_ipc", kvtransfer::KvTransport::kCudaIpc}};
  for (const auto& [name, transport] : fixed) {
    absl::StatusOr<ClusterConfig> c = ParseClusterConfig(
        absl::StrCat(gpu, "kv: {transport: ", name,
                     ", nccl_socket_ifname: eth1, nccl_init_timeout_ms: 2500}\n"));
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_FALSE(c->kv.transport.automatic) << name;
    EXPECT_EQ(c->kv.transport.fixed, transport) << name;
    EXPECT_EQ(c->kv.nccl_socket_ifname, "eth1");
    EXPECT_EQ(c->kv.nccl_init_timeout_ms, 2500);
  }
  // tcp needs no GPU: a cpu worker may fix it.
  absl::StatusOr<ClusterConfig> tcp =
      ParseClusterConfig(std::string(kMinimal) + "kv: {transport: tcp}\n");
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_EQ(tcp->kv.transport.fixed, kvtransfer::KvTransport::kTcp);
}

TEST(KvTransportConfigTest, BadValuesNameTheKey) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "kv: {transport: rdma}\n"),
            "kv.transport: unknown value 'rdma' (expected auto, tcp, nccl or cuda_ipc) (line 3, "
            "column 17)");
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv: {transport: }\n"),
              HasSubstr("kv.transport: has no value"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv: {nccl_init_timeout_ms: 0}\n"),
              HasSubstr("kv.nccl_init_timeout_ms: must be in [1, 2147483647], got 0"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv: {nccl_init_timeout_ms: soon}\n"),
              HasSubstr("kv.nccl_init_timeout_ms: expected an integer, got 'soon'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv: {nccl_socket_ifname: [eth0]}\n"),
              HasSubstr("kv.nccl_socket_ifname: expected a string"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv: {nccl_socket_ifname: 'eth0 lo;rm'}\n"),
              HasSubstr("kv.nccl_socket_ifname: 'eth0 lo;rm' is not an NCCL interface list"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv: {nccl_socket_ifname: \"a\\0b\"}\n"),
              HasSubstr("kv.nccl_socket_ifname: 'a\\x00\\x62' is not an NCCL interface list"));
  {
    absl::StatusOr<ClusterConfig> ok =
        ParseClusterConfig(std::string(kMinimal) + "kv: {nccl_socket_ifname: '^docker,=eth0'}\n");
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(ok->kv.nccl_socket_ifname, "^docker,=eth0");
  }
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "kv: {nccl_ifname: eth0}\n"),
              HasSubstr("unknown key 'kv.nccl_ifname'"));
}

// A fixed device transport with a cpu worker: refused once, at read,
// naming the key and the worker (SupportedTransports would refuse it at
// that worker's start).
TEST(KvTransportConfigTest, CpuWorkerRefusesAFixedDeviceTransport) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "kv: {transport: nccl}\n"),
            "kv.transport: nccl, but decode-0 runs on cpu, whose KV cache is in host memory "
            "(nccl moves GPU memory; set kv.transport: auto or tcp, or run that worker on "
            "cuda:N)");
  EXPECT_EQ(ErrorOf("prefill_workers: [{name: p, device: cpu}]\n"
                    "decode_workers: [{name: d}]\n"
                    "engine: {device: \"cuda:0\", kv_cache_dtype: f32}\n"
                    "kv: {transport: cuda_ipc}\n"),
            "kv.transport: cuda_ipc, but p runs on cpu, whose KV cache is in host memory "
            "(cuda_ipc moves GPU memory; set kv.transport: auto or tcp, or run that worker on "
            "cuda:N)");
  // auto on cpu is fine (it falls back to tcp there).
  EXPECT_TRUE(ParseClusterConfig(std::string(kMinimal) + "kv: {transport: auto}\n").ok());
}

// q8_matmul: int8 with a cuda worker: refused once, at read, naming the key
// and the worker (the backend factory would refuse it at that worker's
// start, after the router and the models had loaded).
TEST(ClusterConfigTest, Int8Q8MatmulWithACudaWorkerIsRefusedAtRead) {
  EXPECT_EQ(ErrorOf("prefill_workers: [{name: p, device: \"cuda:1\"}]\n"
                    "decode_workers: [{name: d}]\n"
                    "engine: {q8_matmul: int8, kv_cache_dtype: f16}\n"),
            "engine.q8_matmul: int8, but p runs on cuda:1, whose backend multiplies Q8_0 "
            "weights only as exact (set engine.q8_matmul: exact, or run every worker on cpu)");
  EXPECT_TRUE(ParseClusterConfig("prefill_workers: [{name: p, device: \"cuda:1\"}]\n"
                                 "decode_workers: [{name: d}]\n"
                                 "engine: {q8_matmul: exact, kv_cache_dtype: f16}\n")
                  .ok());
  EXPECT_TRUE(ParseClusterConfig("decode_workers: [{name: d}]\n"
                                 "engine: {q8_matmul: int8}\n")
                  .ok());
}

TEST(ClusterConfigTest, PrefillAndDecodeWorkersMustShareTheKvDtype) {
  // cuda defaults to bf16, cpu to f32: KV could not move from p to d.
  EXPECT_EQ(ErrorOf("prefill_workers: [{name: p}]\n"
                    "decode_workers: [{name: d, device: \"cuda:0\"}]\n"),
            "engine.kv_cache_dtype: prefill and decode workers must hold one KV dtype (KV moves "
            "between them), but p on cpu holds f32 and d on cuda:0 holds bf16; set "
            "engine.kv_cache_dtype");
  // One dtype given: a mixed cluster is fine.
  absl::StatusOr<ClusterConfig> mixed = ParseClusterConfig(
      "prefill_workers: [{name: p}]\n"
      "decode_workers: [{name: d, device: \"cuda:0\"}]\n"
      "engine: {kv_cache_dtype: f32}\n");
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  // Every worker on a GPU: bf16 throughout.
  absl::StatusOr<ClusterConfig> gpus = ParseClusterConfig(
      "prefill_workers: [{name: p}]\n"
      "decode_workers: [{name: d}]\n"
      "engine: {device: \"cuda:0\"}\n");
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_EQ(gpus->WorkerKvDtype(gpus->prefill_workers[0]), kv::KvDtype::kBF16);
}

// Runs each test in a fresh temporary working directory, with
// $TANDEM_MODEL unset, and restores both afterwards.
class ResolveModelPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    old_cwd_ = std::filesystem::current_path();
    std::string templ =
        (std::filesystem::path(::testing::TempDir()) / "tandem_model_XXXXXX").string();
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    // cwd = <dir>/work so that "../shared/models/..." stays inside <dir>.
    std::filesystem::create_directories(dir_ / "work" / "models");
    std::filesystem::create_directories(dir_ / "shared" / "models");
    std::filesystem::current_path(dir_ / "work");
    if (const char* env = getenv("TANDEM_MODEL")) saved_env_ = env;
    unsetenv("TANDEM_MODEL");
  }
  void TearDown() override {
    std::filesystem::current_path(old_cwd_);
    std::filesystem::remove_all(dir_);
    if (saved_env_.has_value()) {
      setenv("TANDEM_MODEL", saved_env_->c_str(), 1);
    } else {
      unsetenv("TANDEM_MODEL");
    }
  }
  static void Touch(const std::string& path) { std::ofstream(path) << "x"; }

  std::filesystem::path old_cwd_;
  std::filesystem::path dir_;
  std::optional<std::string> saved_env_;
};

TEST_F(ResolveModelPathTest, FollowsDocumentedOrder) {
  ClusterConfig config;
  config.model = "config.gguf";
  const std::string env_model = (dir_ / "env.gguf").string();
  for (const char* p : {"flag.gguf", "config.gguf", "models/stories260K.gguf",
                        "../shared/models/stories260K.gguf"}) {
    Touch(p);
  }
  Touch(env_model);
  setenv("TANDEM_MODEL", env_model.c_str(), 1);

  // Each step drops the winner of the previous one.
  EXPECT_EQ(ResolveModelPath("flag.gguf", config).value_or("?"), "flag.gguf");
  EXPECT_EQ(ResolveModelPath("", config).value_or("?"), env_model);
  unsetenv("TANDEM_MODEL");
  EXPECT_EQ(ResolveModelPath("", config).value_or("?"), "config.gguf");
  config.model.clear();
  EXPECT_EQ(ResolveModelPath("", config).value_or("?"), "models/stories260K.gguf");
  std::filesystem::remove("models/stories260K.gguf");
  EXPECT_EQ(ResolveModelPath("", config).value_or("?"), "../shared/models/stories260K.gguf");
}

// An explicit choice that does not exist is an error naming it, never a
// silent fall-through to another model.
TEST_F(ResolveModelPathTest, MissingExplicitChoiceIsAnError) {
  ClusterConfig config;
  Touch("models/stories260K.gguf");
  auto flag = ResolveModelPath("missing-flag.gguf", config);
  ASSERT_FALSE(flag.ok());
  EXPECT_EQ(flag.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(flag.status().message(), HasSubstr("--model missing-flag.gguf"));
  setenv("TANDEM_MODEL", "missing-env.gguf", 1);
  auto env = ResolveModelPath("", config);
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(env.status().message(), HasSubstr("$TANDEM_MODEL missing-env.gguf"));
  unsetenv("TANDEM_MODEL");
  config.model = "missing-config.gguf";
  auto cfg = ResolveModelPath("", config);
  ASSERT_FALSE(cfg.ok());
  EXPECT_THAT(cfg.status().message(), HasSubstr("missing-config.gguf"));
}

TEST_F(ResolveModelPathTest, DirectoryIsNotAModel) {
  ClusterConfig config;
  std::filesystem::create_directories("dir.gguf");
  EXPECT_FALSE(ResolveModelPath("dir.gguf", config).ok());
}

TEST_F(ResolveModelPathTest, NothingFoundIsOneLineNamingTheFlag) {
  ClusterConfig config;
  absl::StatusOr<std::string> path = ResolveModelPath("missing.gguf", config);
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(path.status().message(), HasSubstr("--model"));
  EXPECT_THAT(path.status().message(), HasSubstr("missing.gguf"));
  EXPECT_EQ(path.status().message().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// planner (issue #35): every key read, bad values refused naming the key.
TEST(PlannerConfigTest, ParsesEveryKeyAndDefaultsToOff) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig("decode_workers:\n  - name: decode-0\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->planner.mode, PlannerMode::kOff);
  EXPECT_EQ(c->router.role_drain_timeout_ms, 1000);
  c = ParseClusterConfig(
      "decode_workers:\n  - name: decode-0\n"
      "router: {role_drain_timeout_ms: 250}\n"
      "slo: {ttft_ms: 800}\n"
      "planner: {mode: slo, interval_s: 0.5, cooldown_s: 12, min_prefill_workers: 0,\n"
      "          min_decode_workers: 2, flip_roles: false}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->router.role_drain_timeout_ms, 250);
  EXPECT_EQ(c->planner.mode, PlannerMode::kSlo);
  EXPECT_DOUBLE_EQ(c->planner.interval_s, 0.5);
  EXPECT_DOUBLE_EQ(c->planner.cooldown_s, 12);
  EXPECT_EQ(c->planner.min_prefill_workers, 0);
  EXPECT_EQ(c->planner.min_decode_workers, 2);
  EXPECT_FALSE(c->planner.flip_roles);
  c = ParseClusterConfig("decode_workers:\n  - name: decode-0\nplanner: {mode: load}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->planner.mode, PlannerMode::kLoad);
}

TEST(PlannerConfigTest, BadKeysAreRefusedNamingTheKey) {
  const std::string base = "decode_workers:\n  - name: decode-0\n";
  auto error = [&](const std::string& yaml) {
    absl::StatusOr<ClusterConfig> c = ParseClusterConfig(base + yaml);
    return c.ok() ? std::string("(accepted)") : std::string(c.status().message());
  };
  EXPECT_THAT(error("planner: {mode: fast}\n"),
              HasSubstr("planner.mode: expected off, load or slo, got 'fast'"));
  EXPECT_THAT(error("planner: {mode: slo}\n"),
              HasSubstr("planner.mode: slo needs slo.ttft_ms or slo.tpot_ms"));
  EXPECT_THAT(error("planner: {interval_s: 0}\n"),
              HasSubstr("planner.interval_s: expected a number > 0"));
  EXPECT_THAT(error("planner: {cooldown_s: soon}\n"),
              HasSubstr("planner.cooldown_s: expected a number > 0"));
  EXPECT_THAT(error("planner: {min_decode_workers: 0}\n"), HasSubstr("planner.min_decode_workers"));
  EXPECT_THAT(error("planner: {min_prefill_workers: -1}\n"),
              HasSubstr("planner.min_prefill_workers"));
  EXPECT_THAT(error("planner: {flip_roles: maybe}\n"),
              HasSubstr("planner.flip_roles: expected true or false"));
  EXPECT_THAT(error("planner: {modes: load}\n"), HasSubstr("unknown key 'planner.modes'"));
  EXPECT_THAT(error("planner: load\n"), HasSubstr("planner: expected a mapping"));
  EXPECT_THAT(error("router: {role_drain_timeout_ms: -5}\n"),
              HasSubstr("router.role_drain_timeout_ms"));
}

// Every worker entry takes kv_listen / kv_advertise (a prefill worker may
// become a decode worker at run time); a prefill entry defaults to 127.0.0.1:0.
TEST(PlannerConfigTest, PrefillEntriesTakeKvListen) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(
      "decode_workers:\n  - name: decode-0\n"
      "prefill_workers:\n  - name: p0\n    kv_listen: 0.0.0.0:7009\n    kv_advertise: 10.0.0.5\n"
      "  - name: p1\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->prefill_workers[0].kv_listen.ToString(), "0.0.0.0:7009");
  EXPECT_EQ(c->prefill_workers[0].kv_advertise.host, "10.0.0.5");
  EXPECT_EQ(c->prefill_workers[1].kv_listen.ToString(), "127.0.0.1:0");
}

}  // namespace
}  // namespace tandem
