// tandem-router: flags -> config -> model (tokenizer, context length, chat
// template) -> API keys (router.api_keys_file, re-read while serving) -> gRPC
// server (Generation, Registry, health) -> metrics listener
// (router.metrics_listen: /metrics, no key) -> HTTP front door
// (router.http_listen: OpenAI API, /metrics behind the keys) -> wait for
// SIGTERM -> drain.
#include <cstdio>
#include <filesystem>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/server/log.h"
#include "common/server/server_util.h"
#include "common/server/worker_engine.h"
#include "common/server/worker_main.h"
#include "common/metrics/metrics_server.h"
#include "router/api_keys_reloader.h"
#include "router/openai/openai_frontend.h"
#include "router/router_service.h"

namespace {
int Fail(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  if (HelpRequested(argc, argv)) {
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
    return 0;
  }
  rpc::BlockTerminationSignals();
  auto flags = ParseFlags(argc, argv, {"config", "name", "model", "listen", "advertise",
                                       "http-listen", "metrics-listen"});
  if (!flags.ok()) return Fail(std::string(flags.status().message()));
  const std::string config_path =
      flags->count("config") ? flags->at("config") : "deploy/local/cluster.yaml";
  auto config = LoadClusterConfig(config_path);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  HostPort listen = config->router.listen;
  std::string listen_key = "router.listen";
  if (flags->count("listen")) {
    auto parsed = ParseHostPort(flags->at("listen"), "--listen");
    if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
    listen = *parsed;
    listen_key = "--listen";
  }
  Advertise advertise = config->router.advertise;
  std::string advertise_key = "router.advertise";
  if (flags->count("advertise")) {
    auto parsed = ParseAdvertise(flags->at("advertise"), "--advertise");
    if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
    advertise = *parsed;
    advertise_key = "--advertise";
  }
  if (auto a = AdvertisedAddress(listen, 0, advertise, listen_key, advertise_key); !a.ok()) {
    return Fail(std::string(a.status().message()));
  }
  std::optional<HostPort> http_listen = config->router.http_listen;
  if (flags->count("http-listen")) {
    auto parsed = ParseHostPort(flags->at("http-listen"), "--http-listen");
    if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
    http_listen = *parsed;
  }
  std::optional<HostPort> metrics_listen = config->router.metrics_listen;
  if (flags->count("metrics-listen")) {
    auto parsed = ParseHostPort(flags->at("metrics-listen"), "--metrics-listen");
    if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
    metrics_listen = *parsed;
  }
  const std::string name = flags->count("name") ? flags->at("name") : config->router.name;
  rpc::SetLogComponent(name);
  auto cluster_auth =
      auth::ClusterAuth::Load(config->cluster.secret_file, config->cluster.auth_max_skew_ms,
                              config->cluster.accepted_secret_files);
  if (!cluster_auth.ok()) return Fail(std::string(cluster_auth.status().message()));
  auto model_path = ResolveModelPath(flags->count("model") ? flags->at("model") : "", *config);
  if (!model_path.ok()) return Fail(std::string(model_path.status().message()));
  // The router tokenizes; it runs no forward pass (no F32 panel packing).
  auto bundle = LoadModelBundle(*model_path, 1, model::Q8MatMul::kExact, /*cpu_forward=*/false);
  if (!bundle.ok()) return Fail(std::string(bundle.status().message()));

  // An unrecognised template is no start-up error: prompt requests are
  // served, and chat requests get FAILED_PRECONDITION with this same line.
  auto chat_template = router::ChatTemplate::FromGguf(*(*bundle)->file, config->chat_template);
  if (!chat_template.ok()) return Fail(std::string(chat_template.status().message()));
  if (chat_template->status().ok()) {
    rpc::Log(absl::StrCat("chat format: ", chat_template->format_name()));
  } else {
    rpc::Log(absl::StrCat("chat format: none (", chat_template->status().message(), ")"));
  }

  // Logged once start-up errors (one stderr line each) are behind us.
  rpc::Log((*cluster_auth)->open()
               ? "peer authentication: open (no cluster.secret_file)"
               : absl::StrCat("peer authentication: HMAC-SHA256 (cluster.secret_file",
                              (*cluster_auth)->accepted_secrets() == 0
                                  ? ""
                                  : absl::StrCat("; also accepting the ",
                                                 (*cluster_auth)->accepted_secrets(),
                                                 " secret(s) of cluster.accepted_secret_files"),
                              ")"));

  router::RegistryOptions options;
  options.model_fingerprint = (*bundle)->fingerprint;
  options.poll_interval_ms = config->router.poll_interval_ms;
  options.unhealthy_after_missed_polls = config->router.unhealthy_after_missed_polls;
  options.rpc_timeout_ms = config->router.rpc_timeout_ms;
  options.drop_after_ms = config->router.drop_after_ms;
  options.routing.policy = config->router.policy;
  options.routing.weights = config->router.kv_aware;
  options.routing.max_num_seqs = config->engine.max_num_seqs;
  options.routing.max_num_batched_tokens = config->engine.max_num_batched_tokens;
  {
    const KvAwareWeights& w = options.routing.weights;
    rpc::Log(options.routing.policy == RouterPolicy::kKvAware
                 ? absl::StrCat("routing policy: kv_aware (prefix_weight ", w.prefix_weight,
                                ", free_blocks_weight ", w.free_blocks_weight, ", load_weight ",
                                w.load_weight, ", prefill_queue_weight ", w.prefill_queue_weight,
                                ")")
                 : absl::StrCat("routing policy: ", RouterPolicyName(options.routing.policy)));
  }
  options.auth = cluster_auth->get();
  // What every worker's KV layout must be (the workers' own function).
  rpc::Log(PrefillPlacementSummary(*config));
  options.kv_layout_id = ExpectedKvLayout(*config, **bundle, WorkerConfig{}).LayoutId();
  rpc::Log(absl::StrCat("expected KV layout: ", options.kv_layout_id));
  for (const auto* list : {&config->prefill_workers, &config->decode_workers}) {
    for (const WorkerConfig& w : *list) {
      options.kv_layout_ids[w.name] = ExpectedKvLayout(*config, **bundle, w).LayoutId();
      if (options.kv_layout_ids[w.name] != options.kv_layout_id) {
        rpc::Log(absl::StrCat("expected KV layout of ", w.name, " (",
                              config->WorkerDevice(w).ToString(),
                              "): ", options.kv_layout_ids[w.name]));
      }
    }
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::HealthCheckServiceInterface* health = nullptr;
  absl::Mutex health_mu;
  router::Admission::Options admission;
  admission.max_inflight = config->router.max_inflight;
  admission.max_queued = config->router.max_queued;
  router::RouterService service(bundle->get(), *std::move(chat_template), options, admission,
                                name, [&](bool serving) {
    absl::MutexLock lock(&health_mu);
    rpc::Log(serving ? "cluster can serve: SERVING" : "cluster cannot serve: NOT_SERVING");
    if (health != nullptr) health->SetServingStatus("", serving);
  });
  service.set_failover(config->router.max_migrations, config->router.rpc_timeout_ms);
  // Declared after `service`, so its thread stops before the keys go.
  std::unique_ptr<router::ApiKeysReloader> keys_reloader;
  if (!config->router.api_keys_file.empty()) {
    std::string keys_text;
    auto keys = router::LoadApiKeys(config->router.api_keys_file, &keys_text);
    if (!keys.ok()) {
      return Fail(absl::StrCat("router.api_keys_file: ", keys.status().message()));
    }
    rpc::Log(absl::StrCat("API keys: ", keys->size(), " from ", config->router.api_keys_file,
                          " (limits per router replica; re-read every ",
                          absl::FormatDuration(router::kApiKeysReloadInterval), ")"));
    auto table = std::make_unique<router::ApiKeys>(*keys);
    keys_reloader = std::make_unique<router::ApiKeysReloader>(
        table.get(), config->router.api_keys_file, std::move(keys_text),
        [](absl::string_view line) { rpc::Log(line); });
    service.set_api_keys(std::move(table));
    keys_reloader->Start();
  } else {
    rpc::Log("API keys: none (Generation is open)");
  }
  grpc::ServerBuilder builder;
  // Requests as large as the HTTP front door takes (its JSON body at most
  // router.http_max_body_bytes; the GenerateRequest is no larger), or
  // gRPC's default 4 MiB.
  builder.SetMaxReceiveMessageSize(
      std::max(4 << 20, config->router.http_max_body_bytes + (64 << 10)));
  builder.RegisterService(&service);
  builder.RegisterService(service.registry_service());
  int port = 0;
  auto server = rpc::BuildAndStart(builder, listen, listen_key, &port);
  if (!server.ok()) return Fail(std::string(server.status().message()));
  // Checked at start: a wildcard listen has its advertise.
  const HostPort advertised = *AdvertisedAddress(listen, port, advertise, listen_key, advertise_key);
  service.set_address(advertised.ToString());
  {
    absl::MutexLock lock(&health_mu);
    // "" is readiness (the cluster can serve); liveness stays SERVING
    // until the process exits (rpc::kLivenessHealthService).
    health = (*server)->GetHealthCheckService();
    health->SetServingStatus(rpc::kLivenessHealthService, true);
    health->SetServingStatus("", service.registry().CanServe());
  }
  // Prometheus scrapes this one (no key, as the workers' metrics_listen);
  // the client port's /metrics needs a key when keys are configured.
  std::unique_ptr<http::HttpServer> metrics_server;
  if (metrics_listen.has_value()) {
    metrics_server = std::make_unique<http::HttpServer>(http::HttpServer::Options{});
    metrics::ServeMetrics(metrics_server.get(), {service.metrics().registry()});
    absl::StatusOr<int> bound = metrics_server->Start(metrics_listen->host, metrics_listen->port);
    if (!bound.ok()) {
      return Fail(absl::StrCat(
          flags->count("metrics-listen") ? "--metrics-listen" : "router.metrics_listen", ": ",
          bound.status().message()));
    }
    rpc::Log(absl::StrCat("metrics: serving http://",
                          HostPort{metrics_listen->host, *bound}.ToString(), "/metrics"));
    std::printf("TANDEM_METRICS_LISTENING %s:%d\n", metrics_listen->host.c_str(), *bound);
  }
  // The HTTP front door calls the Generation service above in-process.
  std::unique_ptr<router::openai::OpenAiFrontend> frontend;
  if (http_listen.has_value()) {
    const model::LlamaConfig& model_config = (*bundle)->model->config();
    router::openai::OpenAiFrontend::Options http_options;
    http_options.limits.served_model_name =
        config->router.served_model_name.empty()
            ? std::filesystem::path(*model_path).stem().string()
            : config->router.served_model_name;
    http_options.limits.context_length = model_config.context_length;
    http_options.limits.vocab_size = model_config.vocab_size;
    http_options.http.max_streams = config->router.http_max_streams;
    http_options.http.max_body_bytes = config->router.http_max_body_bytes;
    http_options.http.read_timeout_ms = config->router.http_read_timeout_ms;
    const tokenizer::Tokenizer* tok = (*bundle)->tokenizer.get();
    router::openai::OpenAiFrontend::Router hooks;
    hooks.channel = (*server)->InProcessChannel(grpc::ChannelArguments());
    hooks.token_bytes = [tok](int32_t id) { return tok->TokenBytes(id); };
    hooks.prompt_tokens = [&service](const v1::GenerateRequest& r) {
      return service.PromptTokens(r);
    };
    hooks.not_ready = [&service]() -> std::string {
      if (!service.accepting()) return "shutting down";
      return service.registry().CanServe() ? "" : "no healthy decode worker";
    };
    hooks.authenticate = [&service](const std::string* a) { return service.AuthenticateHeader(a); };
    hooks.refused = [&service](absl::StatusCode code) { service.metrics().RequestRefused(code); };
    frontend = std::make_unique<router::openai::OpenAiFrontend>(http_options, std::move(hooks));
    frontend->HandleBehindKeys("GET", "/metrics",
                               metrics::MetricsHandler({service.metrics().registry()}));
    auto http_port = frontend->Start(http_listen->host, http_listen->port);
    if (!http_port.ok()) {
      return Fail(absl::StrCat(flags->count("http-listen") ? "--http-listen" : "router.http_listen",
                               ": ", http_port.status().message()));
    }
    rpc::Log(absl::StrCat("HTTP (OpenAI API, /metrics) on ", http_listen->host, ":", *http_port,
                          ", model \"", http_options.limits.served_model_name, "\""));
    std::printf("TANDEM_HTTP_LISTENING %s:%d\n", http_listen->host.c_str(), *http_port);
  }
  rpc::AnnounceListening(advertised.host, advertised.port);

  int sig = rpc::WaitForTerminationSignal();
  rpc::Log(absl::StrCat("signal ", sig, ": draining for up to ", config->shutdown_grace_s, " s"));
  {
    absl::MutexLock lock(&health_mu);
    health->SetServingStatus("", false);
    health = nullptr;
  }
  service.StopAccepting();
  const absl::Time deadline = absl::Now() + absl::Seconds(config->shutdown_grace_s);
  while (absl::Now() < deadline && service.running_requests() > 0) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  // HTTP streams still open end now (their gRPC calls are cancelled).
  if (frontend) frontend->Stop();
  if (metrics_server) metrics_server->Stop();
  (*server)->Shutdown(rpc::DeadlineFromNow(1000));
  // Shutdown cancelled the remaining streams; let their request threads
  // see it before the service they use is destroyed.
  const absl::Time threads_deadline = absl::Now() + absl::Seconds(2);
  while (absl::Now() < threads_deadline && service.running_requests() > 0) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  rpc::Log("stopped");
  return 0;
}
