#include "common/server/worker_main.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/http/http_server.h"
#include "common/metrics/metrics_server.h"
#include "common/server/auth_call.h"
#include "common/server/log.h"
#include "common/server/router_registration.h"
#include "common/server/server_util.h"
#include "common/server/stream_sink.h"
#include "common/server/worker_engine.h"
#include "common/server/worker_metrics.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  return 1;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseFlags(
    int argc, char** argv, const std::vector<std::string>& allowed) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string key = arg.substr(2), value;
    size_t eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag --", key, " needs a value"));
    }
    bool known = false;
    for (const std::string& a : allowed) known |= a == key;
    if (!known) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", key));
    flags[key] = value;
  }
  return flags;
}

bool HelpRequested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-help" || arg == "-h") return true;
  }
  return false;
}

namespace {

// The workers' --help text (flags as RunWorkerMain reads them).
void PrintWorkerUsage(v1::WorkerRole role, const std::vector<std::string>& extra_flags) {
  const bool decode = role == v1::ROLE_DECODE;
  const char* entries = decode ? "decode_workers" : "prefill_workers";
  std::printf(
      "usage: tandem-%s-worker --name NAME [flags]\n"
      "Serves one %s worker of a Tandem cluster and registers it with the router\n"
      "(docs/operations.md).\n\n"
      "  --config PATH         cluster YAML (default deploy/local/cluster.yaml)\n"
      "  --name NAME           the name registered with the router and logged (required)\n"
      "  --config-entry ENTRY  the %s entry whose settings to use (default: --name)\n"
      "  --model PATH          GGUF model file (default: the config's model)\n"
      "  --router HOST:PORT    the router to register with (default: router.listen)\n"
      "  --advertise HOST[:PORT]  the gRPC address peers dial (default: the entry's advertise)\n",
      decode ? "decode" : "prefill", decode ? "decode" : "prefill", entries);
  if (decode) {
    std::printf(
        "  --kv-advertise HOST[:PORT]  the KV transfer address prefill workers dial\n");
  }
  std::printf(
      "  --metrics-listen HOST:PORT  the Prometheus /metrics listener (default: the entry's)\n"
      "  --gpu-memory-fraction F    share of the GPU's memory for weights and KV (cuda only)\n"
      "  --help                this text\n"
      "Tests only: --fault-kv-layout-id ID, --fault-backend-error SPEC");
  for (const std::string& f : extra_flags) std::printf(", --%s V", f.c_str());
  std::printf("\n");
}

}  // namespace

