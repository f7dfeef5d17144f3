// `tandem up`: runs a local cluster in the foreground.
//
//   tandem up [--config deploy/local/cluster.yaml] [--model PATH]
//             [--prefill-workers N] [--decode-workers M] [--ready-timeout-s 60]
//             [--ephemeral-ports] [--nccl-one-gpu-test]
//
// Sequence: load the config; with --prefill-workers / --decode-workers,
// write it with resized worker lists (ResizeWorkerLists: workers
// prefill-0..N-1, decode-0..M-1), and with --ephemeral-ports with every
// listen port that is not 0 made 0 (EphemeralPorts, up_cluster.h), to a
// temporary directory, removed at exit, and give the children that file;
// resolve the model (ResolveUpModel);
// start the router (the sibling binary tandem-router next to
// /proc/self/exe) and read its "TANDEM_LISTENING host:port" line, and with
// router.http_listen its "TANDEM_HTTP_LISTENING host:port" (30 s, in any
// order); start every prefill and decode worker of the config as
// `tandem-worker --role prefill|decode --name <entry>` (the sibling binary)
// with --router <that address> (workers that resolve to one cuda:N share its
// memory: each gets --gpu-memory-fraction engine.gpu_memory_fraction / n,
// and one line per such GPU goes to stderr, "tandem: GPU cuda:0: 2 workers
// (prefill-0, decode-0), engine.gpu_memory_fraction 0.90 split as 0.45
// each": SplitGpuMemory, FormatGpuShare in up_cluster.h), read the
// "TANDEM_METRICS_LISTENING host:port" line of each worker with a
// metrics_listen; only then open a gRPC channel and poll
// Generation.GetStatus until can_serve and every worker is registered and
// healthy (sending $TANDEM_API_KEY when set: a router with
// router.api_keys_file answers UNAUTHENTICATED without a valid key, which
// is a start-up failure naming the variable); print on stdout one FormatUpProcess line per process (router
// first, then the workers in config order), then
//   tandem: cluster ready, router at <host:port>
// and supervise:
//   * SIGINT/SIGTERM/SIGHUP: SIGTERM to every child, SIGKILL after
//     shutdown_grace_s + 2 s, exit 0;
//   * a worker exits: one line on stderr, "tandem: decode-1 (pid 123)
//     killed by SIGKILL (signal 9); still running: ..." (or "exited with
//     status N", and "exited with status 75 (device lost)" for a worker
//     whose backend lost its device, kExitDeviceLost); the rest keep
//     running, nothing is restarted;
//   * the router exits: stop the workers as above; exit 0 if the router
//     exited with status 0, else 1.
// Every worker child gets WorkerNcclEnv's variables (up_nccl.h): with
// --nccl-one-gpu-test its own NCCL_HOSTID plus NCCL_NET=Socket,
// NCCL_IB_DISABLE=1, NCCL_SOCKET_IFNAME=lo (refused, exit 2, unless a
// worker runs on cuda:N and kv.transport is nccl or auto:
// CheckNcclOneGpuTest); otherwise NCCL_SOCKET_IFNAME from
// kv.nccl_socket_ifname when set.
// Before the ready line any child's exit is a start-up failure: stop the
// rest, exit 1. Children carry PR_SET_PDEATHSIG, so none survives even a
// SIGKILLed `tandem up`. Exit 2 for a bad flag (one line naming it), 1 for
// any start-up failure (one line on stderr).
#ifndef TANDEM_TOOLS_UP_H_
#define TANDEM_TOOLS_UP_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster_config.h"
#include "tools/process_group.h"

