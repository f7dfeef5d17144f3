// tandem-router: flags -> settings (router_settings.h) -> prologue
// (cluster credential, model: tokenizer, context length, chat template) ->
// API keys (router.api_keys_file, re-read while serving) -> gRPC server
// (Generation, Registry, health) -> metrics listener (router.metrics_listen:
// /metrics, no key) -> HTTP front door (router.http_listen: OpenAI API,
// /metrics behind the keys) -> serve until drained (common/server/drain.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics_server.h"
#include "common/server/drain.h"
#include "common/server/flags.h"
#include "common/server/log.h"
#include "common/server/prologue.h"
#include "common/server/server_util.h"
#include "router/api_keys_reloader.h"
#include "router/openai/openai_frontend.h"
#include "router/router_service.h"
#include "router/router_settings.h"
#include "worker/worker_engine.h"

namespace tandem::router {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  return 1;
}

void PrintUsage() {
  std::printf(
      "usage: tandem-router [flags]\n"
      "Routes generation requests (gRPC, and OpenAI-style HTTP with router.http_listen)\n"
      "to the prefill and decode workers that register with it (docs/operations.md).\n\n"
      "  --config PATH          cluster YAML (default deploy/local/cluster.yaml)\n"
      "  --name NAME            the router's name (default: router.name)\n"
      "  --model PATH           GGUF model file, for its tokenizer (default: the config's model)\n"
      "  --listen HOST:PORT     the gRPC listener (default: router.listen)\n"
      "  --advertise HOST[:PORT]  the address peers dial (default: router.advertise)\n"
      "  --http-listen HOST:PORT  the HTTP API listener (default: router.http_listen)\n"
      "  --metrics-listen HOST:PORT  the Prometheus /metrics listener (default:\n"
      "                         router.metrics_listen)\n"
      "  --help                 this text\n");
}

[[nodiscard]] absl::StatusOr<RouterSettings> LoadSettings(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv, RouterFlagNames());
  if (!flags.ok()) return flags.status();
  auto config = LoadClusterConfig(FlagOr(*flags, "config", kDefaultConfigPath));
  if (!config.ok()) return config.status();
  return ResolveRouterSettings(*flags, *std::move(config));
}

// The chat template of the model. An unrecognised one is no start-up
// error: prompt requests are served, and chat requests get
// FAILED_PRECONDITION with the line logged here.
[[nodiscard]] absl::StatusOr<ChatTemplate> LoadChatTemplate(const ClusterConfig& config,
                                                            const ModelBundle& bundle) {
  auto chat_template = ChatTemplate::FromGguf(*bundle.file, config.chat_template);
  if (!chat_template.ok()) return chat_template.status();
  if (chat_template->status().ok()) {
    rpc::Log(absl::StrCat("chat format: ", chat_template->format_name()));
  } else {
    rpc::Log(absl::StrCat("chat format: none (", chat_template->status().message(), ")"));
  }
  return chat_template;
}

void LogPeerAuthentication(const auth::ClusterAuth& auth) {
  rpc::Log(auth.open()
               ? "peer authentication: open (no cluster.secret_file)"
               : absl::StrCat("peer authentication: HMAC-SHA256 (cluster.secret_file",
                              auth.accepted_secrets() == 0
                                  ? ""
                                  : absl::StrCat("; also accepting the ", auth.accepted_secrets(),
                                                 " secret(s) of cluster.accepted_secret_files"),
                              ")"));
}

