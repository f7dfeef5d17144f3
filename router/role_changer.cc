#include "router/role_changer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/server/auth_call.h"
#include "common/server/log.h"
#include "common/server/server_util.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {
namespace {

const char* RoleName(v1::WorkerRole role) {
  return role == v1::ROLE_PREFILL ? "prefill" : role == v1::ROLE_DECODE ? "decode" : "unspecified";
}

double MsSince(absl::Time t0) { return absl::ToDoubleMilliseconds(absl::Now() - t0); }

}  // namespace

RoleChanger::RoleChanger(WorkerRegistry* registry, RoleChangerOptions options)
    : registry_(registry), options_(std::move(options)) {}

RoleChanger::~RoleChanger() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void RoleChanger::Log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    rpc::Log(line);
  }
}

absl::Time RoleChanger::last_change() const {
  absl::MutexLock lock(&mu_);
  return last_change_;
}

absl::Status RoleChanger::CallSetRole(const WorkerHandle& handle, v1::WorkerRole role) {
  auto stub = v1::WorkerAdmin::NewStub(rpc::MakeChannel(handle.address));
  v1::SetRoleRequest request;
  request.set_role(role);
  v1::SetRoleResponse response;
  grpc::ClientContext context;
  context.set_deadline(rpc::DeadlineFromNow(options_.rpc_timeout_ms));
  rpc::SignCall(handle.auth, &context, rpc::kWorkerSetRoleMethod, request);
  const grpc::Status status = stub->SetRole(&context, request, &response);
  if (status.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("worker ", handle.name, " (", handle.address,
                                             ") did not take the role: ", status.error_message()));
}

absl::StatusOr<v1::SetWorkerRoleResponse> RoleChanger::Change(const std::string& name,
                                                              v1::WorkerRole role,
                                                              const std::string& source) {
  if (name.empty()) return absl::InvalidArgumentError("name: must not be empty");
  if (role != v1::ROLE_PREFILL && role != v1::ROLE_DECODE) {
    return absl::InvalidArgumentError("role: expected prefill or decode");
  }
  absl::MutexLock one_at_a_time(&change_mu_);
  const absl::Time t0 = absl::Now();
  absl::StatusOr<WorkerRegistry::RoleChangeStart> start = registry_->BeginRoleChange(name, role);
  if (!start.ok()) return start.status();
  v1::SetWorkerRoleResponse out;
  out.set_previous_role(start->previous_role);
  out.set_role(role);
  if (start->no_op) {
    out.set_changed(false);
    out.set_message(absl::StrCat("worker ", name, " already serves the ", RoleName(role),
                                 " role; nothing changed"));
    return out;
  }
  const std::string what =
      absl::StrCat("worker ", name, ": ", RoleName(start->previous_role), " -> ", RoleName(role));
  Log(absl::StrCat("role change (", source, "): ", what, ": draining (up to ",
                   options_.drain_timeout_ms, " ms)"));
  // Step 2: this router's requests on it end, or move at the timeout. A
  // prefill worker's calls all finish and ship (they are bounded; failing
  // them over would fail requests under on_prefill_failure: fail): only a
  // worker that stops answering, which the registry's polls catch, ends
  // them, or kPrefillDrainCap. Running decodes move at drain_timeout_ms.
  const std::shared_ptr<WorkerHandle>& handle = start->handle;
  const absl::Time drain_deadline = t0 + (start->previous_role == v1::ROLE_PREFILL
                                              ? kPrefillDrainCap
                                              : absl::Milliseconds(options_.drain_timeout_ms));
  while (handle->active_requests.load() > 0 && absl::Now() < drain_deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  const int left = handle->active_requests.load();
  if (left > 0) {
    out.set_migrated_requests(static_cast<uint32_t>(left));
    handle->NotifyLeaving(absl::StrCat("worker ", name, " is changing role to ", RoleName(role)));
  }
  out.set_drain_ms(MsSince(t0));
  // Step 3.
  if (absl::Status set = CallSetRole(*handle, role); !set.ok()) {
    registry_->EndRoleChange(name, role, /*changed=*/false);
    Log(absl::StrCat("role change (", source, "): ", what, " failed: ", set.message()));
    return set;
  }
  registry_->EndRoleChange(name, role, /*changed=*/true);
  out.set_changed(true);
  out.set_switch_ms(MsSince(t0));
  out.set_message(absl::StrFormat(
      "worker %s serves the %s role now (was %s; drained in %.0f ms, %d request(s) still there "
      "told to migrate; serving %.0f ms after the decision)",
      name, RoleName(role), RoleName(start->previous_role), out.drain_ms(), left, out.switch_ms()));
  {
    absl::MutexLock lock(&mu_);
    last_change_ = absl::Now();
  }
  Log(absl::StrCat("role change (", source, "): ", out.message()));
  return out;
}

void RoleChanger::ChangeAsync(const std::string& name, v1::WorkerRole role,
                              const std::string& source,
                              std::function<void(absl::StatusOr<v1::SetWorkerRoleResponse>)> done) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    done(absl::UnavailableError("the router is shutting down"));
    return;
  }
  threads_.emplace_back(
      [this, name, role, source, done = std::move(done)] { done(Change(name, role, source)); });
}

}  // namespace tandem::router
