#include "tools/router_client.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cluster_config.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::cli {

std::unique_ptr<tandem::v1::Generation::Stub> MakeGenerationStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS stays at gRPC's default (20 s): gRPC
  // also uses it as the connect timeout, and 100 ms made busy-machine
  // connects fail with "timed out before receiving SETTINGS frame".
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return tandem::v1::Generation::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

absl::StatusOr<std::string> ResolveApiKey(const std::string& flag_value) {
  const bool from_flag = !flag_value.empty();
  const char* env = std::getenv(kApiKeyEnv);
  std::string key = from_flag ? flag_value : (env != nullptr ? env : "");
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: an API key is visible ASCII only (no spaces, newlines or other control "
          "characters); byte %d of %d is 0x%02x",
          from_flag ? "--api-key" : absl::StrCat("$", kApiKeyEnv), i + 1, key.size(), c));
    }
  }
  return key;
}

void SetApiKey(grpc::ClientContext* context, const std::string& api_key) {
  if (!api_key.empty()) context->AddMetadata("authorization", "Bearer " + api_key);
}

std::string GrpcStatusText(const grpc::Status& status) {
  // grpc::StatusCode and absl::StatusCode share their numbering.
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", status.error_message());
}

std::string GrpcErrorLine(const grpc::Status& status) {
  return absl::StrCat("tandem: ", GrpcStatusText(status));
}

absl::Status CheckRouterAddress(const std::string& address) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(address, "--router");
  if (!parsed.ok()) return parsed.status();
  if (parsed->port == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--router: port must be in 1..65535, got '", address, "'"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::cli
