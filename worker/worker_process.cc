#include "worker/worker_process.h"

#include <signal.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics_server.h"
#include "common/server/drain.h"
#include "common/server/log.h"
#include "common/server/server_util.h"
#include "common/server/stream_sink.h"

namespace tandem {

WorkerProcess::WorkerProcess(const WorkerSettings& settings, const Prologue& prologue)
    : settings_(settings),
      prologue_(prologue),
      kv_events_(
          KvEventPublisherOptions{settings.config.engine.block_size, 0, 1024, prologue.auth.get()}),
      gate_(settings.role),
      context_{&settings.config, &settings.worker, prologue.bundle.get(), &settings.flags,
               prologue.auth.get()} {
  context_.key_prefix = settings.key_prefix;
  context_.gate = &gate_;
  context_.kv_events = &kv_events_;
  context_.status = [this] { return Status(); };
  if (settings_.worker.metrics_listen.has_value()) {
    // Scraped only once the runtime exists (the server starts after it).
    metrics_ =
        std::make_shared<WorkerMetrics>(context_.status, [this] { return runtime_->KvCounters(); });
    context_.step_observer = [metrics = metrics_](double s) { metrics->ObserveStep(s); };
    context_.phase_observer = [metrics = metrics_](const core::RequestPhases& phases) {
      metrics->ObservePhases(phases);
    };
  }
  // Called on the engine's loop thread before its SIGTERM to this process.
  context_.on_device_lost = [this](const absl::Status& status) {
    {
      absl::MutexLock lock(&device_lost_mu_);
      device_lost_ = std::string(status.message());
    }
    kill(getpid(), SIGTERM);
  };
}

v1::WorkerStatus WorkerProcess::Status() {
  v1::WorkerStatus status = runtime_->Status();
  status.set_name(settings_.name);
  status.set_role(gate_.role());
  status.set_address(address_);
  status.set_ready(ready_.load());
  status.set_model_fingerprint(prologue_.bundle->fingerprint);
  return status;
}

std::string WorkerProcess::TakeDeviceLost() {
  absl::MutexLock lock(&device_lost_mu_);
  return device_lost_;
}

v1::SetRoleResponse WorkerProcess::SetRole(v1::WorkerRole role) {
  v1::SetRoleResponse response;
  const v1::WorkerRole previous = gate_.set_role(role);
  response.set_previous_role(previous);
  response.set_role(role);
  response.set_changed(previous != role);
  if (previous == role) return response;
  {
    absl::MutexLock lock(&registration_mu_);
    if (registration_ != nullptr) registration_->SetRole(role);
  }
  rpc::Log(absl::StrCat("role: ", WorkerRoleName(previous), " -> ", WorkerRoleName(role),
                        " (engine, KV pool and prefix cache kept)"));
  return response;
}

int WorkerProcess::Run(const std::vector<WorkerRoleSpec>& roles) {
  absl::Status started = StartRuntime(roles);
  if (started.ok()) started = StartServer();
  if (!started.ok()) {
    std::fprintf(stderr, "%s\n", std::string(started.message()).c_str());
    return 1;
  }
  StartRegistration();
  return Drain();
}

absl::Status WorkerProcess::StartRuntime(const std::vector<WorkerRoleSpec>& roles) {
  auto created = BuildWorkerRoles(context_, roles);
  if (!created.ok()) return created.status();
  runtime_ = *std::move(created);
  if (absl::Status s = StartMetrics(); !s.ok()) {
    runtime_->Shutdown();
    runtime_.reset();
    return s;
  }
  return absl::OkStatus();
}

absl::Status WorkerProcess::StartMetrics() {
  if (metrics_ == nullptr) return absl::OkStatus();
  metrics_server_ = std::make_unique<http::HttpServer>(http::HttpServer::Options{});
  metrics::ServeMetrics(metrics_server_.get(), {metrics_});
  const HostPort& at = *settings_.worker.metrics_listen;
  absl::StatusOr<int> bound = metrics_server_->Start(at.host, at.port);
  if (!bound.ok()) {
    return absl::Status(
        bound.status().code(),
        absl::StrCat(settings_.key_prefix, "metrics_listen: ", bound.status().message()));
  }
  rpc::Log(
      absl::StrCat("metrics: serving http://", HostPort{at.host, *bound}.ToString(), "/metrics"));
  rpc::AnnounceMetricsListening(at.host, *bound);
  return absl::OkStatus();
}

absl::Status WorkerProcess::StartServer() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  for (grpc::Service* service : runtime_->services()) builder.RegisterService(service);
  builder.RegisterService(kv_events_.service());
  admin_ = std::make_unique<WorkerAdminService>(
      [this](v1::WorkerRole role) { return SetRole(role); }, prologue_.auth.get());
  builder.RegisterService(admin_.get());
  int port = 0;
  const WorkerConfig& w = settings_.worker;
  const std::string key = settings_.key_prefix + "listen";
  auto server = rpc::BuildAndStart(builder, w.listen, key, &port);
  if (!server.ok()) return server.status();
  server_ = *std::move(server);
  // Checked by ResolveWorkerSettings: a wildcard listen has its advertise.
  const HostPort advertised =
      *AdvertisedAddress(w.listen, port, w.advertise, key, settings_.key_prefix + "advertise");
  address_ = advertised.ToString();
  // "" is readiness: it follows registration (SERVING while registered
  // with at least one router and not draining: a worker no router knows is
  // of no use to a rolling update); kLivenessHealthService stays SERVING
  // until the process exits.
  health_ = server_->GetHealthCheckService();
  health_->SetServingStatus(rpc::kLivenessHealthService, true);
  health_->SetServingStatus("", false);
  ready_ = true;
  rpc::AnnounceListening(advertised.host, advertised.port);
  return absl::OkStatus();
}

