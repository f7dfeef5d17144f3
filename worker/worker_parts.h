// What every role's runtime factory builds the same way from its
// WorkerContext: the backend, its KV layout and KV data planes, and the
// engine core wired to the runtime (step observer, device-lost hook).
// The role adds its own KV endpoint and service (prefill_worker/,
// decode_worker/).
//
// Owns: nothing (builders). Threads: the main thread, at start-up.
#ifndef TANDEM_WORKER_WORKER_PARTS_H_
#define TANDEM_WORKER_WORKER_PARTS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/backend/model_backend.h"
#include "engine/core/engine_core.h"
#include "kvtransfer/kv_transfer.h"
#include "worker/kv_data_planes.h"
#include "worker/worker_main.h"

namespace tandem {

// The worker's backend: BackendFromConfig on its own entry's device and KV
// dtype (worker_engine.h), wrapped by WithBackendFault when
// --fault-backend-error is given. Errors: the factory's refusal or a bad
// flag value, as one line (a start-up error).
[[nodiscard]] absl::StatusOr<std::unique_ptr<backend::ModelBackend>> BuildWorkerBackend(
    const WorkerContext& ctx);

// A worker's backend with what its KV endpoint needs of it.
struct WorkerBackendParts {
  std::unique_ptr<backend::ModelBackend> backend;
  kvtransfer::KvLayout layout;  // KvLayoutFor(backend's storage, model fingerprint)
  std::string bit_exact_class;  // backend->bit_exact_class()
  // kv.transport: the transports this worker offers and their data paths
  // (BuildKvDataPlanes).
  std::shared_ptr<const KvDataPlanes> planes;
};

// BuildWorkerBackend, then the layout and BuildKvDataPlanes over its KV
// storage. Errors: either's, as one line.
[[nodiscard]] absl::StatusOr<WorkerBackendParts> BuildWorkerBackendParts(const WorkerContext& ctx);

// The engine core of a runtime: CoreOptionsFromConfig (with the context's
// KV event publisher) plus its step observer and device-lost hook.
// `worker_label` names the worker in errors ("decode worker"); `loader` may
// be null (every prompt is prefilled here).
std::unique_ptr<core::EngineCore> MakeWorkerCore(const WorkerContext& ctx,
                                                 const std::string& worker_label,
                                                 std::unique_ptr<backend::ModelBackend> backend,
                                                 std::unique_ptr<core::RemoteKvLoader> loader);

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_PARTS_H_
