#include "tests/integration/cluster_fixture.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "auth/cluster_auth.h"
#include "common/cluster_config.h"
#include "tests/test_util.h"

namespace tandem::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kListening[] = "TANDEM_LISTENING ";

// A channel with a short reconnect backoff (DESIGN.md: ~100 ms initial,
// ~1 s max), so a peer that comes up a moment later is reached at once.
// GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is left at gRPC's default on purpose:
// gRPC uses it as the minimum *connect timeout* (subchannel.cc), and at
// 100 ms a loopback connect on a loaded machine is abandoned ("tcp
// handshaker shutdown") and calls fail with UNAVAILABLE.
std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

void SetTimeout(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

std::string BinaryPath(const std::string& name) {
  return absl::StrCat(TANDEM_BINARY_DIR, "/", name);
}

std::string ModelPath() { return SharedPath("models/stories260K.gguf"); }

std::string MakeTempDir() {
  std::string templ = (fs::path(::testing::TempDir()) / "tandem_it_XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << templ << ": " << strerror(errno);
    return "";
  }
  return templ;
}

std::string WriteSlowModel(const std::string& dir) {
  const std::string path = dir + "/slow-27M.gguf";
  const ProcessResult made = RunProcess(
      {BinaryPath("tandem"), "synth-model", "--out", path, "--vocab-from", ModelPath(), "--dim",
       "512", "--layers", "8", "--heads", "8", "--ff", "1536", "--context", "1024", "--seed", "7"},
      absl::Seconds(120));
  if (!made.exited || made.exit_code != 0) {
    ADD_FAILURE() << "tandem synth-model: " << made.Describe();
    return "";
  }
  return path;
}

bool WaitStopped(pid_t pid, absl::Duration timeout) {
  return PollUntil(timeout, [pid] {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    // "pid (comm) state ...": comm may hold spaces and parentheses.
    const size_t paren = line.rfind(')');
    return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T';
  });
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

bool WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  return static_cast<bool>(out);
}

namespace {

// The prefill_workers and decode_workers lists of ClusterYaml.
std::string WorkerEntries(const ClusterOptions& o) {
  // Keys every entry gets (advertise, metrics_listen).
  std::string per_worker =
      o.worker_advertise.empty() ? "" : absl::StrCat("    advertise: ", o.worker_advertise, "\n");
  if (o.worker_metrics) {
    absl::StrAppend(&per_worker, "    metrics_listen: ", o.worker_listen_host, ":0\n");
  }
  std::string yaml = "prefill_workers:\n";
  if (o.num_prefill_workers == 0) yaml = "prefill_workers: []\n";
  for (int i = 0; i < o.num_prefill_workers; ++i) {
    absl::StrAppend(&yaml, "  - name: prefill-", i, "\n    listen: ", o.worker_listen_host,
                    ":0\n", per_worker);
  }
  absl::StrAppend(&yaml, "decode_workers:\n");
  for (int i = 0; i < o.num_decode_workers; ++i) {
    absl::StrAppend(&yaml, "  - name: decode-", i, "\n    listen: ", o.worker_listen_host,
                    ":0\n", per_worker, "    kv_listen: ", o.worker_listen_host, ":0\n");
  }
  return yaml;
}

}  // namespace

std::string ClusterYaml(const ClusterOptions& o) {
  return absl::StrCat(
      "router:\n"
      "  name: router\n"
      "  listen: ", o.router_listen, "\n",
      "  poll_interval_ms: ", o.poll_interval_ms, "\n",
      "  unhealthy_after_missed_polls: ", o.unhealthy_after_missed_polls, "\n",
      "  rpc_timeout_ms: ", o.rpc_timeout_ms, "\n",
      "  max_migrations: ", o.max_migrations, "\n",
      "  max_inflight: ", o.max_inflight, "\n",
      "  max_queued: ", o.max_queued, "\n",
      "  drop_after_ms: ", o.drop_after_ms, "\n",
      o.role_drain_timeout_ms >= 0
          ? absl::StrCat("  role_drain_timeout_ms: ", o.role_drain_timeout_ms, "\n")
          : "",
      o.api_keys_file.empty() ? "" : absl::StrCat("  api_keys_file: ", o.api_keys_file, "\n"),
      o.router_policy.empty() ? "" : absl::StrCat("  policy: ", o.router_policy, "\n"),
      o.http_listen.empty() ? "" : absl::StrCat("  http_listen: ", o.http_listen, "\n"),
      o.router_metrics_listen.empty()
          ? ""
          : absl::StrCat("  metrics_listen: ", o.router_metrics_listen, "\n"),
      o.http_max_streams > 0 ? absl::StrCat("  http_max_streams: ", o.http_max_streams, "\n") : "",
      o.served_model_name.empty()
          ? ""
          : absl::StrCat("  served_model_name: ", o.served_model_name, "\n"),
      o.http_max_body_bytes > 0
          ? absl::StrCat("  http_max_body_bytes: ", o.http_max_body_bytes, "\n")
          : "",
      o.http_read_timeout_ms > 0
          ? absl::StrCat("  http_read_timeout_ms: ", o.http_read_timeout_ms, "\n")
          : "",
      WorkerEntries(o),
      "engine:\n"
      "  block_size: ", o.block_size, "\n",
      "  num_kv_blocks: ", o.num_kv_blocks, "\n",
      "  max_num_seqs: ", o.max_num_seqs, "\n",
      "  threads: ", o.threads, "\n",
      "  max_num_batched_tokens: ", o.max_num_batched_tokens, "\n",
      "  prefill_chunk_tokens: ", o.prefill_chunk_tokens, "\n",
      "  enable_prefix_caching: ", o.enable_prefix_caching ? "true" : "false", "\n",
      o.kv_cache_dtype.empty() ? "" : absl::StrCat("  kv_cache_dtype: ", o.kv_cache_dtype, "\n"),
      "conditional:\n"
      "  max_local_prefill_tokens: ",
      o.max_local_prefill_tokens == kUnboundedLocalPrefillTokens
          ? std::string("unbounded")
          : absl::StrCat(o.max_local_prefill_tokens),
      "\n",
      "  on_prefill_failure: ", o.on_prefill_failure, "\n",
      o.placement.empty() ? "" : absl::StrCat("  placement: ", o.placement, "\n"),
      o.slo_ttft_ms > 0 || o.slo_tpot_ms > 0 ? "slo:\n" : "",
      o.slo_ttft_ms > 0 ? absl::StrCat("  ttft_ms: ", o.slo_ttft_ms, "\n") : "",
      o.slo_tpot_ms > 0 ? absl::StrCat("  tpot_ms: ", o.slo_tpot_ms, "\n") : "",
      "kv:\n"
      "  max_prefill_attempts: ", o.max_prefill_attempts, "\n",
      "  transfer_timeout_ms: ", o.transfer_timeout_ms, "\n",
      "  handshake_timeout_ms: ", o.handshake_timeout_ms, "\n",
      "shutdown_grace_s: ", o.shutdown_grace_s, "\n",
      o.planner_yaml,
      o.secret_file.empty() ? "" : absl::StrCat("cluster:\n  secret_file: ", o.secret_file, "\n"),
      o.accepted_secret_files.empty()
          ? ""
          : absl::StrCat("  accepted_secret_files: [", absl::StrJoin(o.accepted_secret_files, ", "),
                         "]\n"));
}

bool PollUntil(absl::Duration timeout, const std::function<bool()>& done,
               absl::Duration interval) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (done()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(interval);
  }
}