int RunWorkerMain(int argc, char** argv, v1::WorkerRole role,
                  const std::vector<std::string>& extra_flags, RuntimeFactory factory) {
  if (HelpRequested(argc, argv)) {
    PrintWorkerUsage(role, extra_flags);
    return 0;
  }
  rpc::BlockTerminationSignals();
  std::vector<std::string> allowed = {"config",         "name",
                                      "config-entry",   "model",
                                      "router",         "advertise",
                                      "metrics-listen", "fault-kv-layout-id",
                                      "gpu-memory-fraction", "fault-backend-error"};
  if (role == v1::ROLE_DECODE) allowed.push_back("kv-advertise");
  allowed.insert(allowed.end(), extra_flags.begin(), extra_flags.end());
  auto flags = ParseFlags(argc, argv, allowed);
  if (!flags.ok()) return Fail(std::string(flags.status().message()));
  const std::string config_path =
      flags->count("config") ? flags->at("config") : "deploy/local/cluster.yaml";
  auto config = LoadClusterConfig(config_path);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  if (!flags->count("name")) return Fail("--name is required");
  // The name registered with the router and logged; the settings come from
  // the entry named --config-entry (default: the same name), so the
  // replicas of a Kubernetes Deployment share one entry under pod names.
  const std::string name = flags->at("name");
  const bool by_entry = flags->count("config-entry") != 0;
  const std::string entry_name = by_entry ? flags->at("config-entry") : name;
  const bool decode = role == v1::ROLE_DECODE;
  const auto& entries = decode ? config->decode_workers : config->prefill_workers;
  const WorkerConfig* worker = nullptr;
  for (const WorkerConfig& w : entries) {
    if (w.name == entry_name) worker = &w;
  }
  if (worker == nullptr) {
    return Fail(absl::StrCat(by_entry ? "--config-entry " : "--name ", entry_name,
                             ": no such entry in ", decode ? "decode_workers" : "prefill_workers",
                             " of ", config_path));
  }
  const std::string router =
      flags->count("router") ? flags->at("router") : config->router.listen.ToString();
  if (flags->count("router")) {
    auto parsed = ParseHostPort(router, "--router");
    if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
    if (parsed->port == 0) {
      return Fail(absl::StrCat("--router: port 0 cannot be dialled; give the router's port (got '",
                               router, "')"));
    }
  }
  rpc::SetLogComponent(name);
  // The addresses peers dial: flags win over the config; a decode worker's
  // KV endpoint takes the gRPC advertise host unless it has its own.
  WorkerConfig effective = *worker;
  worker = &effective;
  const std::string key_prefix =
      absl::StrCat(decode ? "decode_workers" : "prefill_workers", "[", entry_name, "].");
  for (const auto& [flag, target] :
       {std::pair<const char*, Advertise*>{"advertise", &effective.advertise},
        std::pair<const char*, Advertise*>{"kv-advertise", &effective.kv_advertise}}) {
    if (!flags->count(flag)) continue;
    auto parsed = ParseAdvertise(flags->at(flag), absl::StrCat("--", flag));
    if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
    *target = *parsed;
  }
  if (flags->count("metrics-listen")) {
    auto parsed = ParseHostPort(flags->at("metrics-listen"), "--metrics-listen");
    if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
    effective.metrics_listen = *parsed;
  }
  if (flags->count("gpu-memory-fraction")) {
    auto fraction = ParseGpuMemoryFractionFlag(flags->at("gpu-memory-fraction"),
                                               config->WorkerDevice(effective));
    if (!fraction.ok()) return Fail(std::string(fraction.status().message()));
    config->engine.gpu_memory_fraction = *fraction;
  }
  if (decode && effective.kv_advertise.empty() && !effective.advertise.empty()) {
    effective.kv_advertise.host = effective.advertise.host;
  }
  if (auto a = AdvertisedAddress(effective.listen, 0, effective.advertise,
                                 key_prefix + "listen", key_prefix + "advertise");
      !a.ok()) {
    return Fail(std::string(a.status().message()));
  }
  if (decode) {
    if (auto a = AdvertisedAddress(effective.kv_listen, 0, effective.kv_advertise,
                                   key_prefix + "kv_listen", key_prefix + "kv_advertise");
        !a.ok()) {
      return Fail(std::string(a.status().message()));
    }
  }
  auto cluster_auth =
      auth::ClusterAuth::Load(config->cluster.secret_file, config->cluster.auth_max_skew_ms,
                              config->cluster.accepted_secret_files);
  if (!cluster_auth.ok()) return Fail(std::string(cluster_auth.status().message()));
  auto model_path = ResolveModelPath(flags->count("model") ? flags->at("model") : "", *config);
  if (!model_path.ok()) return Fail(std::string(model_path.status().message()));
  if (absl::Status s = model::PinKernelIsa(config->engine.kernel_isa); !s.ok()) {
    return Fail(absl::StrCat("engine.kernel_isa: ", s.message()));
  }
  auto bundle =
      LoadModelBundle(*model_path, config->engine.threads, config->engine.q8_matmul,
                      !config->WorkerDevice(effective).is_cuda());
  if (!bundle.ok()) return Fail(std::string(bundle.status().message()));
  rpc::Log(absl::StrCat("loaded ", *model_path, " (", (*bundle)->model->config().name, ")"));

  std::string address;
  std::atomic<bool> ready{false};
  // Declared before the runtime and the server: the engine publishes into
  // it and the server serves it until both are gone.
  KvEventPublisher kv_events(
      KvEventPublisherOptions{config->engine.block_size, 0, 1024, cluster_auth->get()});
  WorkerContext context{&*config,          worker,  bundle->get(), &*flags,
                        cluster_auth->get(), nullptr, &kv_events};
  std::unique_ptr<WorkerRuntime> runtime;
  context.status = [&]() {
    v1::WorkerStatus status = runtime->Status();
    status.set_name(name);
    status.set_role(role);
    status.set_address(address);
    status.set_ready(ready.load());
    status.set_model_fingerprint((*bundle)->fingerprint);
    return status;
  };
  // Metrics read context.status (so the runtime): the metrics server,
  // declared after the runtime, stops before it goes. The engine's step
  // observer holds the collector.
  std::shared_ptr<WorkerMetrics> metrics;
  if (worker->metrics_listen.has_value()) {
    // Scraped only once the runtime exists (the server starts after it).
    metrics = std::make_shared<WorkerMetrics>(context.status,
                                              [&runtime] { return runtime->KvCounters(); });
    context.step_observer = [metrics](double seconds) { metrics->ObserveStep(seconds); };
  }
  // Set by the engine's loop thread before its SIGTERM to this process.
  absl::Mutex device_lost_mu;
  std::string device_lost;
  context.on_device_lost = [&device_lost_mu, &device_lost](const absl::Status& status) {
    {
      absl::MutexLock lock(&device_lost_mu);
      device_lost = std::string(status.message());
    }
    kill(getpid(), SIGTERM);
  };
  auto created = factory(context);
  if (!created.ok()) return Fail(std::string(created.status().message()));
  runtime = std::move(*created);
  std::unique_ptr<http::HttpServer> metrics_server;
  if (metrics != nullptr) {
    metrics_server = std::make_unique<http::HttpServer>(http::HttpServer::Options{});
    metrics::ServeMetrics(metrics_server.get(), {metrics});
    const HostPort& at = *worker->metrics_listen;
    absl::StatusOr<int> bound = metrics_server->Start(at.host, at.port);
    if (!bound.ok()) {
      runtime->Shutdown();
      runtime.reset();
      return Fail(absl::StrCat(key_prefix, "metrics_listen: ", bound.status().message()));
    }
    rpc::Log(absl::StrCat("metrics: serving http://", HostPort{at.host, *bound}.ToString(),
                          "/metrics"));
    rpc::AnnounceMetricsListening(at.host, *bound);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.RegisterService(runtime->service());
  builder.RegisterService(kv_events.service());
  int port = 0;
  const std::string key = key_prefix + "listen";
  auto server = rpc::BuildAndStart(builder, worker->listen, key, &port);
  if (!server.ok()) return Fail(std::string(server.status().message()));
  // Checked before the model was loaded: a wildcard has its advertise.
  address = AdvertisedAddress(worker->listen, port, worker->advertise, key,
                              key_prefix + "advertise")
                ->ToString();
  // "" is readiness (NOT_SERVING from the termination signal on);
  // kLivenessHealthService stays SERVING until the process exits.
  auto* health = (*server)->GetHealthCheckService();
  health->SetServingStatus(rpc::kLivenessHealthService, true);
  // Readiness ("") follows registration: SERVING while registered with at
  // least one router and not draining (a worker no router knows is of no
  // use to a rolling update).
  absl::Mutex readiness_mu;
  bool draining = false;
  health->SetServingStatus("", false);
  ready = true;
  {
    const HostPort advertised = *AdvertisedAddress(worker->listen, port, worker->advertise, key,
                                                   key_prefix + "advertise");
    rpc::AnnounceListening(advertised.host, advertised.port);
  }

  v1::RegisterWorkerRequest reg;
  reg.set_name(name);
  reg.set_role(role);
  reg.set_address(address);
  v1::WorkerStatus initial = context.status();
  reg.set_kv_endpoint(initial.kv_endpoint());
  reg.set_model_fingerprint((*bundle)->fingerprint);
  reg.set_kv_layout_id(flags->count("fault-kv-layout-id") ? flags->at("fault-kv-layout-id")
                                                           : initial.kv_layout_id());
  // A refusal ends the worker: SIGTERM to itself, then the drain below.
  RouterRegistrationOptions registration_options;
  registration_options.router = router;
  registration_options.request = reg;
  registration_options.auth = cluster_auth->get();
  registration_options.on_refusal = [](const std::string&) { kill(getpid(), SIGTERM); };
  registration_options.on_registered_change = [&](bool registered) {
    absl::MutexLock lock(&readiness_mu);
    if (!draining) health->SetServingStatus("", registered);
  };
  RouterRegistration registration(std::move(registration_options));
  registration.Start();

  int sig = rpc::WaitForTerminationSignal();
  ready = false;
  {
    absl::MutexLock lock(&readiness_mu);
    draining = true;
    health->SetServingStatus("", false);
  }
  registration.Stop();
  const std::string refusal = registration.refusal();
  std::string lost;
  {
    absl::MutexLock lock(&device_lost_mu);
    lost = device_lost;
  }
  if (!lost.empty()) {
    // Every request has already failed (UNAVAILABLE); the drain below only
    // lets those replies go out.
    rpc::Log(absl::StrCat(lost, "; exiting with status ", kExitDeviceLost,
                          " to be restarted"));
  } else if (refusal.empty()) {
    rpc::Log(absl::StrCat("signal ", sig, ": draining for up to ", config->shutdown_grace_s,
                          " s"));
  } else {
    rpc::Log(absl::StrCat("exiting: draining for up to ", config->shutdown_grace_s, " s"));
  }
  const absl::Time drain_deadline = absl::Now() + absl::Seconds(config->shutdown_grace_s);
  while (absl::Now() < drain_deadline && runtime->Status().running_requests() > 0) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  runtime->Shutdown();
  // Every request has ended now; let their statuses go out (up to 1 s)
  // before the server's Shutdown cancels what is still being sent.
  const absl::Time flush_deadline = absl::Now() + absl::Seconds(1);
  while (absl::Now() < flush_deadline && rpc::FinishingStreams() > 0) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  (*server)->Shutdown(rpc::DeadlineFromNow(1000));
  if (metrics_server != nullptr) metrics_server->Stop();
  runtime.reset();
  rpc::Log("stopped");
  if (!lost.empty()) return kExitDeviceLost;
  return refusal.empty() ? 0 : 1;
}

}  // namespace tandem
