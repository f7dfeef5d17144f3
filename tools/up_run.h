// One run of `tandem up` (RunUp, tools/up.h) from its parsed options to its
// exit status, one method per step: prepare (config, model, binaries, API
// key, signals), 1. start the router and read its bound addresses, 2. start
// every worker and read each metrics address, 3. wait for readiness as the
// router sees it, 4. print the process table and the ready line, 5.
// supervise. What each step prints and when up exits is tools/up.h's
// header comment and tools/README.md.
//
// Owns: the children of this run (through its supervisor: a ProcessGroup and
// a signalfd), the temporary directory of a derived config, the gRPC stub it
// polls readiness with. Does not touch: the servers' flags beyond the fixed
// convention (--config --name --model [--router] [--role]
// [--gpu-memory-fraction]), the config schema (common/cluster_config).
// Threads: single-threaded; it forks every child before creating any gRPC
// channel, from the thread that runs it (PDEATHSIG follows the forking
// thread), and blocks SIGINT/SIGTERM/SIGHUP/SIGCHLD in the process for good.
#ifndef TANDEM_TOOLS_UP_RUN_H_
#define TANDEM_TOOLS_UP_RUN_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/cluster_config.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tools/up.h"
#include "tools/up_nccl.h"

namespace tandem::cli {

// Appended to a bad flag's line: "tandem up: --decode-workers: must be in
// 1..64, got 0 (usage: tandem up --help)".
inline constexpr char kUpUsageHint[] = " (usage: tandem up --help)";

// Defined in up_run.cc: what woke the supervisor, the supervisor itself, and
// the temporary directory of a derived config.
enum class UpEvent;
class UpSupervisor;
class UpTempDir;

// The state of one `tandem up` and its steps. Each step returning
// std::optional<int> returns the exit status when up must end there
// (nullopt: go on); it has said why on stderr and stopped what it started.
class UpRun {
 public:
  // `options` as ParseUpArgs returned them (already valid as flags).
  explicit UpRun(UpOptions options);
  UpRun(const UpRun&) = delete;
  UpRun& operator=(const UpRun&) = delete;
  // Stops whatever still runs (ProcessGroup's destructor), then removes the
  // derived config's directory.
  ~UpRun();

  // Runs every step in order; returns the exit status (0, 1, 2).
  int Run();

 private:
  // Loads --config (and writes its derived copy), checks
  // --nccl-one-gpu-test, resolves the model, finds the sibling binaries and
  // $TANDEM_API_KEY, blocks the signals, prints the "tandem: model ..."
  // line. Exit 2 for a refused --nccl-one-gpu-test, else 1.
  std::optional<int> Prepare();
  // Prepare's first part: config_ and config_path_. Exit 1.
  std::optional<int> LoadConfig();
  // 1. Starts the router and reads its TANDEM_LISTENING line (and the HTTP
  // and metrics ones its config asks for) within options_.listen_timeout.
  std::optional<int> StartRouter();
  // 2. Starts every worker (prefill, then decode, in config order), then
  // reads the bound address of each one with a metrics_listen.
  std::optional<int> StartWorkers();
  // 3. Polls Generation.GetStatus until the cluster can serve and every
  // worker is registered and healthy, or ready_deadline_.
  std::optional<int> WaitReady();
  // 4. Prints the process table, the HTTP line (with router.http_listen)
  // and the ready line on stdout.
  void PrintReady();
  // 5. Waits for a stop signal or the router's exit (a worker's exit is
  // reported); returns the exit status.
  int Supervise();

  // During start-up: a stop signal stops everything (0), a child's exit
  // fails up (1); nothing: nullopt, keep waiting.
  std::optional<int> OnStartupEvent(UpEvent event);
  // Reads child `index`'s stdout until it has announced each of `prefixes`
  // (in any order); (*found)[i] is the address after prefixes[i]. An exit
  // status when up must end: the child exited (its own error is on stderr
  // above), a stop signal, no announcement by `deadline`.
  std::optional<int> WaitAnnouncements(int index, const std::vector<absl::string_view>& prefixes,
                                       absl::Time deadline, std::vector<std::string>* found);
  // The argv of a server child: bin --name NAME --config F --model PATH.
  std::vector<std::string> ArgvFor(const std::string& bin, const std::string& name) const;

  // Members are destroyed in reverse order: the stub, then the supervisor
  // (stopping any child left), then the derived config's directory.

  // Const after construction.
  const UpOptions options_;

  // Set by Prepare.
  ClusterConfig config_;
  std::string config_path_;                 // what the children read: --config or its derived copy
  std::unique_ptr<UpTempDir> resized_dir_;  // the derived copy's directory, if any
  UpNcclSettings nccl_;
  std::string model_;
  std::string router_bin_;  // tandem-router next to /proc/self/exe
  std::string worker_bin_;  // tandem-worker: every worker; --role picks its service
  std::string api_key_;     // $TANDEM_API_KEY, "" when unset
  std::unique_ptr<UpSupervisor> sup_;

  // Set by StartRouter.
  int router_ = -1;                     // the router's child index
  std::string dial_;                    // the router's gRPC address to dial
  std::string http_address_;            // as announced; "" without router.http_listen
  std::string router_metrics_address_;  // as announced; "" without router.metrics_listen

  // Set by StartWorkers.
  std::vector<std::string> worker_names_;       // in config order
  std::map<int, std::string> metrics_address_;  // child index -> bound address to dial
  absl::Time ready_deadline_ = absl::InfinitePast();

  // Set by WaitReady.
  std::unique_ptr<tandem::v1::Generation::Stub> stub_;
  tandem::v1::ClusterStatus status_;  // the answer that showed the cluster ready
};

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_UP_RUN_H_
