#include "tools/status.h"

#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tools/cli_args.h"
#include "tools/router_client.h"

namespace tandem::cli {
namespace {

constexpr char kUsage[] =
    "usage: tandem status [--router H:P] [--api-key KEY] [--check-idle] [--json] [--timeout-ms "
    "MS]\n";

}  // namespace

absl::StatusOr<StatusOptions> ParseStatusArgs(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(
      args, {{"router"}, {"api-key"}, {"check-idle", false}, {"json", false}, {"timeout-ms"}});
  if (!parsed.ok()) return parsed.status();
  if (!parsed->positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parsed->positional()[0], "'"));
  }
  StatusOptions o;
  if (absl::Status s = ReadRouterFlags(*parsed, &o.router, &o.api_key); !s.ok()) return s;
  o.check_idle = parsed->Has("check-idle");
  o.json = parsed->Has("json");
  absl::StatusOr<int64_t> timeout_ms = ReadTimeoutMs(*parsed, o.timeout_ms);
  if (!timeout_ms.ok()) return timeout_ms.status();
  o.timeout_ms = *timeout_ms;
  return o;
}

std::string RoleName(tandem::v1::WorkerRole role) {
  switch (role) {
    case tandem::v1::ROLE_ROUTER:
      return "router";
    case tandem::v1::ROLE_PREFILL:
      return "prefill";
    case tandem::v1::ROLE_DECODE:
      return "decode";
    case tandem::v1::ROLE_UNSPECIFIED:
    case tandem::v1::WorkerRole_INT_MIN_SENTINEL_DO_NOT_USE_:
    case tandem::v1::WorkerRole_INT_MAX_SENTINEL_DO_NOT_USE_:
      break;
  }
  return "unspecified";
}

namespace {
// " kv_by_transport=cuda_ipc:0,nccl:0,tcp:1280" (names sorted), or ""
// for a process that reports none (the router, an older worker).
std::string KvByTransport(const tandem::v1::WorkerStatus& s) {
  if (s.kv_bytes_by_transport().empty()) return "";
  const std::map<std::string, uint64_t> sorted(s.kv_bytes_by_transport().begin(),
                                               s.kv_bytes_by_transport().end());
  return absl::StrCat(" kv_by_transport=", absl::StrJoin(sorted, ",", absl::PairFormatter(":")));
}
}  // namespace

std::string FormatStatusLine(const tandem::v1::WorkerStatus& s) {
  if (s.unreachable()) {
    return absl::StrCat(s.name(), " ", RoleName(s.role()), " ",
                        s.address().empty() ? "-" : s.address(), " unreachable ",
                        s.healthy() ? "healthy" : "unhealthy",
                        " (no answer to the router's GetStatus: its load is unknown)");
  }
  return absl::StrCat(
      s.name(), " ", RoleName(s.role()), " ", s.address().empty() ? "-" : s.address(),
      s.kv_endpoint().empty() ? "" : absl::StrCat(" kv=", s.kv_endpoint()),
      s.ready() ? " ready" : " not-ready", s.healthy() ? " healthy" : " unhealthy",
      " running=", s.running_requests(),
      s.role() == tandem::v1::ROLE_ROUTER ? absl::StrCat(" queued=", s.queued_requests()) : "",
      " kv_blocks=", s.kv_blocks_in_use(), "/", s.kv_blocks_total(),
      " cached=", s.kv_blocks_cached(),
      // The router's prefix index for this worker (from its KV events).
      s.role() == tandem::v1::ROLE_ROUTER ? "" : absl::StrCat(" kv_index=", s.kv_index_blocks()),
      " transfers=", s.transfers_in_flight(), " prefill_tokens=", s.prefill_tokens_computed_total(),
      " decode_tokens=", s.decode_tokens_total(), " kv_sent=", s.kv_bytes_sent_total(),
      " kv_received=", s.kv_bytes_received_total(), KvByTransport(s),
      " max_batch=", s.max_decode_batch_size(), " preemptions=", s.preemptions_total(),
      s.kv_layout_id().empty() ? "" : absl::StrCat(" kv_layout=", s.kv_layout_id()),
      s.bit_exact_class().empty() ? "" : absl::StrCat(" bit_exact=", s.bit_exact_class()));
}

