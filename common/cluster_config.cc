// Cluster configuration loader: YAML (yaml-cpp) -> ClusterConfig.
//
// Every mapping is checked against its list of known keys before any value
// is read, so a typo anywhere ("kv.handshake_timeout" for
// "kv.handshake_timeout_ms") is an error naming the full key path instead of
// a silently ignored setting. yaml-cpp throws on syntax errors and bad
// conversions; every call into it happens inside ParseClusterConfig's
// try-block, and scalars are converted by hand (absl::SimpleAtoi) so the
// messages name our key paths.
#include "common/cluster_config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <initializer_list>
#include <set>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/config_yaml.h"

namespace tandem {

const char* RouterPolicyName(RouterPolicy policy) {
  switch (policy) {
    case RouterPolicy::kKvAware:
      return "kv_aware";
    case RouterPolicy::kLeastLoaded:
      return "least_loaded";
    case RouterPolicy::kRoundRobin:
      return "round_robin";
  }
  return "unknown";
}

const char* PlacementModeName(PlacementMode mode) {
  switch (mode) {
    case PlacementMode::kThreshold:
      return "threshold";
    case PlacementMode::kSlo:
      return "slo";
  }
  return "unknown";
}

const WorkerConfig* ClusterConfig::FindWorker(const std::string& name) const {
  for (const auto* list : {&prefill_workers, &decode_workers}) {
    for (const WorkerConfig& w : *list) {
      if (w.name == name) return &w;
    }
  }
  return nullptr;
}

backend::DeviceSpec ClusterConfig::WorkerDevice(const WorkerConfig& worker) const {
  return worker.device.value_or(engine.device);
}

std::string ClusterConfig::WorkerDeviceKey(const WorkerConfig& worker) const {
  if (!worker.device.has_value()) return "engine.device";
  bool prefill = false;
  for (const WorkerConfig& w : prefill_workers) prefill |= w.name == worker.name;
  return absl::StrCat(prefill ? "prefill_workers[" : "decode_workers[", worker.name, "].device");
}

kv::KvDtype ClusterConfig::WorkerKvDtype(const WorkerConfig& worker) const {
  if (engine.kv_cache_dtype.has_value()) return *engine.kv_cache_dtype;
  return WorkerDevice(worker).is_cuda() ? kv::KvDtype::kBF16 : kv::KvDtype::kF32;
}

namespace {

using namespace config_yaml;  // NOLINT(build/namespaces): the parsers' own helpers

// Reads conditional.max_local_prefill_tokens, when present, into *out: an
// integer in [0, INT32_MAX] or the word `unbounded`
// (kUnboundedLocalPrefillTokens). Anything else: INVALID_ARGUMENT naming the
// field and saying "an integer >= 0 or unbounded".
[[nodiscard]] absl::Status ReadLocalPrefillTokens(const YAML::Node& map, int32_t* out) {
  constexpr char kField[] = "conditional.max_local_prefill_tokens";
  const YAML::Node node = map["max_local_prefill_tokens"];
  if (!node.IsDefined()) return absl::OkStatus();
  if (node.IsNull()) return Invalid(kField, kNoValue, node);
  const std::string text = node.IsScalar() ? node.Scalar() : "<non-scalar>";
  if (text == "unbounded") {
    *out = kUnboundedLocalPrefillTokens;
    return absl::OkStatus();
  }
  int64_t value = 0;
  if (!node.IsScalar() || !absl::SimpleAtoi(text, &value) || value < 0) {
    return Invalid(kField, absl::StrCat("expected an integer >= 0 or unbounded, got '", text, "'"),
                   node);
  }
  if (value > INT32_MAX) {
    return Invalid(kField,
                   absl::StrCat("expected an integer >= 0 or unbounded, got '", text,
                                "' (the largest integer is ", INT32_MAX, ")"),
                   node);
  }
  *out = static_cast<int32_t>(value);
  return absl::OkStatus();
}

// router.policy and router.kv_aware.
[[nodiscard]] absl::Status ParseRoutingPolicy(const YAML::Node& node, RouterConfig* r) {
  const std::string path = "router";
  if (node["policy"].IsDefined()) {
    std::string policy;
    if (absl::Status s = ReadString(node, "policy", path, &policy); !s.ok()) return s;
    if (policy == "kv_aware") {
      r->policy = RouterPolicy::kKvAware;
    } else if (policy == "least_loaded") {
      r->policy = RouterPolicy::kLeastLoaded;
    } else if (policy == "round_robin") {
      r->policy = RouterPolicy::kRoundRobin;
    } else {
      return Invalid(
          "router.policy",
          absl::StrCat("must be one of kv_aware, least_loaded, round_robin; got '", policy, "'"),
          node["policy"]);
    }
  }
  const YAML::Node weights = node["kv_aware"];
  if (!weights.IsDefined()) return absl::OkStatus();
  if (r->policy != RouterPolicy::kKvAware) {
    return Invalid("router.kv_aware",
                   absl::StrCat("weights of router.policy kv_aware, but router.policy is ",
                                RouterPolicyName(r->policy)),
                   weights);
  }
  const std::string wpath = "router.kv_aware";
  if (absl::Status s =
          CheckKeys(weights, wpath,
                    {"prefix_weight", "free_blocks_weight", "load_weight", "prefill_queue_weight"});
      !s.ok()) {
    return s;
  }
  KvAwareWeights& w = r->kv_aware;
  for (const auto& [key, out] :
       {std::pair<absl::string_view, double*>{"prefix_weight", &w.prefix_weight},
        {"free_blocks_weight", &w.free_blocks_weight},
        {"load_weight", &w.load_weight},
        {"prefill_queue_weight", &w.prefill_queue_weight}}) {
    if (absl::Status s = ReadWeight(weights, wpath, key, out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

[[nodiscard]] absl::Status ParseRouter(const YAML::Node& node, RouterConfig* r) {
  const std::string path = "router";
  if (absl::Status s = CheckKeys(node, path,
                                 {"name",
                                  "listen",
                                  "advertise",
                                  "poll_interval_ms",
                                  "unhealthy_after_missed_polls",
                                  "rpc_timeout_ms",
                                  "max_inflight",
                                  "max_queued",
                                  "max_migrations",
                                  "drop_after_ms",
                                  "api_keys_file",
                                  "policy",
                                  "kv_aware",
                                  "http_listen",
                                  "served_model_name",
                                  "http_max_streams",
                                  "http_max_body_bytes",
                                  "http_read_timeout_ms",
                                  "metrics_listen",
                                  "role_drain_timeout_ms"});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadOptionalHostPort(node, "http_listen", path, &r->http_listen); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadOptionalHostPort(node, "metrics_listen", path, &r->metrics_listen);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadString(node, "served_model_name", path, &r->served_model_name);
      !s.ok()) {
    return s;
  }
  if (node["served_model_name"].IsDefined() && r->served_model_name.empty()) {
    return Invalid("router.served_model_name",
                   "must not be empty (remove the key to serve the model file's stem)",
                   node["served_model_name"]);
  }
  if (absl::Status s = ReadString(node, "name", path, &r->name); !s.ok()) return s;
  if (r->name.empty()) return Invalid("router.name", "must not be empty", node);
  if (absl::Status s = ReadHostPort(node, "listen", path, &r->listen); !s.ok()) return s;
  if (absl::Status s = ReadAdvertise(node, "advertise", path, &r->advertise); !s.ok()) return s;
  if (absl::Status s = ReadString(node, "api_keys_file", path, &r->api_keys_file); !s.ok()) {
    return s;
  }
  if (node["api_keys_file"].IsDefined() && r->api_keys_file.empty()) {
    return Invalid("router.api_keys_file", "must not be empty (remove the key for no API keys)",
                   node["api_keys_file"]);
  }
  if (absl::Status s = ParseRoutingPolicy(node, r); !s.ok()) return s;
  return ReadInts(node, path,
                  {{"poll_interval_ms", &r->poll_interval_ms, 1},
                   {"unhealthy_after_missed_polls", &r->unhealthy_after_missed_polls, 1},
                   {"rpc_timeout_ms", &r->rpc_timeout_ms, 1},
                   {"max_inflight", &r->max_inflight, 1},
                   {"max_queued", &r->max_queued, 0},
                   {"max_migrations", &r->max_migrations, 0},
                   {"role_drain_timeout_ms", &r->role_drain_timeout_ms, 0, 600000},
                   {"drop_after_ms", &r->drop_after_ms, 1},
                   {"http_max_streams", &r->http_max_streams, 1},
                   {"http_max_body_bytes", &r->http_max_body_bytes, 1024},
                   {"http_read_timeout_ms", &r->http_read_timeout_ms, 1}});
}

// cluster.accepted_secret_files: a list of non-empty paths ([] allowed,
// the last step of a rotation), only next to cluster.secret_file (read
// before this).
[[nodiscard]] absl::Status ReadAcceptedSecretFiles(const YAML::Node& cluster,
                                                   ClusterAuthConfig* out) {
  constexpr char kKey[] = "cluster.accepted_secret_files";
  const YAML::Node list = cluster["accepted_secret_files"];
  if (!list.IsDefined()) return absl::OkStatus();
  if (list.IsNull()) return Invalid(kKey, kNoValue, list);
  if (!list.IsSequence()) return Invalid(kKey, "expected a list of paths ([] for none)", list);
  if (out->secret_file.empty()) {
    return Invalid(kKey, "needs cluster.secret_file (an open cluster has no secret to rotate)",
                   list);
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node item = list[i];
    if (!item.IsScalar() || item.Scalar().empty()) {
      return Invalid(absl::StrCat(kKey, "[", i, "]"), "expected a non-empty path", item);
    }
    out->accepted_secret_files.push_back(item.Scalar());
  }
  return absl::OkStatus();
}

// prefill_workers / decode_workers: a sequence of {name, listen, advertise,
// metrics_listen, kv_listen, kv_advertise, device} (every worker has a KV
// receiver: it may become a decode worker, issue #35).
[[nodiscard]] absl::Status ParseWorkers(const YAML::Node& node, const std::string& list_name,
                                        std::vector<WorkerConfig>* out) {
  if (node.IsNull()) return absl::OkStatus();  // "prefill_workers:" with no entries
  if (!node.IsSequence()) return Invalid(list_name, "expected a list", node);
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node item = node[i];
    const std::string path = absl::StrCat(list_name, "[", i, "]");
    absl::Status s = CheckKeys(
        item, path,
        {"name", "listen", "advertise", "kv_listen", "kv_advertise", "metrics_listen", "device"});
    if (!s.ok()) return s;
    WorkerConfig w;
    if (s = ReadString(item, "name", path, &w.name); !s.ok()) return s;
    if (w.name.empty()) return Invalid(path + ".name", "is required", item);
    if (s = ReadHostPort(item, "listen", path, &w.listen); !s.ok()) return s;
    if (s = ReadAdvertise(item, "advertise", path, &w.advertise); !s.ok()) return s;
    if (s = ReadOptionalHostPort(item, "metrics_listen", path, &w.metrics_listen); !s.ok()) {
      return s;
    }
    if (s = ReadDevice(item, "device", path, &w.device); !s.ok()) return s;
    if (s = ReadHostPort(item, "kv_listen", path, &w.kv_listen); !s.ok()) return s;
    if (s = ReadAdvertise(item, "kv_advertise", path, &w.kv_advertise); !s.ok()) return s;
    out->push_back(std::move(w));
  }
  return absl::OkStatus();
}

// engine: the engine settings every worker runs with.
[[nodiscard]] absl::Status ParseEngine(const YAML::Node& n, EngineConfig* engine) {
  absl::Status s;
  if (s = CheckKeys(
          n, "engine",
          {"block_size", "num_kv_blocks", "max_num_seqs", "threads", "max_num_batched_tokens",
           "prefill_chunk_tokens", "enable_prefix_caching", "kernel_isa", "q8_matmul", "device",
           "kv_cache_dtype", "gpu_memory_fraction", "batch_invariant"});
      !s.ok()) {
    return s;
  }
  EngineConfig& e = *engine;
  s = ReadInts(n, "engine",
               {{"block_size", &e.block_size, 1},
                {"num_kv_blocks", &e.num_kv_blocks, 1},
                {"max_num_seqs", &e.max_num_seqs, 1},
                {"threads", &e.threads, 1, model::kMaxForwardThreads},
                {"max_num_batched_tokens", &e.max_num_batched_tokens, 1},
                {"prefill_chunk_tokens", &e.prefill_chunk_tokens, 1}});
  if (!s.ok()) return s;
  e.num_kv_blocks_set = n["num_kv_blocks"].IsDefined();
  if (s = ReadBool(n, "enable_prefix_caching", "engine", &e.enable_prefix_caching); !s.ok()) {
    return s;
  }
  if (s = ReadBool(n, "batch_invariant", "engine", &e.batch_invariant); !s.ok()) return s;
  std::optional<backend::DeviceSpec> device;
  if (s = ReadDevice(n, "device", "engine", &device); !s.ok()) return s;
  e.device = device.value_or(backend::DeviceSpec{});
  if (n["kv_cache_dtype"].IsDefined()) {
    std::string dtype;
    if (s = ReadString(n, "kv_cache_dtype", "engine", &dtype); !s.ok()) return s;
    for (kv::KvDtype d : {kv::KvDtype::kF32, kv::KvDtype::kF16, kv::KvDtype::kBF16}) {
      if (dtype == kv::KvDtypeName(d)) e.kv_cache_dtype = d;
    }
    if (!e.kv_cache_dtype.has_value()) {
      return Invalid("engine.kv_cache_dtype",
                     absl::StrCat("expected f32, f16 or bf16, got '", dtype, "'"),
                     n["kv_cache_dtype"]);
    }
  }
  std::optional<double> fraction;
  if (s = ReadFiniteNumber(n, "engine", "gpu_memory_fraction", "a number", &fraction); !s.ok()) {
    return s;
  }
  if (fraction.has_value()) {
    if (!(*fraction > 0 && *fraction <= 1)) {
      return Invalid("engine.gpu_memory_fraction",
                     absl::StrCat("must be in (0, 1], got ", n["gpu_memory_fraction"].Scalar()),
                     n["gpu_memory_fraction"]);
    }
    e.gpu_memory_fraction = *fraction;
  }
  if (s = ReadString(n, "kernel_isa", "engine", &e.kernel_isa); !s.ok()) return s;
  if (e.kernel_isa != "auto" && e.kernel_isa != "avx512" && e.kernel_isa != "avx2" &&
      e.kernel_isa != "generic") {
    return Invalid("engine.kernel_isa", "expected auto, avx512, avx2 or generic", n["kernel_isa"]);
  }
  if (n["q8_matmul"].IsDefined()) {
    std::string mode;
    if (s = ReadString(n, "q8_matmul", "engine", &mode); !s.ok()) return s;
    if (mode == "exact") {
      e.q8_matmul = model::Q8MatMul::kExact;
    } else if (mode == "int8") {
      e.q8_matmul = model::Q8MatMul::kInt8;
    } else {
      return Invalid("engine.q8_matmul", absl::StrCat("expected exact or int8, got '", mode, "'"),
                     n["q8_matmul"]);
    }
  }
  return absl::OkStatus();
}

// conditional: where prompts are prefilled and what a failed remote
// prefill does. conditional.placement, when given, goes to *placement:
// its default depends on `slo`, which ParseTop resolves once both are read.
[[nodiscard]] absl::Status ParseConditional(const YAML::Node& n, ConditionalConfig* cond,
                                            std::optional<PlacementMode>* placement) {
  absl::Status s;
  if (s = CheckKeys(n, "conditional",
                    {"max_local_prefill_tokens", "placement", "on_prefill_failure"});
      !s.ok()) {
    return s;
  }
  s = ReadLocalPrefillTokens(n, &cond->max_local_prefill_tokens);
  if (!s.ok()) return s;
  if (n["placement"].IsDefined()) {
    std::string mode;
    if (s = ReadString(n, "placement", "conditional", &mode); !s.ok()) return s;
    for (PlacementMode m : {PlacementMode::kThreshold, PlacementMode::kSlo}) {
      if (mode == PlacementModeName(m)) *placement = m;
    }
    if (!placement->has_value()) {
      return Invalid("conditional.placement",
                     absl::StrCat("must be one of threshold, slo; got '", mode, "'"),
                     n["placement"]);
    }
  }
  // Absent: the documented default (ConditionalConfig), not `fail`.
  std::string policy;
  switch (cond->on_prefill_failure) {
    case OnPrefillFailure::kFail:
      policy = "fail";
      break;
    case OnPrefillFailure::kRetry:
      policy = "retry";
      break;
    case OnPrefillFailure::kLocal:
      policy = "local";
      break;
  }
  if (s = ReadString(n, "on_prefill_failure", "conditional", &policy); !s.ok()) return s;
  if (policy == "fail") {
    cond->on_prefill_failure = OnPrefillFailure::kFail;
  } else if (policy == "retry") {
    cond->on_prefill_failure = OnPrefillFailure::kRetry;
  } else if (policy == "local") {
    cond->on_prefill_failure = OnPrefillFailure::kLocal;
  } else {
    return Invalid("conditional.on_prefill_failure",
                   absl::StrCat("must be one of fail, retry, local; got '", policy, "'"),
                   n["on_prefill_failure"]);
  }
  return absl::OkStatus();
}

// slo: {ttft_ms, tpot_ms}, each optional, a finite number > 0.
[[nodiscard]] absl::Status ParseSlo(const YAML::Node& n, SloConfig* slo) {
  if (absl::Status s = CheckKeys(n, "slo", {"ttft_ms", "tpot_ms"}); !s.ok()) return s;
  for (const auto& [key, out] :
       {std::pair<absl::string_view, std::optional<double>*>{"ttft_ms", &slo->ttft_ms},
        {"tpot_ms", &slo->tpot_ms}}) {
    constexpr char kExpected[] = "a number > 0";
    if (absl::Status s = ReadFiniteNumber(n, "slo", key, kExpected, out); !s.ok()) return s;
    if (out->has_value() && !(**out > 0)) {
      const YAML::Node node = n[std::string(key)];
      return Invalid(KeyPath("slo", key),
                     absl::StrCat("expected ", kExpected, ", got ", node.Scalar()), node);
    }
  }
  return absl::OkStatus();
}

// conditional.placement once `slo` is known: as given (slo only with an
// objective to predict against), else slo when one is set, else threshold.
[[nodiscard]] absl::Status ResolvePlacement(const YAML::Node& root,
                                            std::optional<PlacementMode> given, ClusterConfig* c) {
  if (!given.has_value()) {
    c->conditional.placement = c->slo.any() ? PlacementMode::kSlo : PlacementMode::kThreshold;
    return absl::OkStatus();
  }
  if (*given == PlacementMode::kSlo && !c->slo.any()) {
    return Invalid("conditional.placement", "slo needs slo.ttft_ms or slo.tpot_ms",
                   root["conditional"]["placement"]);
  }
  c->conditional.placement = *given;
  return absl::OkStatus();
}

// kv: KV transfer timeouts, attempts, buffer and transport.
[[nodiscard]] absl::Status ParseKv(const YAML::Node& n, KvConfig* kv) {
  absl::Status s;
  if (s = CheckKeys(
          n, "kv",
          {"transfer_timeout_ms", "handshake_timeout_ms", "max_prefill_attempts",
           "send_buffer_bytes", "transport", "nccl_socket_ifname", "nccl_init_timeout_ms"});
      !s.ok()) {
    return s;
  }
  s = ReadInts(n, "kv",
               {{"transfer_timeout_ms", &kv->transfer_timeout_ms, 1},
                {"handshake_timeout_ms", &kv->handshake_timeout_ms, 1},
                {"max_prefill_attempts", &kv->max_prefill_attempts, 1},
                {"nccl_init_timeout_ms", &kv->nccl_init_timeout_ms, 1}});
  if (!s.ok()) return s;
  s = ReadInt(n, "kv", "send_buffer_bytes", &kv->send_buffer_bytes, KvConfig::kMinSendBufferBytes,
              KvConfig::kMaxSendBufferBytes);
  if (!s.ok()) return s;
  if (n["transport"].IsDefined()) {
    std::string text;
    if (s = ReadString(n, "transport", "kv", &text); !s.ok()) return s;
    absl::StatusOr<kvtransfer::KvTransportSetting> setting =
        kvtransfer::ParseKvTransportSetting(text);
    if (!setting.ok()) {
      // Its message names kv.transport and the value; the position is ours.
      return absl::InvalidArgumentError(
          absl::StrCat(setting.status().message(), Where(n["transport"])));
    }
    kv->transport = *setting;
  }
  s = ReadString(n, "nccl_socket_ifname", "kv", &kv->nccl_socket_ifname);
  if (!s.ok()) return s;
  // NCCL's NCCL_SOCKET_IFNAME syntax: interface names or prefixes,
  // comma-separated, optionally led by ^ (exclude) or = (exact).
  for (const char ch : kv->nccl_socket_ifname) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(ch)) &&
        std::string_view("._-:,^=@").find(ch) == std::string_view::npos) {
      return Invalid("kv.nccl_socket_ifname",
                     absl::StrCat("'", absl::CHexEscape(kv->nccl_socket_ifname),
                                  "' is not an NCCL interface list (names or prefixes, "
                                  "comma-separated, optionally led by ^ or =)"),
                     n["nccl_socket_ifname"]);
    }
  }
  return absl::OkStatus();
}

// cluster: the cluster secret (auth/), its rotation and clock skew.
[[nodiscard]] absl::Status ParseCluster(const YAML::Node& n, ClusterAuthConfig* cluster) {
  absl::Status s;
  if (s = CheckKeys(n, "cluster", {"secret_file", "accepted_secret_files", "auth_max_skew_ms"});
      !s.ok()) {
    return s;
  }
  if (s = ReadString(n, "secret_file", "cluster", &cluster->secret_file); !s.ok()) return s;
  if (n["secret_file"].IsDefined() && cluster->secret_file.empty()) {
    return Invalid("cluster.secret_file", "must not be empty (remove the key to run open)",
                   n["secret_file"]);
  }
  if (s = ReadAcceptedSecretFiles(n, cluster); !s.ok()) return s;
  s = ReadInts(n, "cluster", {{"auth_max_skew_ms", &cluster->auth_max_skew_ms, 1000, 600000}});
  if (!s.ok()) return s;
  if (n["auth_max_skew_ms"].IsDefined() && cluster->secret_file.empty()) {
    return Invalid("cluster.auth_max_skew_ms",
                   "has no effect without cluster.secret_file (the cluster runs open)",
                   n["auth_max_skew_ms"]);
  }
  return absl::OkStatus();
}

[[nodiscard]] absl::Status ParseTop(const YAML::Node& root, ClusterConfig* c) {
  if (root.IsNull()) return Invalid("", "the file is empty", root);
  absl::Status s =
      CheckKeys(root, "",
                {"model", "chat_template", "router", "prefill_workers", "decode_workers", "engine",
                 "conditional", "slo", "kv", "shutdown_grace_s", "cluster", "planner"});
  if (!s.ok()) return s;
  if (s = ReadString(root, "model", "", &c->model); !s.ok()) return s;
  if (s = ReadString(root, "chat_template", "", &c->chat_template); !s.ok()) return s;
  if (!c->chat_template.empty() && std::find(kChatTemplateNames.begin(), kChatTemplateNames.end(),
                                             c->chat_template) == kChatTemplateNames.end()) {
    return Invalid("chat_template",
                   absl::StrCat("unknown chat format '", c->chat_template, "'; expected one of ",
                                absl::StrJoin(kChatTemplateNames, ", ")),
                   root["chat_template"]);
  }
  if (const YAML::Node n = root["router"];
      n.IsDefined() && !(s = ParseRouter(n, &c->router)).ok()) {
    return s;
  }
  if (const YAML::Node n = root["prefill_workers"];
      n.IsDefined() && !(s = ParseWorkers(n, "prefill_workers", &c->prefill_workers)).ok()) {
    return s;
  }
  if (const YAML::Node n = root["decode_workers"];
      n.IsDefined() && !(s = ParseWorkers(n, "decode_workers", &c->decode_workers)).ok()) {
    return s;
  }
  if (const YAML::Node n = root["engine"];
      n.IsDefined() && !(s = ParseEngine(n, &c->engine)).ok()) {
    return s;
  }
  std::optional<PlacementMode> placement;
  if (const YAML::Node n = root["conditional"];
      n.IsDefined() && !(s = ParseConditional(n, &c->conditional, &placement)).ok()) {
    return s;
  }
  if (const YAML::Node n = root["slo"]; n.IsDefined() && !(s = ParseSlo(n, &c->slo)).ok()) {
    return s;
  }
  if (s = ResolvePlacement(root, placement, c); !s.ok()) return s;
  if (const YAML::Node n = root["planner"];
      n.IsDefined() && !(s = ParsePlanner(n, &c->planner)).ok()) {
    return s;
  }
  if (c->planner.mode == PlannerMode::kSlo && !c->slo.any()) {
    return Invalid("planner.mode", "slo needs slo.ttft_ms or slo.tpot_ms", root["planner"]["mode"]);
  }
  if (const YAML::Node n = root["kv"]; n.IsDefined() && !(s = ParseKv(n, &c->kv)).ok()) {
    return s;
  }
  if (const YAML::Node n = root["cluster"];
      n.IsDefined() && !(s = ParseCluster(n, &c->cluster)).ok()) {
    return s;
  }
  return ReadInts(root, "", {{"shutdown_grace_s", &c->shutdown_grace_s, 0}});
}

// Every worker resolves to one KV dtype when KV moves between them (there
// are prefill workers); engine.gpu_memory_fraction only with a CUDA worker.
[[nodiscard]] absl::Status ValidateDevices(const ClusterConfig& c, bool gpu_memory_fraction_set) {
  std::vector<const WorkerConfig*> all;
  for (const auto* list : {&c.prefill_workers, &c.decode_workers}) {
    for (const WorkerConfig& w : *list) all.push_back(&w);
  }
  bool any_cuda = false;
  for (const WorkerConfig* w : all) any_cuda |= c.WorkerDevice(*w).is_cuda();
  if (gpu_memory_fraction_set && !any_cuda) {
    return absl::InvalidArgumentError(
        "engine.gpu_memory_fraction: set, but no worker runs on cuda:N (engine.device and "
        "every worker's device are cpu); remove the key");
  }
  // What the CPU backend would refuse at each worker's start
  // (backend::CreateBackend), refused here once, before any process runs.
  for (const WorkerConfig* w : all) {
    if (c.WorkerDevice(*w).is_cuda()) {
      // What the backend factory would refuse at a CUDA worker's start.
      if (c.engine.q8_matmul != model::Q8MatMul::kExact) {
        return absl::InvalidArgumentError(absl::StrCat(
            "engine.q8_matmul: ", model::Q8MatMulName(c.engine.q8_matmul), ", but ", w->name,
            " runs on ", c.WorkerDevice(*w).ToString(),
            ", whose backend multiplies Q8_0 weights only as exact (set engine.q8_matmul: "
            "exact, or run every worker on cpu)"));
      }
      continue;
    }
    if (!c.engine.batch_invariant) {
      return absl::InvalidArgumentError(absl::StrCat(
          "engine.batch_invariant: false, but ", w->name,
          " runs on cpu, whose backend is always batch-invariant (remove the key, or run "
          "every worker on cuda:N)"));
    }
    // What kvtransfer::SupportedTransports would refuse at that worker's start.
    if (!c.kv.transport.automatic && c.kv.transport.fixed != kvtransfer::KvTransport::kTcp) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv.transport: ", std::string(kvtransfer::KvTransportName(c.kv.transport.fixed)),
          ", but ", w->name, " runs on cpu, whose KV cache is in host memory (",
          std::string(kvtransfer::KvTransportName(c.kv.transport.fixed)),
          " moves GPU memory; set kv.transport: auto or tcp, or run that worker on cuda:N)"));
    }
  }
  if (c.prefill_workers.empty()) return absl::OkStatus();
  const WorkerConfig& first = *all.front();
  for (const WorkerConfig* w : all) {
    if (c.WorkerKvDtype(*w) == c.WorkerKvDtype(first)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "engine.kv_cache_dtype: prefill and decode workers must hold one KV dtype (KV moves "
        "between them), but ",
        first.name, " on ", c.WorkerDevice(first).ToString(), " holds ",
        kv::KvDtypeName(c.WorkerKvDtype(first)), " and ", w->name, " on ",
        c.WorkerDevice(*w).ToString(), " holds ", kv::KvDtypeName(c.WorkerKvDtype(*w)),
        "; set engine.kv_cache_dtype"));
  }
  return absl::OkStatus();
}

