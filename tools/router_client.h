// Helpers shared by the CLI commands that talk to the router's public
// service tandem.v1.Generation.
#ifndef TANDEM_TOOLS_ROUTER_CLIENT_H_
#define TANDEM_TOOLS_ROUTER_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include <string>

#include "tandem/v1/generation.grpc.pb.h"

namespace tandem::cli {

// Default router address of the CLI (deploy/local/cluster.yaml's router).
inline constexpr char kDefaultRouter[] = "127.0.0.1:50051";

// A Generation stub on an insecure channel to `address` ("host:port"), with
// the short reconnect backoff of DESIGN.md (100 ms initial, 1 s max) so a
// router that comes up a moment later is seen at once.
std::unique_ptr<tandem::v1::Generation::Stub> MakeGenerationStub(const std::string& address);

// OK when `address` is "host:port" with a port in 1..65535; otherwise
// INVALID_ARGUMENT naming the --router flag (gRPC would silently wrap an
// out-of-range port or log raw errors for an empty one).
[[nodiscard]] absl::Status CheckRouterAddress(const std::string& address);

// The environment variable the CLI reads an API key from when --api-key is
// not given (tandem generate, tandem status, tandem up's readiness polls).
inline constexpr char kApiKeyEnv[] = "TANDEM_API_KEY";

// The API key to send: `flag_value` when not empty, else $TANDEM_API_KEY,
// else "" (none). A key must be visible ASCII (0x21..0x7E: no space, tab,
// newline or other control byte, nothing outside ASCII), as gRPC metadata
// and RFC 6750's Bearer token require; else INVALID_ARGUMENT naming
// --api-key or $TANDEM_API_KEY and the offending byte's position and value
// (never the key).
[[nodiscard]] absl::StatusOr<std::string> ResolveApiKey(const std::string& flag_value);

// Adds `authorization: Bearer <api_key>` to `context` (nothing when
// `api_key` is empty): what a router with router.api_keys_file requires.
void SetApiKey(grpc::ClientContext* context, const std::string& api_key);

// "UNAVAILABLE: <message>": a failed RPC's code, spelled as in grpc/absl
// ("DEADLINE_EXCEEDED"), and its message.
std::string GrpcStatusText(const grpc::Status& status);

// "tandem: UNAVAILABLE: <message>": the CLI's one-line report of a failed
// RPC, the code spelled as in grpc/absl ("DEADLINE_EXCEEDED").
std::string GrpcErrorLine(const grpc::Status& status);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_ROUTER_CLIENT_H_
