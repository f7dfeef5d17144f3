// BackendFromConfig (declared in worker_engine.h) and BuildWorkerBackend
// (worker_main.h), alone in this file: they are the only parts of those
// headers that reach the device backends (backend::CreateBackend and, in a
// CUDA build, cuBLASLt), so a binary that uses the rest (the router:
// ExpectedKvLayout, ParseFlags) links none of them.
#include "common/server/worker_engine.h"
#include "common/server/worker_main.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<backend::ModelBackend>> BackendFromConfig(
    const ClusterConfig& config, const ModelBundle& model, const WorkerConfig& worker,
    const backend::DeviceQuery& query) {
  return backend::CreateBackend(*model.model, BackendOptionsFromConfig(config, worker), query);
}

absl::StatusOr<std::unique_ptr<backend::ModelBackend>> BuildWorkerBackend(
    const WorkerContext& ctx) {
  absl::StatusOr<std::unique_ptr<backend::ModelBackend>> backend =
      BackendFromConfig(*ctx.config, *ctx.model, *ctx.worker);
  if (!backend.ok()) return backend.status();
  return WithBackendFault(*ctx.flags, *std::move(backend));
}

}  // namespace tandem
