// absl::Status <-> grpc::Status conversion (the codes are the same numbers:
// both follow google.rpc.Code).
#ifndef TANDEM_COMMON_SERVER_STATUS_UTIL_H_
#define TANDEM_COMMON_SERVER_STATUS_UTIL_H_

#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace tandem::rpc {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

[[nodiscard]] inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// Finishes a unary callback call right away with `status` (the response
// already filled) and returns the reactor for the service method to return.
inline grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                             const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_SERVER_STATUS_UTIL_H_
