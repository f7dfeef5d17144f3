// BackendFromConfig (declared in worker_engine.h), alone in this file: it
// is the only part of that header that reaches the device backends
// (backend::CreateBackend and, in a CUDA build, cuBLASLt), so a binary that
// uses the rest (the router: ExpectedKvLayout) links none of them.
#include "worker/worker_engine.h"

namespace tandem {

[[nodiscard]] absl::StatusOr<std::unique_ptr<backend::ModelBackend>> BackendFromConfig(
    const ClusterConfig& config, const ModelBundle& model, const WorkerConfig& worker,
    const backend::DeviceQuery& query) {
  return backend::CreateBackend(*model.model, BackendOptionsFromConfig(config, worker), query);
}

}  // namespace tandem
