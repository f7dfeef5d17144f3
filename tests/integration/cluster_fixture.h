// A real Tandem cluster on loopback for integration tests: the built
// tandem-router, tandem-prefill-worker and tandem-decode-worker binaries
// started as child processes from a temporary cluster YAML, plus helpers to
// run other binaries (the tandem CLI, servers that must fail at start-up).
//
// Owns: the temporary directory, the child processes (a cli::ProcessGroup:
// PR_SET_PDEATHSIG, SIGTERM then SIGKILL, so no child outlives the test
// process) and the gRPC stubs to the router and to each worker.
// Does not touch: the processes' internals; every check goes through the
// public API (tandem.v1.Generation) or a worker's own GetStatus.
// Threads: start and stop on the test's main thread (PR_SET_PDEATHSIG fires
// when the forking *thread* exits); the stubs may be used from any thread.
//
// Process conventions (router/main.cc, worker/worker_main.h): each
// server prints one stdout line "TANDEM_LISTENING host:port" once bound;
// its logs go to stderr, which the children share with the test (ctest shows
// them with --output-on-failure).
#ifndef TANDEM_TESTS_INTEGRATION_CLUSTER_FIXTURE_H_
#define TANDEM_TESTS_INTEGRATION_CLUSTER_FIXTURE_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/process_util.h"
#include "tools/process_group.h"

namespace tandem::auth {
class ClusterAuth;  // auth/cluster_auth.h
}  // namespace tandem::auth

