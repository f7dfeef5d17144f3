// `tandem up`: runs a local cluster in the foreground.
//
//   tandem up [--config deploy/local/cluster.yaml] [--model PATH]
//             [--ready-timeout-s 60]
//
// Sequence: load the config; resolve the model (ResolveUpModel); start the
// router (the sibling binary tandem-router next to /proc/self/exe) and read
// its "TANDEM_LISTENING host:port" line (30 s); start every prefill and
// decode worker of the config with --router <that address>; only then open
// a gRPC channel and poll Generation.GetStatus until can_serve; print
//   tandem: cluster ready, router at <host:port>
// as the only line on stdout; supervise. SIGINT/SIGTERM/SIGHUP: SIGTERM to
// every child, SIGKILL after shutdown_grace_s + 2 s, exit 0. A child that
// exits on its own: say which and how, stop the rest, exit 1. Children carry
// PR_SET_PDEATHSIG, so none survives even a SIGKILLed `tandem up`.
// Exit 2 for a bad flag, 1 for any start-up failure (one line on stderr).
#ifndef TANDEM_TOOLS_UP_H_
#define TANDEM_TOOLS_UP_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster_config.h"

namespace tandem::cli {

struct UpOptions {
  std::string config = "deploy/local/cluster.yaml";
  std::string model;                                  // --model; "" = resolution order
  absl::Duration listen_timeout = absl::Seconds(30);  // router's TANDEM_LISTENING line
  absl::Duration ready_timeout = absl::Seconds(60);   // until GetStatus.can_serve
};

// Parses the arguments after "up". INVALID_ARGUMENT naming the flag.
absl::StatusOr<UpOptions> ParseUpArgs(const std::vector<std::string>& args);

// The address to dial for a process listening on `listening` ("host:port"):
// the wildcard hosts 0.0.0.0 and :: become 127.0.0.1 and ::1; anything else
// (including text that is not host:port) is returned unchanged.
std::string DialAddress(const std::string& listening);

// Where the offline path keeps its synthetic model, relative to the
// current directory.
inline constexpr char kOfflineModelPath[] = "models/tandem-synthetic-byte.gguf";

// The model `tandem up` serves: ResolveModelPath(flag_value, config), except
// that when nothing was chosen explicitly (empty flag, $TANDEM_MODEL unset
// or empty, no `model:` in the config) and neither default exists, it is the
// offline path: EnsureSynthModel(OfflineModelOptions(kOfflineModelPath))
// (written once, reused while its bytes are right) and `*notice` is set to
// the one line to print on stderr,
//   tandem: no model found; serving a small synthetic model with random
//   weights (its text is random): models/tandem-synthetic-byte.gguf
// (one line). `*notice` is "" otherwise. Errors: ResolveModelPath's
// NOT_FOUND for an explicit choice that does not exist; those of
// EnsureSynthModel.
absl::StatusOr<std::string> ResolveUpModel(const std::string& flag_value,
                                           const ClusterConfig& config, std::string* notice);

// Runs the subcommand; returns the process exit status (0, 1, 2).
int RunUp(const std::vector<std::string>& args);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_UP_H_
