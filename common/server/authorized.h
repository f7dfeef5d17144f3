// The one authorization wrapper of the RPC handlers: the call's cluster
// credential is checked (rpc::VerifyCall, auth_call.h) before the handler's
// body runs; a refusal is the call's answer and the body never runs.
//
//   Raw unary:   return rpc::AuthorizedUnary<Req, Resp>(auth_, context, kMethod, request,
//                                                     response, body);  // ServeUnary's body
//                (or this, &MyService::XParsed as the body)
//   Raw stream:  return rpc::AuthorizedStream<Req>(auth_, context, kMethod, request, body);
//   Any other:   return rpc::Authorized(auth_, context, kMethod, *request, [&] { ...; });
//
// Threads: any (a gRPC callback thread).
#ifndef TANDEM_COMMON_SERVER_AUTHORIZED_H_
#define TANDEM_COMMON_SERVER_AUTHORIZED_H_

#include <type_traits>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "common/server/auth_call.h"
#include "common/server/raw_call.h"
#include "common/server/status_util.h"

namespace tandem::rpc {

// Runs body() (which returns the call's reactor) when the credential on
// `context` verifies for `method` over `request` (the raw bytes, or a typed
// request without map fields); otherwise answers the refusal with a
// finished reactor of the same kind (unary or server streaming).
template <class Request, class Body>
auto Authorized(const auth::ClusterAuth* auth, grpc::CallbackServerContext* context,
                absl::string_view method, const Request& request, Body&& body) -> decltype(body()) {
  using Reactor = decltype(body());
  static_assert(std::is_same_v<Reactor, grpc::ServerUnaryReactor*> ||
                    std::is_same_v<Reactor, grpc::ServerWriteReactor<grpc::ByteBuffer>*>,
                "Authorized wraps unary and raw server-streaming handlers");
  if (grpc::Status s = VerifyCall(auth, context, method, request); !s.ok()) {
    if constexpr (std::is_same_v<Reactor, grpc::ServerUnaryReactor*>) {
      return FinishUnary(context, s);
    } else {
      return FinishedStream(s);
    }
  }
  return body();
}

// A raw unary method that answers at once: Authorized, then ServeUnary.
template <class Req, class Resp>
grpc::ServerUnaryReactor* AuthorizedUnary(const auth::ClusterAuth* auth,
                                          grpc::CallbackServerContext* context,
                                          absl::string_view method, const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response,
                                          absl::FunctionRef<grpc::Status(const Req*, Resp*)> body) {
  return Authorized(auth, context, method, *request,
                    [&] { return ServeUnary<Req, Resp>(context, request, response, body); });
}

// The same with the typed body a member function of `service`:
//   return rpc::AuthorizedUnary(auth_, context, kMethod, request, response, this,
//                               &MyService::CancelSampleParsed);
template <class Service, class Req, class Resp>
grpc::ServerUnaryReactor* AuthorizedUnary(const auth::ClusterAuth* auth,
                                          grpc::CallbackServerContext* context,
                                          absl::string_view method, const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response, Service* service,
                                          grpc::Status (Service::*body)(const Req*, Resp*)) {
  return AuthorizedUnary<Req, Resp>(
      auth, context, method, request, response,
      [service, body](const Req* parsed, Resp* out) { return (service->*body)(parsed, out); });
}

// A raw server-streaming method: Authorized, then ServeStream.
template <class Req>
grpc::ServerWriteReactor<grpc::ByteBuffer>* AuthorizedStream(
    const auth::ClusterAuth* auth, grpc::CallbackServerContext* context, absl::string_view method,
    const grpc::ByteBuffer* request,
    absl::FunctionRef<grpc::ServerWriteReactor<grpc::ByteBuffer>*(const Req*)> body) {
  return Authorized(auth, context, method, *request,
                    [&] { return ServeStream<Req>(request, body); });
}

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_SERVER_AUTHORIZED_H_
