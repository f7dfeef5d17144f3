// `tandem status`: the router's Generation.GetStatus, one line per process.
//
//   tandem status [--router H:P] [--api-key KEY] [--check-idle] [--json]
//                 [--timeout-ms MS]
//
// --api-key (else $TANDEM_API_KEY) is sent as `authorization: Bearer KEY`
// (a router with router.api_keys_file requires it). With API keys, one
// FormatApiKeyLine per key follows the process lines (usage on this router
// replica); without, nothing more is printed (--json says
// "api_keys_required": false).
//
// Exit status: 0 when the cluster can serve; 1 when the router is
// unreachable or cannot serve; 3 with --check-idle while any worker still
// has KV blocks in use, transfers in flight or running requests (tests poll
// this until a cancelled or finished request has released everything); 4
// with --check-idle when no worker is busy but one did not answer the
// router (WorkerStatus.unreachable: a frozen worker may hold work, so it is
// unknown, not idle; a worker the router has dropped, router.drop_after_ms,
// is no longer listed and no longer counts); 2 for a bad flag.
#ifndef TANDEM_TOOLS_STATUS_H_
#define TANDEM_TOOLS_STATUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "tandem/v1/common.pb.h"

namespace tandem::cli {

struct StatusOptions {
  std::string router = "127.0.0.1:50051";
  std::string api_key;  // --api-key, else $TANDEM_API_KEY; "" = none
  bool check_idle = false;
  bool json = false;
  int64_t timeout_ms = 5000;  // GetStatus deadline
};

// Parses the arguments after "status". INVALID_ARGUMENT naming the flag.
[[nodiscard]] absl::StatusOr<StatusOptions> ParseStatusArgs(const std::vector<std::string>& args);

// "router", "prefill", "decode" or "unspecified".
std::string RoleName(tandem::v1::WorkerRole role);

// One line for one process:
//   "<name> <role> <address> ready|not-ready healthy|unhealthy running=N
//    kv_blocks=USED/TOTAL transfers=N prefill_tokens=N decode_tokens=N
//    kv_sent=BYTES kv_received=BYTES max_batch=N" (one line, single spaces),
// with " kv=<endpoint>" after the address for decode workers that have one.
// A worker the router got no answer from (unreachable) has no numbers:
//   "<name> <role> <address> unreachable unhealthy (no answer to the
//    router's GetStatus: its load is unknown)".
std::string FormatStatusLine(const tandem::v1::WorkerStatus& status);

// The role planner's line (ClusterStatus.planner, router/planner.h;
// FormatClusterStatus prints it after the slo line when the planner runs):
//   "planner: off", or "planner: slo every 5 s, cooldown 30 s; wants 1
//    prefill + 1 decode; flips=N[; last role change 3.2 s ago][; last:
//    <its last decision with inputs>]".
std::string FormatPlannerLine(const tandem::v1::PlannerStatus& planner);

// One line for one API key's usage (ClusterStatus.api_keys):
//   "api_key <name> requests=N refused=N prompt_tokens=N generated_tokens=N
//    in_flight=N tokens_available=N tokens_per_minute=N
//    max_concurrent_requests=N" (one line; a limit of 0 and the bucket of
//    a key without a token limit print as "unlimited"; --json keeps 0).
std::string FormatApiKeyLine(const tandem::v1::ApiKeyUsage& usage);

// The cluster's peer authentication (ClusterStatus.cluster_auth), one line:
//   "cluster: authenticated (HMAC-SHA256)" for "hmac-sha256",
//   "cluster: open (no cluster.secret_file: any host that reaches a worker
//    port can register or call it)" for "open",
//   "cluster: authentication unknown (the router does not report it)" else.
std::string FormatClusterAuthLine(const tandem::v1::ClusterStatus& status);

// The cluster's latency objectives and placement (ClusterStatus.slo and
// .placement: the config's `slo` and conditional.placement), one line:
//   "slo: ttft 2000 ms, tpot 50 ms; placement: slo" (only the objectives
//   set, i.e. > 0), "slo: none; placement: threshold" with neither, and
//   "placement: unknown (the router does not report it)" when the router
//   sends no placement.
std::string FormatSloLine(const tandem::v1::ClusterStatus& status);

// One worker's step-time model (WorkerStatus.step_model), one line indented
// under that worker's line (numbers to 3 significant digits):
//   "  step model: 1.2 ms + 0.05 ms/prefill token + 0.01 ms/1k prefill
//    pairs + 0.3 ms/decode seq + 0.02 ms/1k decode context; prefill 1234
//    tok/s, decode step 3.4 ms, error 0.21 ms, n=57"
// followed, when it has measured KV links, by "; kv link prefill-0 1.2
// GB/s, prefill-1 850 MB/s" (by name).
std::string FormatStepModelLine(const tandem::v1::StepModel& model);

// What `tandem status` prints without --json, each line ending in "\n":
// the router's FormatStatusLine, each worker's (with its
// FormatStepModelLine under it when it reports a step model), the
// FormatSloLine, the FormatClusterAuthLine, then one FormatApiKeyLine per
// key.
std::string FormatClusterStatus(const tandem::v1::ClusterStatus& status);

// Every StepModel field under its proto name; kv_link_bytes_per_s as an
// object {"<prefill worker>": bytes/s} (names sorted).
nlohmann::ordered_json StepModelToJson(const tandem::v1::StepModel& model);

// Every WorkerStatus field under its proto name, numbers as JSON numbers
// (not the strings of proto3's JSON mapping for 64-bit values), role as
// RoleName; a worker's (not the router's) "step_model" is StepModelToJson,
// or null when it reports none.
nlohmann::ordered_json WorkerStatusToJson(const tandem::v1::WorkerStatus& status);
// {"can_serve": bool, "cluster_auth": "hmac-sha256"|"open"|"",
//  "slo": {"ttft_ms": number|null, "tpot_ms": number|null} (null: not set),
//  "placement": "threshold"|"slo" ("" when the router does not report it),
//  "router": {...}, "workers": [{...}, ...],
//  "api_keys_required": bool, "api_keys": [{every ApiKeyUsage field}, ...]}.
nlohmann::ordered_json ClusterStatusToJson(const tandem::v1::ClusterStatus& status);

// Whether the workers of a ClusterStatus hold work.
enum class Idleness {
  kIdle,     // every listed worker answered, none holds anything
  kBusy,     // a worker that answered has kv_blocks_in_use,
             // transfers_in_flight or running_requests above zero
  kUnknown,  // none of those is busy, but a listed worker is unreachable
};

// The idleness of `status.workers()` (the router line is not looked at).
Idleness CheckIdleness(const tandem::v1::ClusterStatus& status);

// The exit statuses of `tandem status` beyond 0, 1 and 2.
inline constexpr int kExitBusy = 3;
inline constexpr int kExitIdleUnknown = 4;

// The exit status for a successful GetStatus: 1 if !can_serve, else with
// check_idle kExitBusy / kExitIdleUnknown per CheckIdleness, else 0.
int StatusExitCode(const tandem::v1::ClusterStatus& status, bool check_idle);

// Runs the subcommand; returns the process exit status.
int RunStatus(const std::vector<std::string>& args);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_STATUS_H_
