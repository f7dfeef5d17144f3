// The worker runtime's main(): flags -> settings (worker_settings.h) ->
// prologue (cluster credential, model: common/server/prologue.h) -> runtime
// (the role's service, built by its WorkerRoleSpec) -> gRPC server ->
// registration with the router -> serve until drained -> exit (DESIGN.md,
// Processes). `tandem-worker --role prefill|decode` (worker/main.cc) and the
// aliases tandem-prefill-worker / tandem-decode-worker are each one call to
// RunWorkerMain with their role's WorkerRoleSpec.
#ifndef TANDEM_WORKER_WORKER_MAIN_H_
#define TANDEM_WORKER_WORKER_MAIN_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "auth/cluster_auth.h"
#include "common/cluster_config.h"
#include "common/server/exit_codes.h"
#include "common/server/flags.h"
#include "engine/core/request.h"
#include "common/server/model_bundle.h"
#include "engine/backend/model_backend.h"
#include "tandem/v1/common.pb.h"
#include "engine/core/engine_core.h"
#include "kvtransfer/kv_transfer.h"
#include "worker/kv_data_planes.h"
#include "worker/kv_event_publisher.h"
#include "worker/kv_transport_counters.h"
#include "worker/role_gate.h"

namespace tandem {

// One role's half of a worker (prefill_worker/'s PrefillService,
// decode_worker/'s DecodeService) over the engine core both halves share
// (worker/worker_roles.h runs them together).
class WorkerRuntime {
 public:
  virtual ~WorkerRuntime() = default;
  // The gRPC service to register (lives as long as the runtime).
  virtual grpc::Service* service() = 0;
  // Live counters; name/role/address/ready are filled by the caller.
  // kv_bytes_by_transport holds this half's bytes (sent by P, received by
  // D); kv_endpoint is the decode half's.
  virtual v1::WorkerStatus Status() = 0;
  // Ends every request with UNAVAILABLE and refuses new ones.
  virtual void Shutdown() = 0;
  // What the worker's KV data paths did, per transport (the /metrics
  // families tandem_kv_transfer_bytes_total{transport}, ...;
  // kv_transport_counters.h). Default: everything over tcp, from Status().
  virtual KvTransportCounters KvCounters() { return CountersFromStatus(Status()); }
};

struct WorkerContext {
  const ClusterConfig* config;
  const WorkerConfig* worker;  // this process's entry
  const ModelBundle* model;
  const std::map<std::string, std::string>* flags;
  // The cluster credential checker/signer (cluster.secret_file; open when
  // unset): services verify every peer call with it (rpc::VerifyCall), the
  // KV transfer its HELLO. Outlives the runtime.
  const auth::ClusterAuth* auth;
  // "prefill_workers[ENTRY]." or "decode_workers[ENTRY].": how errors name
  // the entry's keys (WorkerSettings::key_prefix).
  std::string key_prefix;
  // The role the worker serves now: each half admits new requests only
  // through it. Outlives the runtime.
  const RoleGate* gate = nullptr;
  // The worker's own status, filled by RunWorkerMain (for GetStatus).
  std::function<v1::WorkerStatus()> status;
  // The KV event publisher RunWorkerMain serves (KvEvents.Watch); outlives
  // the runtime. The factory hands it to CoreOptionsFromConfig.
  KvEventPublisher* kv_events = nullptr;
  // The engine's step observer (EngineCoreOptions::step_observer): feeds
  // the worker's /metrics step-time histogram when metrics_listen is set;
  // empty otherwise. The factory copies it into its core options.
  std::function<void(double seconds)> step_observer;
  // EngineCoreOptions::phase_observer: the /metrics phase histograms, as
  // step_observer.
  std::function<void(const core::RequestPhases& phases)> phase_observer;
  // EngineCoreOptions::on_device_lost: makes the worker go NOT_SERVING,
  // finish the failed replies, and exit with kExitDeviceLost. The factory
  // copies it into its core options.
  std::function<void(const absl::Status& status)> on_device_lost;
};

// What both halves of a worker share: the backend's KV layout, bit-exact
// class and KV data planes, and the one engine core (null while the roles'
// make_loader hooks run, before it exists).
struct SharedCoreParts {
  kvtransfer::KvLayout layout;
  std::string bit_exact_class;
  std::shared_ptr<const KvDataPlanes> planes;
  std::shared_ptr<core::EngineCore> core;
};

using RuntimeFactory = std::function<absl::StatusOr<std::unique_ptr<WorkerRuntime>>(
    const WorkerContext&, const SharedCoreParts&)>;
using LoaderFactory = std::function<absl::StatusOr<std::unique_ptr<core::RemoteKvLoader>>(
    const WorkerContext&, const SharedCoreParts&)>;

// One role a worker can serve: prefill_worker/ and decode_worker/ each
// provide theirs (PrefillRole(), DecodeRole()). Every worker runs both
// (worker/all_roles.h) and serves one at a time (RoleGate).
struct WorkerRoleSpec {
  v1::WorkerRole role = v1::ROLE_UNSPECIFIED;
  // Role-only flags beside WorkerFlagNames() (tests only today), accepted
  // when the worker starts in this role; the factory reads them from
  // WorkerContext::flags.
  std::vector<std::string> extra_flags;
  // What the role gives the engine core before it is built: the decode
  // role's KV receiver, the core's remote KV loader. Empty: nothing.
  LoaderFactory make_loader;
  // Builds the role's half (its service and KV endpoint) over the core.
  RuntimeFactory factory;
};

// Runs the worker process starting in `role` (one of `roles`, which every
// worker hosts together on one engine core, worker/worker_roles.h; it
// serves one at a time and changes role at run time through
// WorkerAdmin.SetRole, issue #35); returns the exit code. `program` is
// how --help names the binary ("tandem-worker --role decode"). Flags:
// --config FILE (default deploy/local/cluster.yaml), --name NAME (required: the name
// registered with the router and printed in every log line),
// --config-entry ENTRY (the prefill_workers / decode_workers entry whose
// settings this worker takes: listen, kv_listen, metrics_listen, device,
// advertise, ...; default NAME; so the replicas of one Kubernetes
// Deployment share an entry under their pod names; config errors name the
// entry, e.g. decode_workers[decode].listen; an unknown one is
// "--config-entry X: no such entry in decode_workers of PATH"), --model
// PATH, --router HOST:PORT (default: the config's router.listen; a host
// naming several routers, such as a headless Service, gets the worker
// registered with each: RouterRegistration, router_registration.h),
// --advertise
// HOST[:PORT] (the gRPC address registered with the router; default the
// entry's `advertise`), --kv-advertise HOST[:PORT] (the KV endpoint
// prefill workers dial while this worker decodes; default the entry's
// `kv_advertise`, else the advertise host), --metrics-listen HOST:PORT (default: the entry's
// `metrics_listen`; set: GET /metrics on an HTTP server there, serving
// WorkerMetrics over the same status GetStatus answers with; the bound
// address is logged as "metrics: serving http://HOST:PORT/metrics" and
// printed on stdout as "TANDEM_METRICS_LISTENING HOST:PORT" before
// TANDEM_LISTENING; a wildcard host is allowed), plus the role's
// `extra_flags` (settings: worker_settings.h). A wildcard listen address
// (0.0.0.0, [::]) without its advertise is refused naming the key.
// Start-up errors print one line to stderr and return 1. The registration
// carries the worker's KV layout id (its runtime's Status().kv_layout_id);
// when the router refuses it (FAILED_PRECONDITION: another model or KV
// layout, INVALID_ARGUMENT: a bad field, UNAUTHENTICATED: another cluster
// secret or a clock beyond cluster.auth_max_skew_ms) the worker logs the
// reason, drains and returns 1. cluster.secret_file is read at start-up
// (unreadable or short: one line naming the key, return 1); registrations
// are signed with it. --gpu-memory-fraction F overrides
// engine.gpu_memory_fraction for this worker (`tandem up` passes each
// worker on a shared GPU its share; ParseGpuMemoryFractionFlag: in (0, 1],
// refused on a CPU worker). The runtime factory's error (e.g. the backend
// refusing the worker's device or KV dtype) is a start-up error: one line,
// return 1. --fault-kv-layout-id ID (tests only): register with ID
// instead of the worker's own layout id. --fault-backend-error KIND@N
// (tests only; both roles): the factory wraps its backend in a
// backend::FaultInjectingBackend (WithBackendFault, worker_engine.h). Both
// roles serve KvEvents.Watch (the runtime's engine publishes through
// WorkerContext::kv_events). When the engine reports its device lost
// (WorkerContext::on_device_lost), the worker logs one line with the
// cause, sets its gRPC health NOT_SERVING, lets the failed replies go out,
// shuts down and returns kExitDeviceLost (exit_codes.h). gRPC health:
// service "" is SERVING while the worker is ready and NOT_SERVING from its
// termination signal on (the drain); rpc::kLivenessHealthService
// ("liveness") is SERVING until the process exits.
int RunWorkerMain(int argc, char** argv, const std::vector<WorkerRoleSpec>& roles,
                  v1::WorkerRole role, const std::string& program);

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_MAIN_H_
