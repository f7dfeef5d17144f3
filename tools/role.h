// `tandem role`: change a worker's role at run time (issue #35) through the
// router's Generation.SetWorkerRole.
//
//   tandem role [--router H:P] [--api-key KEY] [--timeout-ms MS] NAME prefill|decode
//
// Prints the router's one-line answer ("worker prefill-0 serves the decode
// role now (was prefill; drained in 3 ms, 0 request(s) moved; serving 9 ms
// after the decision)", or "... already serves the decode role; nothing
// changed") and exits 0. A refusal is one line "tandem: CODE: message" and
// exit 1: NOT_FOUND (no such worker), FAILED_PRECONDITION (it would leave
// no decode worker; the worker is unhealthy or already changing role),
// UNAUTHENTICATED / PERMISSION_DENIED (router.api_keys_file: no key, or a
// key without admin: true), UNAVAILABLE. A bad flag or argument: exit 2.
#ifndef TANDEM_TOOLS_ROLE_H_
#define TANDEM_TOOLS_ROLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/common.pb.h"

namespace tandem::cli {

struct RoleOptions {
  std::string router = "127.0.0.1:50051";
  std::string api_key;  // --api-key, else $TANDEM_API_KEY
  // The change waits for the drain (router.role_drain_timeout_ms) and the
  // worker's answer: the default leaves room for both.
  int64_t timeout_ms = 30000;
  std::string name;
  tandem::v1::WorkerRole role = tandem::v1::ROLE_UNSPECIFIED;
};

// Parses the arguments after "role". INVALID_ARGUMENT naming the flag or
// argument ("role: expected prefill or decode, got 'x'").
[[nodiscard]] absl::StatusOr<RoleOptions> ParseRoleArgs(const std::vector<std::string>& args);

// The subcommand; returns the exit code.
int RunRole(const std::vector<std::string>& args);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_ROLE_H_
