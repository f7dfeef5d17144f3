#include "worker/worker_admin_service.h"

#include <utility>

#include "common/server/authorized.h"

namespace tandem {

WorkerAdminService::WorkerAdminService(SetRoleFn set_role, const auth::ClusterAuth* auth)
    : set_role_(std::move(set_role)), auth_(auth) {}

grpc::ServerUnaryReactor* WorkerAdminService::SetRole(grpc::CallbackServerContext* context,
                                                      const v1::SetRoleRequest* request,
                                                      v1::SetRoleResponse* response) {
  return rpc::Authorized(auth_, context, rpc::kWorkerSetRoleMethod, *request, [&] {
    if (request->role() != v1::ROLE_PREFILL && request->role() != v1::ROLE_DECODE) {
      return rpc::FinishUnary(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                                    "role: expected ROLE_PREFILL or ROLE_DECODE"));
    }
    *response = set_role_(request->role());
    return rpc::FinishUnary(context, grpc::Status::OK);
  });
}

}  // namespace tandem