void WorkerProcess::StartRegistration() {
  v1::RegisterWorkerRequest reg;
  reg.set_name(settings_.name);
  reg.set_role(gate_.role());
  reg.set_address(address_);
  const v1::WorkerStatus initial = Status();
  reg.set_kv_endpoint(initial.kv_endpoint());
  reg.set_model_fingerprint(prologue_.bundle->fingerprint);
  reg.set_kv_layout_id(FlagOr(settings_.flags, "fault-kv-layout-id", initial.kv_layout_id()));
  RouterRegistrationOptions options;
  options.router = settings_.router;
  options.request = reg;
  options.auth = prologue_.auth.get();
  // A refusal ends the worker: SIGTERM to itself, then the drain.
  options.on_refusal = [](const std::string&) { kill(getpid(), SIGTERM); };
  options.on_registered_change = [this](bool registered) {
    absl::MutexLock lock(&readiness_mu_);
    if (!draining_) health_->SetServingStatus("", registered);
  };
  absl::MutexLock lock(&registration_mu_);
  registration_ = std::make_unique<RouterRegistration>(std::move(options));
  // A SetRole before this point flipped the gate, which reg carries.
  registration_->SetRole(gate_.role());
  registration_->Start();
}

int WorkerProcess::Drain() {
  std::string refusal, lost;
  rpc::DrainPlan plan;
  plan.grace_s = settings_.config.shutdown_grace_s;
  plan.stop_accepting = [&](int sig) {
    ready_ = false;
    {
      absl::MutexLock lock(&readiness_mu_);
      draining_ = true;
      health_->SetServingStatus("", false);
    }
    registration_->Stop();
    refusal = registration_->refusal();
    lost = TakeDeviceLost();
    const std::string grace = absl::StrCat(" for up to ", plan.grace_s, " s");
    if (!lost.empty()) {
      // Every request has already failed (UNAVAILABLE); the drain only lets
      // those replies go out.
      rpc::Log(absl::StrCat(lost, "; exiting with status ", kExitDeviceLost, " to be restarted"));
    } else if (refusal.empty()) {
      rpc::Log(absl::StrCat("signal ", sig, ": draining", grace));
    } else {
      rpc::Log(absl::StrCat("exiting: draining", grace));
    }
  };
  plan.running = [this] { return static_cast<int64_t>(runtime_->Status().running_requests()); };
  plan.shut_down = [this] {
    runtime_->Shutdown();
    // Every request has ended now; let their statuses go out (up to 1 s)
    // before the server's Shutdown cancels what is still being sent.
    rpc::WaitUntil(absl::Seconds(1), absl::Milliseconds(5),
                   [] { return rpc::FinishingStreams() == 0; });
    server_->Shutdown(rpc::DeadlineFromNow(1000));
    if (metrics_server_ != nullptr) metrics_server_->Stop();
    runtime_.reset();
  };
  rpc::ServeUntilDrained(plan);
  if (!lost.empty()) return kExitDeviceLost;
  return refusal.empty() ? 0 : 1;
}

}  // namespace tandem