// The registry's options from the config, logging the routing policy and
// the KV layouts the workers must have (ExpectedKvLayout: the workers'
// own function).
RegistryOptions MakeRegistryOptions(const ClusterConfig& config, const Prologue& prologue) {
  RegistryOptions options;
  options.model_fingerprint = prologue.bundle->fingerprint;
  options.poll_interval_ms = config.router.poll_interval_ms;
  options.unhealthy_after_missed_polls = config.router.unhealthy_after_missed_polls;
  options.rpc_timeout_ms = config.router.rpc_timeout_ms;
  options.drop_after_ms = config.router.drop_after_ms;
  options.routing.policy = config.router.policy;
  options.routing.weights = config.router.kv_aware;
  options.routing.max_num_seqs = config.engine.max_num_seqs;
  options.routing.max_num_batched_tokens = config.engine.max_num_batched_tokens;
  options.routing.prefill_by_finish_time = config.conditional.placement == PlacementMode::kSlo;
  const KvAwareWeights& w = options.routing.weights;
  rpc::Log(options.routing.policy == RouterPolicy::kKvAware
               ? absl::StrCat("routing policy: kv_aware (prefix_weight ", w.prefix_weight,
                              ", free_blocks_weight ", w.free_blocks_weight, ", load_weight ",
                              w.load_weight, ", prefill_queue_weight ", w.prefill_queue_weight, ")")
               : absl::StrCat("routing policy: ", RouterPolicyName(options.routing.policy)));
  options.auth = prologue.auth.get();
  rpc::Log(PrefillPlacementSummary(config));
  options.kv_layout_id = ExpectedKvLayout(config, *prologue.bundle, WorkerConfig{}).LayoutId();
  rpc::Log(absl::StrCat("expected KV layout: ", options.kv_layout_id));
  for (const auto* list : {&config.prefill_workers, &config.decode_workers}) {
    for (const WorkerConfig& wc : *list) {
      options.kv_layout_ids[wc.name] = ExpectedKvLayout(config, *prologue.bundle, wc).LayoutId();
      if (options.kv_layout_ids[wc.name] != options.kv_layout_id) {
        rpc::Log(absl::StrCat("expected KV layout of ", wc.name, " (",
                              config.WorkerDevice(wc).ToString(),
                              "): ", options.kv_layout_ids[wc.name]));
      }
    }
  }
  return options;
}

// router.api_keys_file into `service`, re-read by the returned reloader
// (null without a keys file).
[[nodiscard]] absl::StatusOr<std::unique_ptr<ApiKeysReloader>> StartApiKeys(
    const ClusterConfig& config, RouterService* service) {
  const std::string& path = config.router.api_keys_file;
  if (path.empty()) {
    rpc::Log("API keys: none (Generation is open)");
    return nullptr;
  }
  std::string keys_text;
  auto keys = LoadApiKeys(path, &keys_text);
  if (!keys.ok()) {
    return absl::Status(keys.status().code(),
                        absl::StrCat("router.api_keys_file: ", keys.status().message()));
  }
  rpc::Log(absl::StrCat("API keys: ", keys->size(), " from ", path,
                        " (limits per router replica; re-read every ",
                        absl::FormatDuration(kApiKeysReloadInterval), ")"));
  auto table = std::make_unique<ApiKeys>(*keys);
  auto reloader = std::make_unique<ApiKeysReloader>(table.get(), path, std::move(keys_text),
                                                    [](absl::string_view line) { rpc::Log(line); });
  service->set_api_keys(std::move(table));
  reloader->Start();
  return reloader;
}

// The metrics listener Prometheus scrapes (no key, as the workers'
// metrics_listen); the client port's /metrics needs a key when keys are
// configured. Null when router.metrics_listen is unset.
[[nodiscard]] absl::StatusOr<std::unique_ptr<http::HttpServer>> StartMetrics(
    const RouterSettings& s, RouterService* service) {
  if (!s.metrics_listen.has_value()) return nullptr;
  auto server = std::make_unique<http::HttpServer>(http::HttpServer::Options{});
  metrics::ServeMetrics(server.get(), {service->metrics().registry()});
  absl::StatusOr<int> bound = server->Start(s.metrics_listen->host, s.metrics_listen->port);
  if (!bound.ok()) {
    return absl::Status(bound.status().code(),
                        absl::StrCat(s.metrics_listen_key, ": ", bound.status().message()));
  }
  rpc::Log(absl::StrCat("metrics: serving http://",
                        HostPort{s.metrics_listen->host, *bound}.ToString(), "/metrics"));
  std::printf("TANDEM_METRICS_LISTENING %s:%d\n", s.metrics_listen->host.c_str(), *bound);
  return server;
}