// ---- LocalCluster -----------------------------------------------------------

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const ClusterOptions& options) {
  std::unique_ptr<LocalCluster> cluster(new LocalCluster(options));
  absl::Status s = cluster->StartProcesses();
  if (!s.ok()) return s;
  return cluster;
}

absl::StatusOr<std::string> LocalCluster::SpawnAndWait(const std::string& name,
                                                       const std::vector<std::string>& argv,
                                                       int* index) {
  absl::StatusOr<int> spawned = Spawn(name, argv);
  if (!spawned.ok()) return spawned.status();
  *index = *spawned;
  return group_.WaitForLine(*index, kListening, options_.start_timeout);
}

absl::StatusOr<int> LocalCluster::Spawn(const std::string& name,
                                        const std::vector<std::string>& argv) {
  if (stderr_path_.empty()) return group_.Spawn(name, argv);
  // The child inherits our fd 2 at fork: point it at the file meanwhile.
  const int file = open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (file < 0) return absl::InternalError(absl::StrCat("cannot open ", stderr_path_));
  const int saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 0);
  fflush(stderr);
  dup2(file, STDERR_FILENO);
  absl::StatusOr<int> spawned = group_.Spawn(name, argv);
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(file);
  return spawned;
}

std::string LocalCluster::CapturedStderr() const {
  if (stderr_path_.empty()) return "";
  std::ifstream in(stderr_path_, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::Status LocalCluster::StartProcesses() {
  dir_ = MakeTempDir();
  if (dir_.empty()) return absl::InternalError("cannot create a temporary directory");
  if (options_.capture_stderr) stderr_path_ = dir_ + "/children.stderr";
  config_path_ = dir_ + "/cluster.yaml";
  if (!WriteFile(config_path_, ClusterYaml(options_))) {
    return absl::InternalError(absl::StrCat("cannot write ", config_path_));
  }
  absl::StatusOr<std::unique_ptr<auth::ClusterAuth>> loaded = auth::ClusterAuth::Load(
      options_.secret_file, auth::kDefaultMaxSkewMs, options_.accepted_secret_files);
  if (!loaded.ok()) return loaded.status();
  auth_ = *std::move(loaded);
  const absl::Time start = absl::Now();
  const std::string model = absl::StartsWith(options_.model, "/")
                                ? options_.model
                                : SharedPath("models/" + options_.model);
  const std::vector<std::string> router_argv = {BinaryPath("tandem-router"), "--config",
                                                ConfigPath("router"), "--name", "router",
                                                "--model", model};
  absl::StatusOr<std::string> router;
  if (options_.http_listen.empty() && options_.router_metrics_listen.empty()) {
    router = SpawnAndWait("router", router_argv, &router_index_);
  } else {
    // The metrics line comes first (router/main.cc), then the HTTP one,
    // then the gRPC one.
    absl::StatusOr<int> spawned = Spawn("router", router_argv);
    if (!spawned.ok()) return spawned.status();
    router_index_ = *spawned;
    if (!options_.router_metrics_listen.empty()) {
      absl::StatusOr<std::string> metrics = group_.WaitForLine(
          router_index_, "TANDEM_METRICS_LISTENING ", options_.start_timeout);
      if (!metrics.ok()) return metrics.status();
      router_metrics_address_ = *metrics;
    }
    if (!options_.http_listen.empty()) {
      absl::StatusOr<std::string> http =
          group_.WaitForLine(router_index_, "TANDEM_HTTP_LISTENING ", options_.start_timeout);
      if (!http.ok()) return http.status();
      http_address_ = *http;
    }
    router = group_.WaitForLine(router_index_, kListening, options_.start_timeout);
  }
  if (!router.ok()) return router.status();
  router_address_ = *router;

  // Every worker loads the model concurrently; wait for them afterwards.
  std::vector<std::string> names;
  for (int i = 0; i < options_.num_prefill_workers; ++i) names.push_back(absl::StrCat("prefill-", i));
  for (int i = 0; i < options_.num_decode_workers; ++i) names.push_back(absl::StrCat("decode-", i));
  for (const std::string& name : names) {
    const bool prefill = absl::StartsWith(name, "prefill-");
    std::vector<std::string> argv = {
        BinaryPath(prefill ? "tandem-prefill-worker" : "tandem-decode-worker"),
        "--config", ConfigPath(name), "--name", name, "--model", model, "--router",
        router_address_};
    if (name == kPrefillName && options_.prefill_fault_fail_reply) {
      argv.push_back("--fault-fail-reply");
      argv.push_back("true");
    }
    if (name == kPrefillName && options_.prefill_fault_stall_after_frames >= 0) {
      argv.push_back("--fault-stall-after-frames");
      argv.push_back(absl::StrCat(options_.prefill_fault_stall_after_frames));
    }
    const std::string& backend_fault =
        name == kPrefillName ? options_.prefill_fault_backend_error
        : name == kDecodeName ? options_.decode_fault_backend_error
                              : std::string();
    if (!backend_fault.empty()) {
      argv.push_back("--fault-backend-error");
      argv.push_back(backend_fault);
    }
    worker_argv_[name] = argv;
    absl::StatusOr<int> spawned = Spawn(name, argv);
    if (!spawned.ok()) return spawned.status();
    worker_index_[name] = *spawned;
  }
  for (const std::string& name : names) {
    absl::StatusOr<std::string> address =
        group_.WaitForLine(worker_index_[name], kListening, options_.start_timeout);
    if (!address.ok()) return address.status();
    worker_address_[name] = *address;
  }
  if (options_.num_prefill_workers > 0) {
    prefill_index_ = worker_index_[kPrefillName];
    prefill_address_ = worker_address_[kPrefillName];
  }
  decode_index_ = worker_index_[kDecodeName];
  decode_address_ = worker_address_[kDecodeName];

  stub_ = v1::Generation::NewStub(Channel(router_address_));
  decode_stub_ = v1::DecodeWorker::NewStub(Channel(decode_address_));
  if (!prefill_address_.empty()) {
    prefill_stub_ = v1::PrefillWorker::NewStub(Channel(prefill_address_));
  }

  absl::Status last = absl::UnavailableError("no GetStatus answer yet");
  const bool serving = PollUntil(
      options_.start_timeout - (absl::Now() - start),
      [&] {
        absl::StatusOr<v1::ClusterStatus> status = ClusterStatus(absl::Seconds(2));
        if (!status.ok()) {
          last = status.status();
          return false;
        }
        last = absl::UnavailableError(status->DebugString());
        return status->can_serve() && status->workers_size() == static_cast<int>(names.size());
      },
      absl::Milliseconds(20));
  if (!serving) {
    return absl::DeadlineExceededError(
        absl::StrCat("the cluster did not become servable within ",
                     absl::FormatDuration(options_.start_timeout), "; last: ", last.ToString()));
  }
  return absl::OkStatus();
}

std::string LocalCluster::ConfigPath(const std::string& name) {
  auto own = options_.secrets_by_process.find(name);
  if (own == options_.secrets_by_process.end()) return config_path_;
  ClusterOptions o = options_;
  o.secret_file = own->second.secret_file;
  o.accepted_secret_files = own->second.accepted_secret_files;
  const std::string path = absl::StrCat(dir_, "/", name, ".yaml");
  if (!WriteFile(path, ClusterYaml(o))) {
    ADD_FAILURE() << "cannot write " << path;
    return "";
  }
  return path;
}

absl::Status LocalCluster::RestartWorker(const std::string& name) {
  auto argv = worker_argv_.find(name);
  if (argv == worker_argv_.end()) return absl::NotFoundError(absl::StrCat("no worker ", name));
  int index = -1;
  absl::StatusOr<std::string> address = SpawnAndWait(name, argv->second, &index);
  if (!address.ok()) return address.status();
  worker_index_[name] = index;
  worker_address_[name] = *address;
  if (name == kDecodeName) {
    decode_index_ = index;
    decode_address_ = *address;
    decode_stub_ = v1::DecodeWorker::NewStub(Channel(decode_address_));
  } else if (name == kPrefillName) {
    prefill_index_ = index;
    prefill_address_ = *address;
    prefill_stub_ = v1::PrefillWorker::NewStub(Channel(prefill_address_));
  }
  return absl::OkStatus();
}

LocalCluster::~LocalCluster() {
  Stop();
  if (!stderr_path_.empty()) {
    std::cerr << "---- the cluster's stderr ----\n" << CapturedStderr() << "---- end ----\n";
  }
  if (!dir_.empty()) {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
}

pid_t LocalCluster::worker_pid(const std::string& name) const {
  auto it = worker_index_.find(name);
  return it == worker_index_.end() ? -1 : group_.pid(it->second);
}

std::vector<std::string> LocalCluster::Stop(absl::Duration grace) {
  // A SIGSTOPped child would not act on SIGTERM.
  for (size_t i = 0; i < group_.size(); ++i) {
    if (group_.running(static_cast<int>(i))) kill(group_.pid(static_cast<int>(i)), SIGCONT);
  }
  // Close our connections first: a gRPC server's Shutdown waits (up to its
  // deadline, 1 s in the servers) for connected clients to go away, and an
  // idle client channel in this process may not notice the GOAWAY.
  stub_.reset();
  decode_stub_.reset();
  prefill_stub_.reset();
  return group_.StopAll(grace);
}

absl::StatusOr<v1::ClusterStatus> LocalCluster::ClusterStatus(absl::Duration timeout) {
  if (stub_ == nullptr) return absl::FailedPreconditionError("the cluster is stopped");
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  if (!options_.api_key.empty()) {
    context.AddMetadata("authorization", "Bearer " + options_.api_key);
  }
  v1::ClusterStatus status;
  grpc::Status s = stub_->GetStatus(&context, v1::GetStatusRequest(), &status);
  if (!s.ok()) return FromGrpc(s);
  return status;
}

void LocalCluster::Sign(grpc::ClientContext* context, const std::string& method,
                        const google::protobuf::Message& request) const {
  if (auth_ == nullptr || auth_->open()) return;
  context->AddMetadata(auth::kAuthMetadataKey,
                       auth::FormatCredential(auth_->Sign(method, request.SerializeAsString())));
}

absl::StatusOr<v1::WorkerStatus> LocalCluster::DecodeStatus(absl::Duration timeout) {
  if (decode_stub_ == nullptr) return absl::FailedPreconditionError("the cluster is stopped");
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  v1::WorkerStatus status;
  const v1::GetStatusRequest request;
  Sign(&context, "/tandem.v1.DecodeWorker/GetStatus", request);
  grpc::Status s = decode_stub_->GetStatus(&context, request, &status);
  if (!s.ok()) return FromGrpc(s);
  return status;
}

absl::StatusOr<v1::WorkerStatus> LocalCluster::PrefillStatus(absl::Duration timeout) {
  if (prefill_stub_ == nullptr) return absl::FailedPreconditionError("the cluster is stopped");
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  v1::WorkerStatus status;
  const v1::GetStatusRequest request;
  Sign(&context, "/tandem.v1.PrefillWorker/GetStatus", request);
  grpc::Status s = prefill_stub_->GetStatus(&context, request, &status);
  if (!s.ok()) return FromGrpc(s);
  return status;
}

bool LocalCluster::WaitForIdleWorkers(absl::Duration timeout, v1::ClusterStatus* last) {
  return PollUntil(timeout, [&] {
    absl::StatusOr<v1::ClusterStatus> status = ClusterStatus(absl::Seconds(1));
    if (!status.ok()) return false;
    *last = *status;
    if (status->workers_size() !=
        options_.num_prefill_workers + options_.num_decode_workers) {
      return false;
    }
    for (const v1::WorkerStatus& w : status->workers()) {
      if (!w.healthy() || w.kv_blocks_in_use() != 0 || w.transfers_in_flight() != 0) {
        return false;
      }
    }
    return true;
  });
}

// ---- ClusterSuite -------------------------------------------------------------

LocalCluster* ClusterSuite::cluster_ = nullptr;
absl::Status* ClusterSuite::start_status_ = nullptr;

void ClusterSuite::StartSuiteCluster(const ClusterOptions& options) {
  TearDownTestSuite();
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  start_status_ = new absl::Status(cluster.status());
  if (cluster.ok()) cluster_ = cluster->release();
}

void ClusterSuite::TearDownTestSuite() {
  delete cluster_;
  cluster_ = nullptr;
  delete start_status_;
  start_status_ = nullptr;
}

void ClusterSuite::SetUp() {
  ASSERT_NE(start_status_, nullptr) << "SetUpTestSuite did not call StartSuiteCluster";
  ASSERT_TRUE(start_status_->ok()) << "cluster start-up failed: " << *start_status_;
  ASSERT_NE(cluster_, nullptr);
}

// ---- OwnClusterTest -----------------------------------------------------------

void SlowModelClusterTest::SetUp() {
  dir_ = MakeTempDir();
  model_ = WriteSlowModel(dir_);
  ASSERT_FALSE(model_.empty());
}

void SlowModelClusterTest::TearDown() {
  StopCluster();
  std::filesystem::remove_all(dir_);
}

void OwnClusterTest::StartCluster(const ClusterOptions& options) {
  cluster_.reset();
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << "cluster start-up failed: " << cluster.status();
  cluster_ = std::move(*cluster);
}

}  // namespace tandem::testing
