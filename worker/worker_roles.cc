#include "worker/worker_roles.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/worker_parts.h"

namespace tandem {

WorkerRoles::WorkerRoles(std::shared_ptr<core::EngineCore> core,
                         std::map<v1::WorkerRole, std::unique_ptr<WorkerRuntime>> halves,
                         const RoleGate* gate)
    : core_(std::move(core)), halves_(std::move(halves)), gate_(gate) {}

WorkerRoles::~WorkerRoles() { halves_.clear(); }

std::vector<grpc::Service*> WorkerRoles::services() {
  std::vector<grpc::Service*> out;
  for (auto& [role, half] : halves_) out.push_back(half->service());
  return out;
}

v1::WorkerStatus WorkerRoles::Status() {
  auto serving = halves_.find(gate_->role());
  if (serving == halves_.end()) serving = halves_.begin();
  v1::WorkerStatus status = serving->second->Status();
  auto* bytes = status.mutable_kv_bytes_by_transport();
  for (auto& [role, half] : halves_) {
    if (role == serving->first) continue;
    const v1::WorkerStatus other = half->Status();
    for (const auto& [transport, n] : other.kv_bytes_by_transport()) (*bytes)[transport] += n;
    if (status.kv_endpoint().empty()) status.set_kv_endpoint(other.kv_endpoint());
  }
  return status;
}

KvTransportCounters WorkerRoles::KvCounters() {
  KvTransportCounters sum;
  for (auto& [role, half] : halves_) {
    const KvTransportCounters c = half->KvCounters();
    for (size_t t = 0; t < sum.bytes_sent.size(); ++t) {
      sum.bytes_sent[t] += c.bytes_sent[t];
      sum.bytes_received[t] += c.bytes_received[t];
    }
    sum.transfer_seconds_sum += c.transfer_seconds_sum;
    sum.transfers += c.transfers;
    sum.load_to_first_decode_seconds_sum += c.load_to_first_decode_seconds_sum;
    sum.loads += c.loads;
  }
  return sum;
}

void WorkerRoles::Shutdown() { core_->Shutdown(); }

absl::StatusOr<std::unique_ptr<WorkerRoles>> BuildWorkerRoles(
    const WorkerContext& ctx, const std::vector<WorkerRoleSpec>& roles) {
  absl::StatusOr<WorkerBackendParts> parts = BuildWorkerBackendParts(ctx);
  if (!parts.ok()) return parts.status();
  SharedCoreParts shared{parts->layout, parts->bit_exact_class, parts->planes, nullptr};
  std::unique_ptr<core::RemoteKvLoader> loader;
  for (const WorkerRoleSpec& spec : roles) {
    if (!spec.make_loader) continue;
    absl::StatusOr<std::unique_ptr<core::RemoteKvLoader>> made = spec.make_loader(ctx, shared);
    if (!made.ok()) return made.status();
    loader = *std::move(made);
  }
  const std::string label = absl::StrCat(WorkerRoleName(ctx.gate->role()), " worker");
  shared.core = MakeWorkerCore(ctx, label, std::move(parts->backend), std::move(loader));
  std::map<v1::WorkerRole, std::unique_ptr<WorkerRuntime>> halves;
  for (const WorkerRoleSpec& spec : roles) {
    absl::StatusOr<std::unique_ptr<WorkerRuntime>> half = spec.factory(ctx, shared);
    if (!half.ok()) {
      shared.core->Shutdown();
      return half.status();
    }
    halves[spec.role] = *std::move(half);
  }
  return std::make_unique<WorkerRoles>(shared.core, std::move(halves), ctx.gate);
}

}  // namespace tandem
