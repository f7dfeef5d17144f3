#include "tools/role.h"

#include <chrono>
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "tools/cli_args.h"
#include "tools/router_client.h"

namespace tandem::cli {
namespace {

constexpr char kUsage[] =
    "usage: tandem role [--router H:P] [--api-key KEY] [--timeout-ms MS] NAME prefill|decode\n";

}  // namespace

absl::StatusOr<RoleOptions> ParseRoleArgs(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, {{"router"}, {"api-key"}, {"timeout-ms"}});
  if (!parsed.ok()) return parsed.status();
  const std::vector<std::string>& pos = parsed->positional();
  if (pos.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a worker name and a role (prefill or decode), got ", pos.size(), " argument(s)"));
  }
  RoleOptions o;
  if (absl::Status s = ReadRouterFlags(*parsed, &o.router, &o.api_key); !s.ok()) return s;
  absl::StatusOr<int64_t> timeout_ms = ReadTimeoutMs(*parsed, o.timeout_ms);
  if (!timeout_ms.ok()) return timeout_ms.status();
  o.timeout_ms = *timeout_ms;
  o.name = pos[0];
  if (o.name.empty()) return absl::InvalidArgumentError("name: must not be empty");
  if (pos[1] == "prefill") {
    o.role = tandem::v1::ROLE_PREFILL;
  } else if (pos[1] == "decode") {
    o.role = tandem::v1::ROLE_DECODE;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("role: expected prefill or decode, got '", pos[1], "'"));
  }
  return o;
}

int RunRole(const std::vector<std::string>& args) {
  absl::StatusOr<RoleOptions> options = ParseRoleArgs(args);
  if (!options.ok()) {
    std::cerr << "tandem role: " << options.status().message() << "\n" << kUsage;
    return 2;
  }
  auto stub = MakeGenerationStub(options->router);
  grpc::ClientContext context;
  SetApiKey(&context, options->api_key);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(options->timeout_ms));
  tandem::v1::SetWorkerRoleRequest request;
  request.set_name(options->name);
  request.set_role(options->role);
  tandem::v1::SetWorkerRoleResponse response;
  const grpc::Status rpc = stub->SetWorkerRole(&context, request, &response);
  if (!rpc.ok()) {
    std::cerr << GrpcErrorLine(rpc) << "\n";
    return 1;
  }
  std::printf("%s\n", response.message().c_str());
  return 0;
}

}  // namespace tandem::cli