nlohmann::ordered_json WorkerStatusToJson(const tandem::v1::WorkerStatus& s) {
  nlohmann::ordered_json j = {
      {"name", s.name()},
      {"role", RoleName(s.role())},
      {"address", s.address()},
      {"kv_endpoint", s.kv_endpoint()},
      {"ready", s.ready()},
      {"healthy", s.healthy()},
      {"unreachable", s.unreachable()},
      {"running_requests", s.running_requests()},
      {"queued_requests", s.queued_requests()},
      {"kv_blocks_in_use", s.kv_blocks_in_use()},
      {"kv_blocks_total", s.kv_blocks_total()},
      {"kv_blocks_cached", s.kv_blocks_cached()},
      {"kv_index_blocks", s.kv_index_blocks()},
      {"transfers_in_flight", s.transfers_in_flight()},
      {"prefill_tokens_computed_total", s.prefill_tokens_computed_total()},
      {"kv_bytes_sent_total", s.kv_bytes_sent_total()},
      {"kv_bytes_received_total", s.kv_bytes_received_total()},
      {"kv_bytes_by_transport", std::map<std::string, uint64_t>(s.kv_bytes_by_transport().begin(),
                                                                s.kv_bytes_by_transport().end())},
      {"decode_tokens_total", s.decode_tokens_total()},
      {"max_decode_batch_size", s.max_decode_batch_size()},
      {"preemptions_total", s.preemptions_total()},
      {"model_fingerprint", s.model_fingerprint()},
      {"kv_layout_id", s.kv_layout_id()},
      {"bit_exact_class", s.bit_exact_class()}};
  // The counters /metrics exports, under their WorkerStatus names.
  if (s.role() == tandem::v1::ROLE_ROUTER) {
    j["router_requests_total"] = s.router_requests_total();
    j["router_request_errors_total"] = s.router_request_errors_total();
    j["router_prompt_tokens_total"] = s.router_prompt_tokens_total();
    j["router_generation_tokens_total"] = s.router_generation_tokens_total();
    j["router_prompt_tokens_cached_total"] = s.router_prompt_tokens_cached_total();
  } else {
    j["prompt_tokens_total"] = s.prompt_tokens_total();
    j["prompt_tokens_cached_total"] = s.prompt_tokens_cached_total();
    j["generation_tokens_total"] = s.generation_tokens_total();
    j["prefix_cache_queried_tokens_total"] = s.prefix_cache_queried_tokens_total();
    j["prefix_cache_hit_tokens_total"] = s.prefix_cache_hit_tokens_total();
    j["engine_steps_total"] = s.engine_steps_total();
    j["kv_transfers_sent_total"] = s.kv_transfers_sent_total();
    j["kv_transfers_received_total"] = s.kv_transfers_received_total();
    j["kv_transfer_seconds_sent_total"] = s.kv_transfer_seconds_sent_total();
    j["kv_transfer_seconds_received_total"] = s.kv_transfer_seconds_received_total();
    j["step_model"] =
        s.has_step_model() ? StepModelToJson(s.step_model()) : nlohmann::ordered_json(nullptr);
  }
  return j;
}

nlohmann::ordered_json StepModelToJson(const tandem::v1::StepModel& m) {
  return {{"samples", m.samples()},
          {"base_ms", m.base_ms()},
          {"prefill_ms_per_token", m.prefill_ms_per_token()},
          {"prefill_ms_per_kilo_pair", m.prefill_ms_per_kilo_pair()},
          {"decode_ms_per_seq", m.decode_ms_per_seq()},
          {"decode_ms_per_kilo_context", m.decode_ms_per_kilo_context()},
          {"prefill_tokens_per_s", m.prefill_tokens_per_s()},
          {"decode_step_ms", m.decode_step_ms()},
          {"mean_abs_error_ms", m.mean_abs_error_ms()},
          {"kv_link_bytes_per_s", std::map<std::string, double>(m.kv_link_bytes_per_s().begin(),
                                                                m.kv_link_bytes_per_s().end())}};
}

namespace {

// A number to 3 significant digits ("1.2", "0.05", "1.23e+03").
std::string Sig3(double value) { return absl::StrFormat("%.3g", value); }

// Bytes/s in the largest unit that keeps it >= 1: "1.2 GB/s", "850 MB/s".
std::string ByteRate(double bytes_per_s) {
  constexpr std::pair<double, const char*> kUnits[] = {{1e9, "GB/s"}, {1e6, "MB/s"}, {1e3, "kB/s"}};
  for (const auto& [scale, unit] : kUnits) {
    if (bytes_per_s >= scale) return absl::StrCat(Sig3(bytes_per_s / scale), " ", unit);
  }
  return absl::StrCat(Sig3(bytes_per_s), " B/s");
}

}  // namespace