namespace tandem::testing {

// Absolute path of a binary built by this build tree: "tandem-router",
// "tandem-prefill-worker", "tandem-decode-worker" or "tandem".
std::string BinaryPath(const std::string& name);

// stories260K.gguf in the shared test data.
std::string ModelPath();

// A fresh directory under the test temp dir, e.g. "/tmp/tandem_it_XXXXXX";
// empty string (and an ADD_FAILURE) if it cannot be created.
std::string MakeTempDir();

// Writes `dir`/slow-27M.gguf with `tandem synth-model` (about 27M
// parameters, stories260K's vocabulary, seed 7): slow enough on the CPU
// that a stream is still running when a test kills its worker. Returns its
// path, or "" (and a test failure) if the tool failed.
std::string WriteSlowModel(const std::string& dir);

// kill(SIGSTOP) returns before every thread of the process has stopped:
// polls /proc/<pid>/stat until its state is T (stopped); false after
// `timeout`.
bool WaitStopped(pid_t pid, absl::Duration timeout);

// A port on 127.0.0.1 that was free a moment ago (0 on failure): for a
// test that needs a fixed port in a config (bound and released here).
int FreePort();

// Writes `contents` to `path` (binary); false on failure.
bool WriteFile(const std::string& path, const std::string& contents);

// Knobs of the cluster YAML (common/cluster_config.h) the tests vary. The
// defaults are the suite's: one prefill and one decode worker, block_size
// 16, 512 KV blocks per worker, max_local_prefill_tokens 32, a 200 ms
// router poll period; the engine.* keys apply to both workers.
struct ClusterOptions {
  // --model of every process, relative to ../shared/models (or absolute).
  std::string model = "stories260K.gguf";
  std::string router_listen = "127.0.0.1:0";  // router.listen
  // Host of both workers' listen and kv_listen, and their advertise
  // (empty: none; the decode worker's KV endpoint follows it).
  std::string worker_listen_host = "127.0.0.1";
  std::string worker_advertise;
  int32_t block_size = 16;                 // engine.block_size, tokens
  int32_t num_kv_blocks = 512;             // engine.num_kv_blocks, blocks per worker
  int32_t max_num_seqs = 64;               // engine.max_num_seqs, sequences
  int32_t threads = 1;                     // engine.threads
  int32_t max_num_batched_tokens = 2048;   // engine.max_num_batched_tokens, per step
  int32_t prefill_chunk_tokens = 512;      // engine.prefill_chunk_tokens, per sequence
  bool enable_prefix_caching = true;       // engine.enable_prefix_caching
  // engine.kv_cache_dtype of both workers (f32, f16, bf16); empty: not
  // written (the device's default, f32 on cpu).
  std::string kv_cache_dtype;
  // conditional.max_local_prefill_tokens; kUnboundedLocalPrefillTokens
  // (common/cluster_config.h) is written as `unbounded`.
  int32_t max_local_prefill_tokens = 32;
  // conditional.placement (threshold, slo); empty: not written (slo when
  // an objective below is set, else threshold).
  std::string placement;
  // slo.ttft_ms and slo.tpot_ms; 0: not written.
  double slo_ttft_ms = 0;
  double slo_tpot_ms = 0;
  int32_t transfer_timeout_ms = 5000;      // kv.transfer_timeout_ms
  int32_t handshake_timeout_ms = 5000;     // kv.handshake_timeout_ms
  int32_t poll_interval_ms = 200;          // router.poll_interval_ms
  int32_t unhealthy_after_missed_polls = 3;
  int32_t rpc_timeout_ms = 2000;           // router.rpc_timeout_ms
  int32_t max_inflight = 512;              // router.max_inflight, Generate streams
  int32_t max_queued = 512;                // router.max_queued, Generate streams
  int32_t drop_after_ms = 30000;           // router.drop_after_ms
  // router.role_drain_timeout_ms (issue #35); < 0: not written (1000).
  int32_t role_drain_timeout_ms = -1;
  // Written as is at the top level: a `planner:` mapping ("" = none).
  std::string planner_yaml;
  // router.policy (kv_aware, least_loaded, round_robin); empty: not
  // written, the config's default (kv_aware).
  std::string router_policy;
  int32_t shutdown_grace_s = 1;            // SIGTERM drain time
  // Workers: prefill-0 .. prefill-(N-1) and decode-0 .. decode-(M-1).
  int32_t num_prefill_workers = 1;
  int32_t num_decode_workers = 1;
  std::string on_prefill_failure = "fail";  // conditional.on_prefill_failure
  int32_t max_prefill_attempts = 2;         // kv.max_prefill_attempts
  int32_t max_migrations = 1;               // router.max_migrations
  // Passed to prefill-0 (only) as --fault-fail-reply true: every Prefill
  // whose transfer succeeded answers UNAVAILABLE (a reply lost after FINAL).
  bool prefill_fault_fail_reply = false;
  // Passed to prefill-0 (only) as --fault-stall-after-frames when >= 0.
  int32_t prefill_fault_stall_after_frames = -1;
  // Passed to prefill-0 / decode-0 (only) as --fault-backend-error when
  // not empty ("internal@3": that worker's 3rd forward step fails).
  std::string prefill_fault_backend_error;
  std::string decode_fault_backend_error;
  // router.api_keys_file (a path; empty: no keys, Generation open) and
  // the key the fixture's own GetStatus calls send (ClusterStatus(), the
  // start-up wait) as `authorization: Bearer <api_key>` (empty: none).
  std::string api_keys_file;
  std::string api_key;
  // router.http_listen (e.g. "127.0.0.1:0"; empty: no HTTP front door) and
  // router.http_max_streams (0: the default).
  std::string http_listen;
  int32_t http_max_streams = 0;
  // router.served_model_name (empty: not set, the GGUF stem) and
  // router.http_max_body_bytes (0: the default).
  std::string served_model_name;
  int32_t http_max_body_bytes = 0;
  int32_t http_read_timeout_ms = 0;  // router.http_read_timeout_ms (0: the default)
  // router.metrics_listen (e.g. "127.0.0.1:0"; empty: none); its bound
  // address is LocalCluster::router_metrics_address().
  std::string router_metrics_listen;
  // cluster.secret_file of every process (empty: none, an open cluster).
  // With one, DecodeStatus() and PrefillStatus() sign their calls
  // (LocalCluster::Sign); calls a test makes on decode_stub() carry no
  // credential unless it signs them.
  std::string secret_file;
  // cluster.accepted_secret_files of every process (with secret_file).
  std::vector<std::string> accepted_secret_files;
  // A process's own cluster.secret_file and accepted_secret_files, by
  // process name ("router", "prefill-0", "decode-1"), instead of the two
  // above: a secret rotation caught in the middle of a rolling step. Such
  // a process reads its own YAML, "<name>.yaml" in the cluster's directory.
  struct Secrets {
    std::string secret_file;
    std::vector<std::string> accepted_secret_files;
  };
  std::map<std::string, Secrets> secrets_by_process;
  // Bound on start-up: every process announced and GetStatus.can_serve.
  absl::Duration start_timeout = absl::Seconds(30);
  // true: the children's stderr (their logs) goes to a file in the
  // cluster's temporary directory instead of the test's stderr, for
  // LocalCluster::CapturedStderr(); it is copied to the test's stderr when
  // the cluster is destroyed.
  bool capture_stderr = false;
  // true: every worker gets metrics_listen "<worker_listen_host>:0" (GET
  // /metrics); each logs "metrics: serving http://HOST:PORT/metrics".
  bool worker_metrics = false;
};

// The YAML text of a cluster with options.num_prefill_workers prefill
// workers "prefill-<i>" and options.num_decode_workers decode workers
// "decode-<i>", all on 127.0.0.1 port 0 (the router on
// options.router_listen).
std::string ClusterYaml(const ClusterOptions& options);

// Polls `done` every `interval` until it returns true or `timeout` passes;
// returns its last value.
bool PollUntil(absl::Duration timeout, const std::function<bool()>& done,
               absl::Duration interval = absl::Milliseconds(10));

class LocalCluster {
 public:
  static constexpr char kPrefillName[] = "prefill-0";
  static constexpr char kDecodeName[] = "decode-0";