namespace tandem::cli {

struct UpOptions {
  std::string config = kDefaultConfigPath;
  std::string model;                                  // --model; "" = resolution order
  absl::Duration listen_timeout = absl::Seconds(30);  // router's TANDEM_LISTENING line
  absl::Duration ready_timeout = absl::Seconds(60);   // until GetStatus.can_serve
  // --prefill-workers (0..kMaxWorkersPerRole) / --decode-workers
  // (1..kMaxWorkersPerRole); nullopt: the config's list as written.
  std::optional<int> prefill_workers;
  std::optional<int> decode_workers;
  // --nccl-one-gpu-test: the NCCL one-GPU test mode (tools/up_nccl.h).
  bool nccl_one_gpu_test = false;
  // --ephemeral-ports: the children read EphemeralPorts(config).
  bool ephemeral_ports = false;
};

// Parses the arguments after "up". INVALID_ARGUMENT naming the flag:
// "--decode-workers: must be in 1..64, got 0", "--prefill-workers: expected
// an integer, got 'two'".
[[nodiscard]] absl::StatusOr<UpOptions> ParseUpArgs(const std::vector<std::string>& args);

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
[[nodiscard]] absl::StatusOr<std::string> ResolveUpModel(const std::string& flag_value,
                                                         const ClusterConfig& config,
                                                         std::string* notice);

// One process of a running `tandem up` cluster, as printed on stdout once
// it is ready.
struct UpProcess {
  std::string name;  // the --name it runs under
  std::string role;  // "router", "prefill" or "decode"
  pid_t pid = -1;
  std::string address;      // gRPC host:port (the router: the dial address)
  std::string kv_endpoint;  // decode workers: the KV receiver host:port
  // The bound address (DialAddress) of its HTTP front door (the router
  // with router.http_listen) and of its GET /metrics server (a
  // metrics_listen); empty without one.
  std::string http_address;
  std::string metrics_address;
};

// The line prefix of FormatUpProcess.
inline constexpr char kUpProcessPrefix[] = "tandem: process ";

// "tandem: process decode-0 role=decode pid=123 address=127.0.0.1:4000
// kv=127.0.0.1:4001 http=127.0.0.1:8000 metrics=127.0.0.1:9102" (one line,
// no newline; kv=, http= and metrics= only when set, in that order).
std::string FormatUpProcess(const UpProcess& p);

// The inverse of FormatUpProcess for the text after kUpProcessPrefix.
// INVALID_ARGUMENT quoting the text when it is not such a line.
[[nodiscard]] absl::StatusOr<UpProcess> ParseUpProcess(const std::string& text);

// The prefix of the last line `tandem up` prints on stdout once ready,
// followed by the router's dial address.
inline constexpr char kUpReadyPrefix[] = "tandem: cluster ready, router at ";

// The prefix of the line `tandem up` prints before the ready line when the
// router serves HTTP (router.http_listen): "tandem: OpenAI-compatible HTTP
// at http://HOST:PORT (/v1/completions, /v1/chat/completions, /metrics)".
inline constexpr char kUpHttpPrefix[] = "tandem: OpenAI-compatible HTTP at http://";

// What a `tandem up` printed on stdout once its cluster was ready.
struct UpReady {
  std::string router_address;        // host:port to dial
  std::string http_address;          // the router's HTTP host:port; empty without one
  std::vector<UpProcess> processes;  // router first, then the workers in config order
  // The process named `name`, or nullptr.
  const UpProcess* Find(const std::string& name) const;
};

// For tests and tools that start `tandem up` as child `index` of `group`:
// reads its stdout until the ready line (at most `timeout`) and returns the
// process lines (and the HTTP line) before it. Errors: those of
// ProcessGroup::WaitForLine
// (UNAVAILABLE with the exit status when `tandem up` ends first,
// DEADLINE_EXCEEDED), ParseUpProcess's for a malformed line.
[[nodiscard]] absl::StatusOr<UpReady> WaitForUpReady(ProcessGroup& group, int index,
                                                     absl::Duration timeout);

// Runs the subcommand; returns the process exit status (0, 1, 2).
int RunUp(const std::vector<std::string>& args);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_UP_H_