// Cross-field checks that need the whole file.
[[nodiscard]] absl::Status Validate(const ClusterConfig& c) {
  if (c.decode_workers.empty()) {
    return absl::InvalidArgumentError("decode_workers: at least one decode worker is required");
  }
  std::set<std::string> names = {c.router.name};
  for (const auto* list : {&c.prefill_workers, &c.decode_workers}) {
    for (const WorkerConfig& w : *list) {
      if (!names.insert(w.name).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "duplicate process name '", w.name, "': router and worker names must be unique"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClusterConfig> ParseClusterConfig(const std::string& yaml_text) {
  ClusterConfig config;
  bool gpu_memory_fraction_set = false;
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    if (absl::Status s = ParseTop(root, &config); !s.ok()) return s;
    gpu_memory_fraction_set =
        root["engine"].IsDefined() && root["engine"]["gpu_memory_fraction"].IsDefined();
  } catch (const YAML::Exception& e) {
    // e.msg is the bare message; e.mark is 0-based (null for some errors).
    std::string where;
    if (!e.mark.is_null()) {
      where = absl::StrCat(" at line ", e.mark.line + 1, ", column ", e.mark.column + 1);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("cluster config: YAML error", where, ": ", e.msg));
  }
  if (absl::Status s = Validate(config); !s.ok()) return s;
  if (absl::Status s = ValidateDevices(config, gpu_memory_fraction_set); !s.ok()) return s;
  return config;
}

namespace {

// "ttft 2000 ms, tpot 50 ms": the objectives set.
std::string SloValuesText(const SloConfig& slo) {
  std::vector<std::string> parts;
  if (slo.ttft_ms.has_value()) parts.push_back(absl::StrCat("ttft ", *slo.ttft_ms, " ms"));
  if (slo.tpot_ms.has_value()) parts.push_back(absl::StrCat("tpot ", *slo.tpot_ms, " ms"));
  return absl::StrJoin(parts, ", ");
}

}  // namespace

std::string PrefillPlacementSummary(const ClusterConfig& config) {
  const int32_t threshold = config.conditional.max_local_prefill_tokens;
  const bool unbounded = threshold == kUnboundedLocalPrefillTokens;
  const bool slo = config.conditional.placement == PlacementMode::kSlo;
  if (config.prefill_workers.empty()) {
    return unbounded ? std::string(
                           "prefill placement: colocated (no prefill workers, "
                           "conditional.max_local_prefill_tokens unbounded: every "
                           "prompt is prefilled by its decode worker)")
                     : absl::StrCat(
                           "prefill placement: colocated while no prefill worker "
                           "registers (none in the config; "
                           "conditional.max_local_prefill_tokens ",
                           threshold,
                           slo ? absl::StrCat(" and placement by predicted SLO miss (",
                                              SloValuesText(config.slo), ") apply")
                               : std::string(" applies"),
                           " to any that does)");
  }
  if (unbounded) {
    return absl::StrCat("warning: conditional.max_local_prefill_tokens is unbounded, so the ",
                        config.prefill_workers.size(),
                        " prefill workers get only requests with route_override REMOTE");
  }
  return absl::StrCat(
      "prefill placement: conditional (local when prompt tokens - cached prefix "
      "<= ",
      threshold, ", else ",
      slo ? absl::StrCat("local or a prefill worker by predicted SLO miss: ",
                         SloValuesText(config.slo))
          : std::string("a prefill worker"),
      ")");
}

namespace {

// Why `path` cannot be read as a file: the OS's reason (strerror: "No such
// file or directory", "Permission denied", "Is a directory"), "not a
// regular file" for a FIFO, socket or device; "" when it can. Opens
// without blocking (a FIFO would wait for a writer) and closes again.
std::string UnreadableFileReason(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return strerror(errno);
  struct stat st;
  std::string reason;
  if (fstat(fd, &st) != 0) {
    reason = strerror(errno);
  } else if (S_ISDIR(st.st_mode)) {
    reason = strerror(EISDIR);
  } else if (!S_ISREG(st.st_mode)) {
    reason = "not a regular file";
  }
  close(fd);
  return reason;
}

}  // namespace

absl::StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path) {
  if (const std::string reason = UnreadableFileReason(path); !reason.empty()) {
    return absl::NotFoundError(absl::StrCat("cannot read cluster config '", path, "': ", reason));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::NotFoundError(
        absl::StrCat("cannot read cluster config '", path, "': ", strerror(errno)));
  }
  absl::StatusOr<ClusterConfig> config = ParseClusterConfig(text.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::StatusOr<std::string> ResolveModelPath(const std::string& flag_value,
                                             const ClusterConfig& config) {
  // An explicit choice (flag, environment, config) must exist: falling
  // through to another model would serve something the user did not ask for.
  const char* env = std::getenv("TANDEM_MODEL");
  const std::pair<std::string, std::string> explicit_choices[] = {
      {flag_value, "--model"},
      {env != nullptr ? env : "", "$TANDEM_MODEL"},
      {config.model, "model (config)"}};
  for (const auto& [path, source] : explicit_choices) {
    if (path.empty()) continue;
    const std::string reason = UnreadableFileReason(path);
    if (reason.empty()) return path;
    return absl::NotFoundError(absl::StrCat(source, " ", path, ": cannot read model file: ", reason,
                                            " (pass --model PATH)"));
  }
  const std::string defaults[] = {"models/stories260K.gguf", "../shared/models/stories260K.gguf"};
  for (const std::string& path : defaults) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec)) return path;
  }
  return absl::NotFoundError(
      absl::StrCat("no model file found: pass --model PATH (or set $TANDEM_MODEL); tried ",
                   absl::StrJoin(defaults, ", ")));
}

}  // namespace tandem
