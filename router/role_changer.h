// Runs role changes at run time (issue #35): `tandem role` (the router's
// Generation.SetWorkerRole) and the planner's flips (router/planner.h).
//
// One change, decision to serving (docs/architecture.md "Roles that follow
// the load"):
//   1. the registry takes the worker out of routing (BeginRoleChange:
//      NOT_FOUND, FAILED_PRECONDITION for the last decode worker, ...);
//   2. drain: this router's requests on it end by themselves. A prefill
//      worker's in-flight prefills all finish and ship (bounded by
//      kPrefillDrainCap; a worker that stops answering is caught by the
//      registry's polls, which fail its calls over). A decode worker's
//      running decodes finish until router.role_drain_timeout_ms; then the
//      rest move off it (WorkerHandle::NotifyLeaving: each decode stream
//      migrates to another decode worker with identical tokens; one that
//      cannot, route REMOTE or no migrations left, finishes there);
//   3. WorkerAdmin.SetRole on the worker (signed with the cluster
//      credential): it flips its RoleGate and registers with the new role;
//   4. the registry routes it in the new role (EndRoleChange).
// One change runs at a time (a second waits), so two changes never both
// take the last decode worker. Each is logged with its source and times.
//
// Owns: the changes' threads (ChangeAsync), the time of the last change.
// Does not touch: routing scores, the workers' engines. Threads: Change
// blocks its caller (the planner's thread); ChangeAsync runs it on a
// thread of its own, joined by the destructor.
#ifndef TANDEM_ROUTER_ROLE_CHANGER_H_
#define TANDEM_ROUTER_ROLE_CHANGER_H_

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/worker_registry.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::router {

// The longest a prefill worker's in-flight prefills are waited for; then
// they fail over like a lost worker's.
inline constexpr absl::Duration kPrefillDrainCap = absl::Seconds(120);

struct RoleChangerOptions {
  int32_t drain_timeout_ms = 1000;  // router.role_drain_timeout_ms
  int32_t rpc_timeout_ms = 2000;    // router.rpc_timeout_ms: the SetRole call's deadline
  std::function<void(const std::string&)> log;  // rpc::Log when empty
};

class RoleChanger {
 public:
  // `registry` outlives this.
  RoleChanger(WorkerRegistry* registry, RoleChangerOptions options);
  ~RoleChanger();  // joins every ChangeAsync thread
  RoleChanger(const RoleChanger&) = delete;
  RoleChanger& operator=(const RoleChanger&) = delete;

  // Changes worker `name` to `role` (ROLE_PREFILL or ROLE_DECODE) and
  // returns what happened (generation.proto SetWorkerRoleResponse).
  // `source` names who asked in the log ("tandem role", "planner").
  // Errors: INVALID_ARGUMENT (empty name, another role), BeginRoleChange's,
  // UNAVAILABLE when the worker does not answer SetRole (it stays out of
  // routing in its old role until a poll or registration finds it).
  absl::StatusOr<v1::SetWorkerRoleResponse> Change(const std::string& name, v1::WorkerRole role,
                                                   const std::string& source);
  // Change on a thread of its own; `done` runs there with its result.
  void ChangeAsync(const std::string& name, v1::WorkerRole role, const std::string& source,
                   std::function<void(absl::StatusOr<v1::SetWorkerRoleResponse>)> done);

  // When the last change that flipped a worker ended (InfinitePast: none).
  absl::Time last_change() const;

 private:
  // Step 3: WorkerAdmin.SetRole on `handle`'s worker.
  absl::Status CallSetRole(const WorkerHandle& handle, v1::WorkerRole role);
  void Log(const std::string& line) const;

  WorkerRegistry* const registry_;
  const RoleChangerOptions options_;
  absl::Mutex change_mu_;  // one change at a time
  mutable absl::Mutex mu_;
  absl::Time last_change_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROLE_CHANGER_H_
