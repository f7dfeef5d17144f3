#include "common/server/auth_call.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/server/log.h"
#include "common/server/status_util.h"

namespace tandem::rpc {
namespace {

grpc::Status VerifyBytes(const auth::ClusterAuth* auth, grpc::CallbackServerContext* context,
                         absl::string_view method, absl::string_view bytes) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(auth::kAuthMetadataKey);
  std::string text;
  if (it != metadata.end()) text.assign(it->second.data(), it->second.size());
  absl::Status s = auth->VerifyText(method, bytes, it != metadata.end() ? &text : nullptr);
  if (s.ok()) return grpc::Status::OK;
  Log(absl::StrCat("refused ", method, " from ", context->peer(), ": ", s.message()));
  return ToGrpc(s);
}

}  // namespace

void SignCall(const auth::ClusterAuth* auth, grpc::ClientContext* context, absl::string_view method,
              const google::protobuf::Message& request) {
  if (auth == nullptr || auth->open()) return;
  const auth::Credential c = auth->Sign(method, request.SerializeAsString());
  context->AddMetadata(auth::kAuthMetadataKey, auth::FormatCredential(c));
}

grpc::Status VerifyCall(const auth::ClusterAuth* auth, grpc::CallbackServerContext* context,
                        absl::string_view method, const grpc::ByteBuffer& request) {
  if (auth == nullptr || auth->open()) return grpc::Status::OK;
  grpc::Slice slice;
  if (request.Valid() && !request.DumpToSingleSlice(&slice).ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the request bytes");
  }
  return VerifyBytes(auth, context, method,
                     absl::string_view(reinterpret_cast<const char*>(slice.begin()), slice.size()));
}

grpc::Status VerifyCall(const auth::ClusterAuth* auth, grpc::CallbackServerContext* context,
                        absl::string_view method, const google::protobuf::Message& request) {
  if (auth == nullptr || auth->open()) return grpc::Status::OK;
  return VerifyBytes(auth, context, method, request.SerializeAsString());
}

}  // namespace tandem::rpc
