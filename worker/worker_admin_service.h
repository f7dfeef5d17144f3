// tandem.v1.WorkerAdmin: what the router asks of a worker beyond its role's
// service (issue #35: SetRole, a role change at run time). Every call
// carries the cluster credential (rpc::Authorized), like the roles'.
//
// Owns: nothing but the handler; the role change itself is the process's
// (worker_process.h: the RoleGate, the registration). Threads: gRPC
// callback threads; `set_role` must be thread-safe.
#ifndef TANDEM_WORKER_WORKER_ADMIN_SERVICE_H_
#define TANDEM_WORKER_WORKER_ADMIN_SERVICE_H_

#include <functional>

#include "absl/status/statusor.h"
#include "auth/cluster_auth.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class WorkerAdminService final : public v1::WorkerAdmin::CallbackService {
 public:
  // Flips the worker to a role (ROLE_PREFILL or ROLE_DECODE, checked
  // before the call) and says what it did.
  using SetRoleFn = std::function<v1::SetRoleResponse(v1::WorkerRole role)>;
  // `auth` (nullptr or open: no credential required) outlives the service.
  WorkerAdminService(SetRoleFn set_role, const auth::ClusterAuth* auth);

  // INVALID_ARGUMENT "role: expected ROLE_PREFILL or ROLE_DECODE" for any
  // other role; else set_role's answer.
  grpc::ServerUnaryReactor* SetRole(grpc::CallbackServerContext* context,
                                    const v1::SetRoleRequest* request,
                                    v1::SetRoleResponse* response) override;

 private:
  const SetRoleFn set_role_;
  const auth::ClusterAuth* const auth_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_ADMIN_SERVICE_H_
