// One running worker process, between its prologue and its exit: the
// runtime its role builds, the /metrics server, the gRPC server (the
// role's service, KvEvents, health), the registration with the router, and
// the drain (RunWorkerMain's steps after settings and model; worker_main.h
// documents the behaviour).
//
// Owns: everything the process serves with, in destruction order
// (registration, gRPC server, metrics server, runtime, metrics, KV events).
// Threads: the main thread runs Run(); the engine's loop thread calls the
// device-lost hook (guarded by device_lost_mu_); RouterRegistration's
// threads call the readiness hook (guarded by readiness_mu_).
#ifndef TANDEM_WORKER_WORKER_PROCESS_H_
#define TANDEM_WORKER_WORKER_PROCESS_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/http/http_server.h"
#include "common/server/prologue.h"
#include "worker/kv_event_publisher.h"
#include "worker/role_gate.h"
#include "worker/router_registration.h"
#include "worker/worker_admin_service.h"
#include "worker/worker_main.h"
#include "worker/worker_metrics.h"
#include "worker/worker_roles.h"
#include "worker/worker_settings.h"

namespace tandem {

class WorkerProcess {
 public:
  // `settings` and `prologue` outlive the process object.
  WorkerProcess(const WorkerSettings& settings, const Prologue& prologue);
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // Builds both roles' runtime (BuildWorkerRoles), serves the role it
  // starts in, registers, waits for the termination signal and drains.
  // Returns the exit code: 0, 1 (a start-up error, printed as one stderr
  // line, or a refused registration) or kExitDeviceLost.
  int Run(const std::vector<WorkerRoleSpec>& roles);

 private:
  // The runtime, then the /metrics server when metrics_listen is set.
  // Errors name the key.
  [[nodiscard]] absl::Status StartRuntime(const std::vector<WorkerRoleSpec>& roles);
  [[nodiscard]] absl::Status StartMetrics();
  // The gRPC server: the role's service, KvEvents, health; TANDEM_LISTENING.
  [[nodiscard]] absl::Status StartServer();
  // Heartbeat registration with every router address; readiness follows it.
  void StartRegistration();
  // The drain after the signal; returns the exit code.
  int Drain();
  // The status GetStatus answers with: the runtime's plus who we are.
  v1::WorkerStatus Status();
  std::string TakeDeviceLost();
  // WorkerAdmin.SetRole: flips the gate, registers with the new role, logs
  // "role: prefill -> decode".
  v1::SetRoleResponse SetRole(v1::WorkerRole role);

  // Const after construction.
  const WorkerSettings& settings_;
  const Prologue& prologue_;
  // Set once the server is bound (before readiness).
  std::string address_;
  std::atomic<bool> ready_{false};
  // Declared before the runtime and the server: the engine publishes into
  // it and the server serves it until both are gone.
  KvEventPublisher kv_events_;
  RoleGate gate_;
  WorkerContext context_;
  std::unique_ptr<WorkerRoles> runtime_;
  // Reads Status() (so the runtime): the metrics server, declared after the
  // runtime, stops before it goes. The engine's step observer holds it.
  std::shared_ptr<WorkerMetrics> metrics_;
  absl::Mutex device_lost_mu_;
  std::string device_lost_ ABSL_GUARDED_BY(device_lost_mu_);
  std::unique_ptr<http::HttpServer> metrics_server_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<WorkerAdminService> admin_;
  grpc::HealthCheckServiceInterface* health_ = nullptr;
  absl::Mutex readiness_mu_;
  bool draining_ ABSL_GUARDED_BY(readiness_mu_) = false;
  // Guards registration_ against SetRole racing StartRegistration.
  absl::Mutex registration_mu_;
  std::unique_ptr<RouterRegistration> registration_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_PROCESS_H_
