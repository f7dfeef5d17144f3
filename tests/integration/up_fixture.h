// A cluster started the way users start one: the built `tandem up` binary
// with --prefill-workers N --decode-workers M on a temporary config, for
// integration tests that kill, stop or watch individual workers (failover).
//
// Owns: a temporary directory (the config `tandem up` resizes, its stderr
// file), the `tandem up` process (a cli::ProcessGroup of one: PDEATHSIG, so
// it never outlives the test process, and its own children never outlive
// it) and a gRPC stub to the router. Does not touch: the children, except
// through their pids (kill(2) from the test) and the public API.
// Threads: start and stop on the test's main thread (PR_SET_PDEATHSIG fires
// when the forking *thread* exits); the stub may be used from any thread.
//
// The processes and their pids come from the table `tandem up` prints on
// stdout before its ready line (cli::WaitForUpReady); `tandem up`'s stderr
// (its own lines, e.g. "tandem: decode-1 (pid 123) killed by SIGKILL
// (signal 9); still running: ...", and the children's logs) goes to a file,
// read by Stderr() / WaitForStderr() and copied to the test's stderr when a
// test failed.
#ifndef TANDEM_TESTS_INTEGRATION_UP_FIXTURE_H_
#define TANDEM_TESTS_INTEGRATION_UP_FIXTURE_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tests/integration/cluster_fixture.h"
#include "tools/process_group.h"
#include "tools/up.h"

namespace tandem::testing {

struct UpClusterOptions {
  // --prefill-workers / --decode-workers; nullopt: the flag is not given
  // (the config's lists as written).
  std::optional<int> prefill_workers = 2;
  std::optional<int> decode_workers = 2;
  // The config `tandem up` resizes: ClusterYaml(cluster) (its one prefill
  // and one decode entry are the templates), unless config_yaml is set.
  // cluster.model is the --model (relative to ../shared/models, or absolute).
  ClusterOptions cluster;
  std::string config_yaml;
  std::vector<std::string> extra_args;  // more flags for `tandem up`
  // Until the ready line: every worker registered and healthy.
  absl::Duration start_timeout = absl::Seconds(45);
};

class UpCluster {
 public:
  // Writes the config, runs `tandem up --config F --model M
  // [--prefill-workers N] [--decode-workers M] ...` and reads its table up
  // to the ready line. Errors: cli::WaitForUpReady's (UNAVAILABLE with the exit
  // status and the end of tandem up's stderr when it exits first,
  // DEADLINE_EXCEEDED), INTERNAL for the temporary files.
  static absl::StatusOr<std::unique_ptr<UpCluster>> Start(const UpClusterOptions& options);

  UpCluster(const UpCluster&) = delete;
  UpCluster& operator=(const UpCluster&) = delete;
  // Stop(); copies tandem up's stderr to the test's when the test failed;
  // removes the temporary directory.
  ~UpCluster();

  // Drops the stub, SIGTERMs `tandem up` and waits up to `timeout` for it
  // (it stops its children first); SIGKILL after that. Returns its exit as
  // cli::DescribeWaitStatus says it ("exited with status 0"). Idempotent
  // (later calls return the same).
  std::string Stop(absl::Duration timeout = absl::Seconds(20));

  // Waits up to `timeout` for `tandem up` to exit on its own (e.g. after
  // its router died); its exit as DescribeWaitStatus says it, nullopt
  // while it still runs.
  std::optional<std::string> WaitForExit(absl::Duration timeout);

  pid_t up_pid() const { return group_.pid(0); }
  // The pid of the process named `name` ("router", "prefill-0",
  // "decode-1", ...) from tandem up's table; -1 for an unknown name.
  pid_t pid(const std::string& name) const;
  // Every process of the table: router first, then the workers in config
  // order (prefill-0.., decode-0..), with role, pid, address, kv endpoint,
  // and the bound HTTP and metrics addresses.
  const std::vector<cli::UpProcess>& processes() const { return ready_.processes; }
  const std::string& router_address() const { return ready_.router_address; }
  // The router's HTTP host:port from tandem up's table; empty without
  // router.http_listen.
  const std::string& http_address() const { return ready_.http_address; }
  // The config given to `tandem up` (the children read its resized copy,
  // which `tandem up` removes when it exits).
  const std::string& config_path() const { return config_path_; }

  // The public API on the router (valid until Stop()).
  v1::Generation::Stub& stub() { return *stub_; }
  // Generation.GetStatus on the router with a deadline.
  absl::StatusOr<v1::ClusterStatus> ClusterStatus(absl::Duration timeout = absl::Seconds(5));

  // Everything `tandem up` and its children wrote to stderr so far.
  std::string Stderr() const;
  // True once Stderr() contains `text` (polled for up to `timeout`).
  bool WaitForStderr(const std::string& text, absl::Duration timeout) const;

 private:
  UpCluster() = default;
  absl::Status StartProcess(const UpClusterOptions& options);

  std::string dir_;
  std::string config_path_;
  std::string stderr_path_;
  cli::ProcessGroup group_;  // `tandem up` alone, index 0
  cli::UpReady ready_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::optional<std::string> exit_;  // once reaped
};

// "PID is gone": kill(pid, 0) fails with ESRCH (neither running nor a
// zombie waiting for its parent).
bool ProcessGone(pid_t pid);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_INTEGRATION_UP_FIXTURE_H_
