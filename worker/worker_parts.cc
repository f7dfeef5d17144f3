#include "worker/worker_parts.h"

#include <utility>

#include "worker/worker_engine.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<backend::ModelBackend>> BuildWorkerBackend(
    const WorkerContext& ctx) {
  absl::StatusOr<std::unique_ptr<backend::ModelBackend>> backend =
      BackendFromConfig(*ctx.config, *ctx.model, *ctx.worker);
  if (!backend.ok()) return backend.status();
  return WithBackendFault(*ctx.flags, *std::move(backend));
}

absl::StatusOr<WorkerBackendParts> BuildWorkerBackendParts(const WorkerContext& ctx) {
  absl::StatusOr<std::unique_ptr<backend::ModelBackend>> created = BuildWorkerBackend(ctx);
  if (!created.ok()) return created.status();
  WorkerBackendParts parts;
  parts.backend = *std::move(created);
  parts.layout = KvLayoutFor(parts.backend->kv_storage(), ctx.model->fingerprint);
  parts.bit_exact_class = parts.backend->bit_exact_class();
  absl::StatusOr<KvDataPlanes> planes =
      BuildKvDataPlanes(*ctx.config, *ctx.worker, parts.backend->kv_storage());
  if (!planes.ok()) return planes.status();
  parts.planes = std::make_shared<const KvDataPlanes>(*std::move(planes));
  return parts;
}

std::unique_ptr<core::EngineCore> MakeWorkerCore(const WorkerContext& ctx,
                                                 const std::string& worker_label,
                                                 std::unique_ptr<backend::ModelBackend> backend,
                                                 std::unique_ptr<core::RemoteKvLoader> loader) {
  core::EngineCoreOptions options =
      CoreOptionsFromConfig(*ctx.config, *ctx.model, worker_label, ctx.kv_events);
  options.step_observer = ctx.step_observer;
  options.phase_observer = ctx.phase_observer;
  // The step model's warm-up runs forwards; a fault-injected worker
  // (--fault-backend-error KIND@N, tests) skips it so that N counts
  // serving steps only.
  options.warmup = ctx.flags->count("fault-backend-error") == 0;
  options.on_device_lost = ctx.on_device_lost;
  return std::make_unique<core::EngineCore>(options, std::move(backend), std::move(loader));
}

}  // namespace tandem