std::string FormatStepModelLine(const tandem::v1::StepModel& m) {
  std::string line = absl::StrCat(
      "  step model: ", Sig3(m.base_ms()), " ms + ", Sig3(m.prefill_ms_per_token()),
      " ms/prefill token + ", Sig3(m.prefill_ms_per_kilo_pair()), " ms/1k prefill pairs + ",
      Sig3(m.decode_ms_per_seq()), " ms/decode seq + ", Sig3(m.decode_ms_per_kilo_context()),
      " ms/1k decode context; prefill ", absl::StrFormat("%.0f", m.prefill_tokens_per_s()),
      " tok/s, decode step ", Sig3(m.decode_step_ms()), " ms, error ", Sig3(m.mean_abs_error_ms()),
      " ms, n=", m.samples());
  if (m.kv_link_bytes_per_s().empty()) return line;
  const std::map<std::string, double> links(m.kv_link_bytes_per_s().begin(),
                                            m.kv_link_bytes_per_s().end());
  std::vector<std::string> parts;
  for (const auto& [peer, rate] : links) parts.push_back(absl::StrCat(peer, " ", ByteRate(rate)));
  absl::StrAppend(&line, "; kv link ", absl::StrJoin(parts, ", "));
  return line;
}

std::string FormatSloLine(const tandem::v1::ClusterStatus& status) {
  std::vector<std::string> objectives;
  if (status.slo().ttft_ms() > 0) {
    objectives.push_back(absl::StrCat("ttft ", status.slo().ttft_ms(), " ms"));
  }
  if (status.slo().tpot_ms() > 0) {
    objectives.push_back(absl::StrCat("tpot ", status.slo().tpot_ms(), " ms"));
  }
  return absl::StrCat(
      "slo: ", objectives.empty() ? "none" : absl::StrJoin(objectives, ", "), "; placement: ",
      status.placement().empty() ? std::string("unknown (the router does not report it)")
                                 : status.placement());
}

std::string FormatClusterStatus(const tandem::v1::ClusterStatus& status) {
  std::string out = absl::StrCat(FormatStatusLine(status.router()), "\n");
  for (const tandem::v1::WorkerStatus& w : status.workers()) {
    absl::StrAppend(&out, FormatStatusLine(w), "\n");
    if (w.has_step_model()) absl::StrAppend(&out, FormatStepModelLine(w.step_model()), "\n");
  }
  absl::StrAppend(&out, FormatSloLine(status), "\n");
  // A planner that runs is shown (mode off says nothing new).
  const std::string& planner = status.planner().mode();
  if (!planner.empty() && planner != "off") {
    absl::StrAppend(&out, FormatPlannerLine(status.planner()), "\n");
  }
  absl::StrAppend(&out, FormatClusterAuthLine(status), "\n");
  for (const tandem::v1::ApiKeyUsage& u : status.api_keys()) {
    absl::StrAppend(&out, FormatApiKeyLine(u), "\n");
  }
  return out;
}

std::string FormatApiKeyLine(const tandem::v1::ApiKeyUsage& u) {
  // A limit of 0 is no limit; so is the bucket of a key without one.
  auto limit = [](uint64_t n) { return n == 0 ? std::string("unlimited") : absl::StrCat(n); };
  const bool tokens_limited = u.tokens_per_minute() != 0;
  return absl::StrCat(
      "api_key ", u.name(), " requests=", u.requests(), " refused=", u.refused(),
      " prompt_tokens=", u.prompt_tokens(), " generated_tokens=", u.generated_tokens(),
      " in_flight=", u.in_flight(), " tokens_available=",
      tokens_limited ? absl::StrCat(u.tokens_available()) : std::string("unlimited"),
      " tokens_per_minute=", limit(u.tokens_per_minute()),
      " max_concurrent_requests=", limit(u.max_concurrent_requests()));
}

std::string FormatPlannerLine(const tandem::v1::PlannerStatus& p) {
  if (p.mode() == "off" || p.mode().empty()) return "planner: off";
  std::string line = absl::StrCat(
      "planner: ", p.mode(), " every ", p.interval_s(), " s, cooldown ", p.cooldown_s(),
      " s; wants ", p.desired_prefill_workers(), " prefill + ", p.desired_decode_workers(),
      " decode", p.flip_roles() ? "" : " (export only)", "; flips=", p.role_changes_total());
  if (p.seconds_since_last_flip() >= 0) {
    absl::StrAppend(&line,
                    absl::StrFormat("; last role change %.1f s ago", p.seconds_since_last_flip()));
  }
  if (!p.last_decision().empty()) absl::StrAppend(&line, "; last: ", p.last_decision());
  return line;
}

std::string FormatClusterAuthLine(const tandem::v1::ClusterStatus& status) {
  if (status.cluster_auth() == "hmac-sha256") return "cluster: authenticated (HMAC-SHA256)";
  if (status.cluster_auth() == "open") {
    return "cluster: open (no cluster.secret_file: any host that reaches a worker port can "
           "register or call it)";
  }
  return "cluster: authentication unknown (the router does not report it)";
}