// The HTTP front door, calling the Generation service in-process. Null
// when router.http_listen is unset.
[[nodiscard]] absl::StatusOr<std::unique_ptr<openai::OpenAiFrontend>> StartFrontend(
    const RouterSettings& s, const Prologue& prologue, grpc::Server* server,
    RouterService* service) {
  if (!s.http_listen.has_value()) return nullptr;
  const model::LlamaConfig& model_config = prologue.bundle->model->config();
  openai::OpenAiFrontend::Options options;
  options.limits.served_model_name =
      s.config.router.served_model_name.empty()
          ? std::filesystem::path(prologue.model_path).stem().string()
          : s.config.router.served_model_name;
  options.limits.context_length = model_config.context_length;
  options.limits.vocab_size = model_config.vocab_size;
  options.http.max_streams = s.config.router.http_max_streams;
  options.http.max_body_bytes = s.config.router.http_max_body_bytes;
  options.http.read_timeout_ms = s.config.router.http_read_timeout_ms;
  const tokenizer::Tokenizer* tok = prologue.bundle->tokenizer.get();
  openai::OpenAiFrontend::Router hooks;
  hooks.channel = server->InProcessChannel(grpc::ChannelArguments());
  hooks.token_bytes = [tok](int32_t id) { return tok->TokenBytes(id); };
  hooks.prompt_tokens = [service](const v1::GenerateRequest& r) {
    return service->PromptTokens(r);
  };
  hooks.not_ready = [service]() -> std::string {
    if (!service->accepting()) return "shutting down";
    return service->registry().CanServe() ? "" : "no healthy decode worker";
  };
  hooks.authenticate = [service](const std::string* a) { return service->AuthenticateHeader(a); };
  hooks.refused = [service](absl::StatusCode code) { service->metrics().RequestRefused(code); };
  auto frontend = std::make_unique<openai::OpenAiFrontend>(options, std::move(hooks));
  frontend->HandleBehindKeys("GET", "/metrics",
                             metrics::MetricsHandler({service->metrics().registry()}));
  auto port = frontend->Start(s.http_listen->host, s.http_listen->port);
  if (!port.ok()) {
    return absl::Status(port.status().code(),
                        absl::StrCat(s.http_listen_key, ": ", port.status().message()));
  }
  rpc::Log(absl::StrCat("HTTP (OpenAI API, /metrics) on ", s.http_listen->host, ":", *port,
                        ", model \"", options.limits.served_model_name, "\""));
  std::printf("TANDEM_HTTP_LISTENING %s:%d\n", s.http_listen->host.c_str(), *port);
  return frontend;
}

// The drain after the signal: readiness NOT_SERVING, no new requests; then
// the HTTP streams still open, the listeners and the gRPC server end, and
// the request threads Shutdown cancelled get up to 2 s to see it before the
// service they use is destroyed.
rpc::DrainPlan MakeDrainPlan(const RouterSettings& s, RouterService* service,
                             absl::Mutex* health_mu, grpc::HealthCheckServiceInterface** health,
                             grpc::Server* server, openai::OpenAiFrontend* frontend,
                             http::HttpServer* metrics) {
  rpc::DrainPlan plan;
  plan.grace_s = s.config.shutdown_grace_s;
  plan.stop_accepting = [=, grace = plan.grace_s](int sig) {
    rpc::Log(absl::StrCat("signal ", sig, ": draining for up to ", grace, " s"));
    {
      absl::MutexLock lock(health_mu);
      (*health)->SetServingStatus("", false);
      *health = nullptr;
    }
    service->StopAccepting();
    service->StopPlanner();  // no role change while the router drains
  };
  plan.running = [service] { return static_cast<int64_t>(service->running_requests()); };
  plan.shut_down = [=] {
    if (frontend != nullptr) frontend->Stop();
    if (metrics != nullptr) metrics->Stop();
    server->Shutdown(rpc::DeadlineFromNow(1000));
    rpc::WaitUntil(absl::Seconds(2), absl::Milliseconds(10),
                   [service] { return service->running_requests() == 0; });
  };
  return plan;
}

