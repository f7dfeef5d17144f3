#include "tools/router_client.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::cli {

std::unique_ptr<tandem::v1::Generation::Stub> MakeGenerationStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return tandem::v1::Generation::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

std::string GrpcErrorLine(const grpc::Status& status) {
  // grpc::StatusCode and absl::StatusCode share their numbering.
  return absl::StrCat("tandem: ",
                      absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", status.error_message());
}

}  // namespace tandem::cli