  // Writes the YAML, starts the router, reads its address, starts every
  // worker with --router, and waits until the router's GetStatus.can_serve
  // with every worker registered. Errors: whatever stopped a process from announcing
  // itself (UNAVAILABLE with its exit status), DEADLINE_EXCEEDED when the
  // cluster does not become servable within options.start_timeout.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const ClusterOptions& options);

  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;
  ~LocalCluster();  // Stop(), then removes the temporary directory

  // Drops the stubs (stub() is invalid afterwards), then SIGCONT (a test
  // may have stopped a child), SIGTERM, up to `grace` for the children to
  // exit, then SIGKILL. Returns the names of the children that had to be
  // SIGKILLed. Idempotent.
  std::vector<std::string> Stop(absl::Duration grace = absl::Seconds(5));

  const ClusterOptions& options() const { return options_; }
  const std::string& router_address() const { return router_address_; }
  // The router's HTTP host:port (ClusterOptions::http_listen set), else "".
  const std::string& http_address() const { return http_address_; }
  const std::string& router_metrics_address() const { return router_metrics_address_; }
  const std::string& prefill_address() const { return prefill_address_; }
  const std::string& decode_address() const { return decode_address_; }
  pid_t router_pid() const { return group_.pid(router_index_); }
  pid_t prefill_pid() const { return group_.pid(prefill_index_); }
  pid_t decode_pid() const { return group_.pid(decode_index_); }
  // The pid of worker `name` ("prefill-1", "decode-0", ...); -1 if none.
  pid_t worker_pid(const std::string& name) const;
  // Starts worker `name` again (after the test killed it and it exited)
  // with its first command line and waits for its TANDEM_LISTENING line:
  // worker_pid(name) and the addresses are the new process's (a new port;
  // the router learns it from the registration). Errors: NOT_FOUND for an
  // unknown name, whatever stopped it from announcing itself.
  absl::Status RestartWorker(const std::string& name);
  // The process group (exit statuses after Stop()).
  const cli::ProcessGroup& group() const { return group_; }

  // The public API on the router.
  v1::Generation::Stub& stub() { return *stub_; }

  // The decode worker's own API (valid until Stop()), for tests that talk
  // to it as the router does.
  v1::DecodeWorker::Stub& decode_stub() { return *decode_stub_; }

  // With options.secret_file: adds the cluster credential for `request`
  // sent to `method` ("/tandem.v1.DecodeWorker/GetStatus") to `context`, as
  // the router does; no-op in an open cluster.
  void Sign(grpc::ClientContext* context, const std::string& method,
            const google::protobuf::Message& request) const;

  // Generation.GetStatus on the router with a deadline (and
  // options.api_key, when set).
  absl::StatusOr<v1::ClusterStatus> ClusterStatus(
      absl::Duration timeout = absl::Seconds(5));
  // GetStatus straight from a worker (not through the router, whose call
  // waits on every worker).
  absl::StatusOr<v1::WorkerStatus> DecodeStatus(absl::Duration timeout = absl::Seconds(5));
  absl::StatusOr<v1::WorkerStatus> PrefillStatus(absl::Duration timeout = absl::Seconds(5));

