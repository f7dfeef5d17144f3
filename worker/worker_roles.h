// Both roles of one worker on one engine core (issue #35): the prefill
// half (its KV sender, PrefillWorker) and the decode half (its KV receiver
// as the core's remote KV loader, DecodeWorker) are built over a single
// backend, KV pool and prefix cache, and served side by side; the
// worker's RoleGate says which half takes new requests. A role change is
// then a flip of the gate: no model reload, nothing of the cache lost, and
// each half keeps finishing what it has.
//
// Owns: the shared core and both halves (destroyed halves first).
// Threads: Status/KvCounters from gRPC and metrics threads (the halves'
// are thread-safe); Shutdown from the drain.
#ifndef TANDEM_WORKER_WORKER_ROLES_H_
#define TANDEM_WORKER_WORKER_ROLES_H_

#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/worker_main.h"

namespace tandem {

class WorkerRoles {
 public:
  // `halves`: one runtime per role, over `core`; `gate` outlives this.
  WorkerRoles(std::shared_ptr<core::EngineCore> core,
              std::map<v1::WorkerRole, std::unique_ptr<WorkerRuntime>> halves,
              const RoleGate* gate);
  ~WorkerRoles();
  WorkerRoles(const WorkerRoles&) = delete;
  WorkerRoles& operator=(const WorkerRoles&) = delete;

  // Every half's gRPC service (each lives as long as this object).
  std::vector<grpc::Service*> services();
  // The worker's counters (one core: the serving half's view), with
  // kv_bytes_by_transport summed over both halves (bytes this worker sent
  // and received per transport) and the decode half's kv_endpoint.
  v1::WorkerStatus Status();
  // Both halves' KV transport counters (sent by the prefill half, received
  // by the decode half).
  KvTransportCounters KvCounters();
  // Ends every request with UNAVAILABLE and refuses new ones.
  void Shutdown();

 private:
  // Declared first: destroyed after the halves that point into it.
  std::shared_ptr<core::EngineCore> core_;
  std::map<v1::WorkerRole, std::unique_ptr<WorkerRuntime>> halves_;
  const RoleGate* const gate_;
};

// Builds the backend (BuildWorkerBackendParts), then each role's
// make_loader (at most one role brings a loader), the engine core
// (MakeWorkerCore, labelled after ctx.gate's role: "decode worker"), and
// each role's half over it. Errors: the first step's, as one line.
[[nodiscard]] absl::StatusOr<std::unique_ptr<WorkerRoles>> BuildWorkerRoles(
    const WorkerContext& ctx, const std::vector<WorkerRoleSpec>& roles);

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_ROLES_H_