nlohmann::ordered_json ClusterStatusToJson(const tandem::v1::ClusterStatus& status) {
  nlohmann::ordered_json j;
  j["can_serve"] = status.can_serve();
  j["cluster_auth"] = status.cluster_auth();
  // 0 is "not set" in the proto; null says so in JSON.
  auto objective = [](double ms) { return ms > 0 ? nlohmann::ordered_json(ms) : nullptr; };
  j["slo"] = {{"ttft_ms", objective(status.slo().ttft_ms())},
              {"tpot_ms", objective(status.slo().tpot_ms())}};
  j["placement"] = status.placement();
  if (status.has_planner()) {
    const tandem::v1::PlannerStatus& p = status.planner();
    j["planner"] = {
        {"mode", p.mode()},
        {"flip_roles", p.flip_roles()},
        {"interval_s", p.interval_s()},
        {"cooldown_s", p.cooldown_s()},
        {"desired_prefill_workers", p.desired_prefill_workers()},
        {"desired_decode_workers", p.desired_decode_workers()},
        {"role_changes_total", p.role_changes_total()},
        {"seconds_since_last_flip", p.seconds_since_last_flip() < 0
                                        ? nlohmann::ordered_json(nullptr)
                                        : nlohmann::ordered_json(p.seconds_since_last_flip())},
        {"last_decision", p.last_decision()}};
  } else {
    j["planner"] = nullptr;
  }
  j["router"] = WorkerStatusToJson(status.router());
  j["workers"] = nlohmann::ordered_json::array();
  for (const tandem::v1::WorkerStatus& w : status.workers()) {
    j["workers"].push_back(WorkerStatusToJson(w));
  }
  j["api_keys_required"] = status.api_keys_required();
  j["api_keys"] = nlohmann::ordered_json::array();
  for (const tandem::v1::ApiKeyUsage& u : status.api_keys()) {
    j["api_keys"].push_back({{"name", u.name()},
                             {"requests", u.requests()},
                             {"refused", u.refused()},
                             {"prompt_tokens", u.prompt_tokens()},
                             {"generated_tokens", u.generated_tokens()},
                             {"in_flight", u.in_flight()},
                             {"tokens_available", u.tokens_available()},
                             {"tokens_per_minute", u.tokens_per_minute()},
                             {"max_concurrent_requests", u.max_concurrent_requests()}});
  }
  return j;
}

Idleness CheckIdleness(const tandem::v1::ClusterStatus& status) {
  bool unknown = false;
  for (const tandem::v1::WorkerStatus& w : status.workers()) {
    if (w.unreachable()) {
      unknown = true;
    } else if (w.kv_blocks_in_use() > 0 || w.transfers_in_flight() > 0 ||
               w.running_requests() > 0) {
      return Idleness::kBusy;
    }
  }
  return unknown ? Idleness::kUnknown : Idleness::kIdle;
}

int StatusExitCode(const tandem::v1::ClusterStatus& status, bool check_idle) {
  if (check_idle) {
    // What a drain waits for comes first: work in use (or a worker that may
    // hold some) matters whether or not the cluster can serve.
    switch (CheckIdleness(status)) {
      case Idleness::kBusy:
        return kExitBusy;
      case Idleness::kUnknown:
        return kExitIdleUnknown;
      case Idleness::kIdle:
        break;
    }
  }
  return status.can_serve() ? 0 : 1;
}

int RunStatus(const std::vector<std::string>& args) {
  absl::StatusOr<StatusOptions> options = ParseStatusArgs(args);
  if (!options.ok()) {
    std::cerr << "tandem status: " << options.status().message() << "\n" << kUsage;
    return 2;
  }
  std::unique_ptr<tandem::v1::Generation::Stub> stub = MakeGenerationStub(options->router);
  grpc::ClientContext context;
  SetApiKey(&context, options->api_key);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(options->timeout_ms));
  tandem::v1::ClusterStatus status;
  const grpc::Status rpc = stub->GetStatus(&context, tandem::v1::GetStatusRequest(), &status);
  if (!rpc.ok()) {
    std::cerr << GrpcErrorLine(rpc) << "\n";
    return 1;
  }
  if (options->json) {
    std::printf("%s\n", ClusterStatusToJson(status)
                            .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
                            .c_str());
  } else {
    std::fputs(FormatClusterStatus(status).c_str(), stdout);
  }
  std::fflush(stdout);
  const int code = StatusExitCode(status, options->check_idle);
  if (!status.can_serve()) std::cerr << "tandem: the cluster cannot serve\n";
  if (code == kExitIdleUnknown) {
    std::vector<std::string> unreachable;
    for (const tandem::v1::WorkerStatus& w : status.workers()) {
      if (w.unreachable()) unreachable.push_back(w.name());
    }
    std::cerr << "tandem: idle unknown: " << absl::StrJoin(unreachable, ", ")
              << " did not answer the router (its KV blocks and requests are unknown)\n";
  }
  return code;
}

}  // namespace tandem::cli