  // Everything the children wrote to stderr so far with
  // options.capture_stderr; "" without.
  std::string CapturedStderr() const;

  // True once the router's status shows every worker with
  // kv_blocks_in_use == 0 and transfers_in_flight == 0 (polled for up to
  // `timeout`). `last` receives the last status seen, for messages.
  bool WaitForIdleWorkers(absl::Duration timeout, v1::ClusterStatus* last);

 private:
  explicit LocalCluster(const ClusterOptions& options) : options_(options) {}
  absl::Status StartProcesses();
  // The --config of process `name`: its own YAML when
  // options_.secrets_by_process names it (written on first use), else
  // the shared one. "" when the file cannot be written.
  std::string ConfigPath(const std::string& name);
  // group_.Spawn, the child's stderr going to stderr_path_ when set.
  absl::StatusOr<int> Spawn(const std::string& name, const std::vector<std::string>& argv);
  // Spawns `argv` as `name` and waits for its TANDEM_LISTENING line.
  absl::StatusOr<std::string> SpawnAndWait(const std::string& name,
                                           const std::vector<std::string>& argv,
                                           int* index);

  const ClusterOptions options_;
  std::string dir_;
  std::string config_path_;
  std::string stderr_path_;  // with options_.capture_stderr
  cli::ProcessGroup group_;
  int router_index_ = -1;
  int prefill_index_ = -1;
  int decode_index_ = -1;
  std::map<std::string, int> worker_index_;            // name -> group_ index
  std::map<std::string, std::string> worker_address_;  // name -> gRPC host:port
  std::map<std::string, std::vector<std::string>> worker_argv_;  // name -> command line
  std::string router_address_;
  std::string http_address_;
  std::string router_metrics_address_;
  std::string prefill_address_;
  std::string decode_address_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  // options_.secret_file's, or open (shared_ptr: the type is incomplete here).
  std::shared_ptr<const auth::ClusterAuth> auth_;
  std::unique_ptr<v1::DecodeWorker::Stub> decode_stub_;
  std::unique_ptr<v1::PrefillWorker::Stub> prefill_stub_;
};

// Base of test suites that share one cluster: SetUpTestSuite of a derived
// suite calls StartSuiteCluster(options); TearDownTestSuite stops it. A
// start-up failure fails every test of the suite (in SetUp), not the run.
class ClusterSuite : public ::testing::Test {
 protected:
  static void StartSuiteCluster(const ClusterOptions& options);
  static void TearDownTestSuite();
  void SetUp() override;

  // The suite's running cluster (valid inside a test body).
  static LocalCluster& cluster() { return *cluster_; }

 private:
  static LocalCluster* cluster_;
  static absl::Status* start_status_;
};

// A suite sharing one cluster with the default ClusterOptions.
class DefaultClusterSuite : public ClusterSuite {
 protected:
  static void SetUpTestSuite() { StartSuiteCluster(ClusterOptions()); }
};

// Base of tests that each start their own cluster in the test body (fresh
// prefix caches and counters, also when the whole binary runs in one
// process). Use as ASSERT_NO_FATAL_FAILURE(StartCluster(options)); the
// cluster stops when the test ends.
class OwnClusterTest : public ::testing::Test {
 protected:
  // Starts the cluster; a fatal test failure naming the error otherwise.
  void StartCluster(const ClusterOptions& options);
  // Stops the running cluster, if any (before starting another one).
  void StopCluster() { cluster_.reset(); }

  // The running cluster (valid after StartCluster succeeded).
  LocalCluster& cluster() { return *cluster_; }

 private:
  std::unique_ptr<LocalCluster> cluster_;
};

// An OwnClusterTest whose model (model_) is WriteSlowModel's in a fresh
// temporary directory (dir_, removed after the cluster stops): streams
// that are still running when the test acts on a worker.
class SlowModelClusterTest : public OwnClusterTest {
 protected:
  void SetUp() override;
  void TearDown() override;
  std::string dir_;
  std::string model_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_INTEGRATION_CLUSTER_FIXTURE_H_
