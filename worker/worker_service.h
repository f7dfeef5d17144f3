// What every worker role's gRPC service shares (prefill_worker/'s
// PrefillService, decode_worker/'s DecodeService): the cluster credential
// every handler checks first (rpc::Authorized, common/server/authorized.h)
// and GetStatus, answered with the worker's status (name, role, address and
// readiness filled by the runtime, WorkerContext::status).
//
// Threads: GetStatus runs on gRPC callback threads; `status` must be
// thread-safe.
#ifndef TANDEM_WORKER_WORKER_SERVICE_H_
#define TANDEM_WORKER_WORKER_SERVICE_H_

#include <functional>
#include <utility>

#include "common/server/authorized.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

// `Base`: the role's generated callback service with GetStatus typed;
// `kGetStatusMethod`: its full method name (rpc::kDecodeGetStatusMethod, ...).
template <class Base, const char* kGetStatusMethod>
class WorkerService : public Base {
 public:
  // `auth` (nullptr or open: no credential required) outlives the service.
  WorkerService(std::function<v1::WorkerStatus()> status, const auth::ClusterAuth* auth)
      : status_(std::move(status)), auth_(auth) {}

  // The credential, then status() as the answer.
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest* request,
                                      v1::WorkerStatus* response) final {
    return rpc::Authorized(auth_, context, kGetStatusMethod, *request, [&] {
      *response = status_();
      return rpc::FinishUnary(context, grpc::Status::OK);
    });
  }

 protected:
  // The credential checker every handler passes to rpc::Authorized.
  const auth::ClusterAuth* auth() const { return auth_; }

 private:
  const std::function<v1::WorkerStatus()> status_;
  const auth::ClusterAuth* const auth_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_SERVICE_H_