int Run(const RouterSettings& s, const Prologue& prologue) {
  auto chat_template = LoadChatTemplate(s.config, *prologue.bundle);
  if (!chat_template.ok()) return Fail(std::string(chat_template.status().message()));
  // Logged once start-up errors (one stderr line each) are behind us.
  LogPeerAuthentication(*prologue.auth);
  const RegistryOptions options = MakeRegistryOptions(s.config, prologue);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::HealthCheckServiceInterface* health = nullptr;
  absl::Mutex health_mu;
  Admission::Options admission;
  admission.max_inflight = s.config.router.max_inflight;
  admission.max_queued = s.config.router.max_queued;
  RouterService service(
      prologue.bundle.get(), *std::move(chat_template), options, admission, s.name,
      [&](bool serving) {
        absl::MutexLock lock(&health_mu);
        rpc::Log(serving ? "cluster can serve: SERVING" : "cluster cannot serve: NOT_SERVING");
        if (health != nullptr) health->SetServingStatus("", serving);
      });
  service.set_failover(s.config.router.max_migrations, s.config.router.rpc_timeout_ms);
  service.set_objectives(s.config.slo, s.config.conditional.placement);
  service.StartRoleControl(s.config);
  // Declared after `service`, so its thread stops before the keys go.
  auto keys_reloader = StartApiKeys(s.config, &service);
  if (!keys_reloader.ok()) return Fail(std::string(keys_reloader.status().message()));
  grpc::ServerBuilder builder;
  // Requests as large as the HTTP front door takes (its JSON body at most
  // router.http_max_body_bytes; the GenerateRequest is no larger), or
  // gRPC's default 4 MiB.
  builder.SetMaxReceiveMessageSize(
      std::max(4 << 20, s.config.router.http_max_body_bytes + (64 << 10)));
  builder.RegisterService(&service);
  builder.RegisterService(service.registry_service());
  int port = 0;
  auto server = rpc::BuildAndStart(builder, s.listen, s.listen_key, &port);
  if (!server.ok()) return Fail(std::string(server.status().message()));
  // Checked by ResolveRouterSettings: a wildcard listen has its advertise.
  const HostPort advertised =
      *AdvertisedAddress(s.listen, port, s.advertise, s.listen_key, s.advertise_key);
  service.set_address(advertised.ToString());
  {
    absl::MutexLock lock(&health_mu);
    // "" is readiness (the cluster can serve); liveness stays SERVING
    // until the process exits (rpc::kLivenessHealthService).
    health = (*server)->GetHealthCheckService();
    health->SetServingStatus(rpc::kLivenessHealthService, true);
    health->SetServingStatus("", service.registry().CanServe());
  }
  auto metrics_server = StartMetrics(s, &service);
  if (!metrics_server.ok()) return Fail(std::string(metrics_server.status().message()));
  auto frontend = StartFrontend(s, prologue, server->get(), &service);
  if (!frontend.ok()) return Fail(std::string(frontend.status().message()));
  rpc::AnnounceListening(advertised.host, advertised.port);
  rpc::ServeUntilDrained(MakeDrainPlan(s, &service, &health_mu, &health, server->get(),
                                       frontend->get(), metrics_server->get()));
  return 0;
}

}  // namespace
}  // namespace tandem::router

int main(int argc, char** argv) {
  using namespace tandem;
  if (HelpRequested(argc, argv)) {
    router::PrintUsage();
    return 0;
  }
  rpc::BlockTerminationSignals();
  absl::StatusOr<router::RouterSettings> settings = router::LoadSettings(argc, argv);
  if (!settings.ok()) return router::Fail(std::string(settings.status().message()));
  rpc::SetLogComponent(settings->name);
  // The router tokenizes; it runs no forward pass (no F32 panel packing).
  PrologueOptions options;
  options.cpu_forward = false;
  absl::StatusOr<Prologue> prologue = RunPrologue(settings->config, settings->model_flag, options);
  if (!prologue.ok()) return router::Fail(std::string(prologue.status().message()));
  return router::Run(*settings, *prologue);
}
