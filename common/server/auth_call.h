// The cluster credential (auth/cluster_auth.h) on gRPC calls: one
// line to sign a client call, one line to verify it in a handler.
//
//   Client (after the request is final, before the call starts):
//     rpc::SignCall(auth, &context, rpc::kDecodeGenerateMethod, request);
//   Server, raw method (hashes the bytes received, never a re-serialization):
//     if (grpc::Status s = rpc::VerifyCall(auth_, context, rpc::kDecodeGenerateMethod, *request);
//         !s.ok()) return rpc::FinishedStream(s);        // or rpc::FinishUnary(context, s)
//   Server, typed method (request without map fields, e.g. GetStatusRequest):
//     the same with the typed request.
//
// `auth` may be nullptr or open (no cluster.secret_file): SignCall adds
// nothing and VerifyCall accepts every call. A refusal is UNAUTHENTICATED
// (RESOURCE_EXHAUSTED when the replay cache is full) with a message saying
// what was wrong (missing, malformed, clock skew, bad signature, replayed),
// and is logged with the method and the peer; never the secret or the
// signature. Threads: any.
#ifndef TANDEM_COMMON_SERVER_AUTH_CALL_H_
#define TANDEM_COMMON_SERVER_AUTH_CALL_H_

#include <google/protobuf/message.h>
#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include "absl/strings/string_view.h"
#include "auth/cluster_auth.h"

namespace tandem::rpc {

// The gRPC full method names credentials are bound to (the signed text
// includes them, so a credential for one method is refused by another).
inline constexpr char kDecodeGenerateMethod[] = "/tandem.v1.DecodeWorker/Generate";
inline constexpr char kDecodeCancelSampleMethod[] = "/tandem.v1.DecodeWorker/CancelSample";
inline constexpr char kDecodeAbortTransferMethod[] = "/tandem.v1.DecodeWorker/AbortTransfer";
inline constexpr char kDecodeGetStatusMethod[] = "/tandem.v1.DecodeWorker/GetStatus";
inline constexpr char kPrefillPrefillMethod[] = "/tandem.v1.PrefillWorker/Prefill";
inline constexpr char kPrefillGetStatusMethod[] = "/tandem.v1.PrefillWorker/GetStatus";
inline constexpr char kRegisterWorkerMethod[] = "/tandem.v1.Registry/RegisterWorker";
inline constexpr char kKvEventsWatchMethod[] = "/tandem.v1.KvEvents/Watch";
inline constexpr char kWorkerSetRoleMethod[] = "/tandem.v1.WorkerAdmin/SetRole";

// Adds the x-tandem-auth metadata for `request` sent to `method`: the HMAC
// covers request.SerializeAsString(), which is the bytes the generated stub
// sends as long as `request` is not modified in between (the same message
// instance serializes its map fields in the same order). No-op when `auth`
// is nullptr or open.
void SignCall(const auth::ClusterAuth* auth, grpc::ClientContext* context, absl::string_view method,
              const google::protobuf::Message& request);

// Checks the call's x-tandem-auth metadata against the raw request bytes
// received for `method`. OK when `auth` is nullptr or open. Errors: see
// the header comment; logged as "refused <method> from <peer>: <why>".
grpc::Status VerifyCall(const auth::ClusterAuth* auth, grpc::CallbackServerContext* context,
                        absl::string_view method, const grpc::ByteBuffer& request);

// The same for a typed method: hashes request.SerializeAsString(). Only for
// requests without map fields (their order is not canonical).
grpc::Status VerifyCall(const auth::ClusterAuth* auth, grpc::CallbackServerContext* context,
                        absl::string_view method, const google::protobuf::Message& request);

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_SERVER_AUTH_CALL_H_
