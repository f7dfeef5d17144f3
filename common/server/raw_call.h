// Raw gRPC callback methods over typed bodies. A method whose request has a
// proto `string` field is registered raw (the generated
// Service::WithRawCallbackMethod_<Method> templates: the handler receives and
// answers grpc::ByteBuffer), parses its request with ParseStrict
// (strict_parse.h) so that text that is not UTF-8 gets INVALID_ARGUMENT
// naming the field, then runs the typed body. The wire format, the service
// and method names (and so typed client stubs and server reflection) are
// those of the .proto.
//
//   Unary, synchronous body      ServeUnary<Req, Resp>(context, request, response, body)
//   Unary, body finishes later   a reactor deriving from UnaryCall<Req, Resp>
//   Server streaming             ServeStream<Req>(request, body) with a
//                                StreamSink<Msg> reactor (stream_sink.h)
//
// Threads: as the callback API; UnaryCall::Finish may run on any thread.
#ifndef TANDEM_COMMON_SERVER_RAW_CALL_H_
#define TANDEM_COMMON_SERVER_RAW_CALL_H_

#include <google/protobuf/message.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/server/status_util.h"
#include "common/server/strict_parse.h"

namespace tandem::rpc {

// Serializes `message` into `buffer` with gRPC's protobuf codec (what a
// typed method sends). Errors: INTERNAL when the message cannot be
// serialized (over 2 GiB).
inline grpc::Status SerializeToBuffer(const google::protobuf::Message& message,
                                      grpc::ByteBuffer* buffer) {
  bool own_buffer = false;
  return grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, buffer,
                                                                         &own_buffer);
}

// A server-streaming reactor that ends the call with `status` and no
// message; return it from the method. Deletes itself in OnDone.
inline grpc::ServerWriteReactor<grpc::ByteBuffer>* FinishedStream(grpc::Status status) {
  class Finished : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
   public:
    explicit Finished(grpc::Status s) { Finish(std::move(s)); }
    void OnDone() override { delete this; }
  };
  return new Finished(std::move(status));
}

// A unary raw method whose typed body answers at once: parses `request`
// (ParseStrict; its error ends the call), runs body(&req, &resp) and ends
// the call with the status it returns, `resp` serialized into `response`
// when OK. `req` and `resp` live until body returns.
template <class Req, class Resp>
grpc::ServerUnaryReactor* ServeUnary(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request, grpc::ByteBuffer* response,
                                     absl::FunctionRef<grpc::Status(const Req*, Resp*)> body) {
  Req req;
  if (absl::Status parsed = ParseStrict(*request, &req); !parsed.ok()) {
    return FinishUnary(context, ToGrpc(parsed));
  }
  Resp resp;
  grpc::Status status = body(&req, &resp);
  if (status.ok()) status = SerializeToBuffer(resp, response);
  return FinishUnary(context, status);
}

// A server-streaming raw method: parses `request` (ParseStrict; its error
// ends the call at once) and returns body(&req), the typed body's reactor
// (a StreamSink's). `req` lives until body returns: the body copies what it
// keeps.
template <class Req>
grpc::ServerWriteReactor<grpc::ByteBuffer>* ServeStream(
    const grpc::ByteBuffer* request,
    absl::FunctionRef<grpc::ServerWriteReactor<grpc::ByteBuffer>*(const Req*)> body) {
  Req req;
  if (absl::Status parsed = ParseStrict(*request, &req); !parsed.ok()) {
    return FinishedStream(ToGrpc(parsed));
  }
  return body(&req);
}

// The reactor of a unary raw method whose typed body answers later (from
// any thread). It owns the typed request and response for the whole call.
// Use:
//   auto* call = new MyCall(response);            // a subclass, or UnaryCall itself
//   if (call->Parse(*request)) Body(call, call->request(), call->response());
//   return call->reactor();
// and the body (or what it starts) calls call->Finish(status) once.
// The grpc::ServerUnaryReactor base is private so that every finish goes
// through Finish below. Subclasses may override OnCancel (gRPC thread).
// Deletes itself in OnDone.
template <class Req, class Resp>
class UnaryCall : private grpc::ServerUnaryReactor {
 public:
  // `response`: the raw method's response buffer.
  explicit UnaryCall(grpc::ByteBuffer* response) : out_(response) {}

  // Parses the raw request into request() (ParseStrict). On an error,
  // finishes the call with it and returns false.
  bool Parse(const grpc::ByteBuffer& request) {
    absl::Status parsed = ParseStrict(request, &request_);
    if (!parsed.ok()) Finish(ToGrpc(parsed));
    return parsed.ok();
  }

  const Req* request() const { return &request_; }
  Resp* response() { return &response_; }

  // Ends the call: with OK, response() is serialized and sent. Call once.
  void Finish(grpc::Status status) {
    if (status.ok()) status = SerializeToBuffer(response_, out_);
    grpc::ServerUnaryReactor::Finish(std::move(status));
  }

  // What the raw method returns.
  grpc::ServerUnaryReactor* reactor() { return this; }

 protected:
  void OnCancel() override {}

 private:
  void OnDone() override { delete this; }

  Req request_;
  Resp response_;
  grpc::ByteBuffer* const out_;
};

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_SERVER_RAW_CALL_H_
