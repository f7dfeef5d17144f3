// The steps of one `tandem up` (UpRun, up_run.h) and what they use: the
// supervisor of the children, the derived config's temporary directory.
#include "tools/up_run.h"

#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/server/exit_codes.h"
#include "tools/process_group.h"
#include "tools/router_client.h"
#include "tools/up_cluster.h"

namespace tandem::cli {
namespace {

// The lines the servers announce their bound addresses with, on stdout
// (common/server/server_util.h, router/main.cc).
constexpr char kListeningPrefix[] = "TANDEM_LISTENING ";
constexpr char kHttpListeningPrefix[] = "TANDEM_HTTP_LISTENING ";
constexpr char kMetricsListeningPrefix[] = "TANDEM_METRICS_LISTENING ";

}  // namespace

// What woke the supervisor.
enum class UpEvent { kNothing, kStopSignal, kChildExited };

// The supervisor of one `tandem up`: the children, and a signalfd for
// SIGINT/SIGTERM/SIGHUP/SIGCHLD (blocked in this process, and so in every
// thread gRPC starts later; unblocked again in each child before exec).
class UpSupervisor {
 public:
  explicit UpSupervisor(absl::Duration stop_grace) : stop_grace_(stop_grace) {}
  ~UpSupervisor() {
    if (signal_fd_ >= 0) close(signal_fd_);
  }

  // Blocks SIGINT/SIGTERM/SIGHUP/SIGCHLD in this process and opens the
  // signalfd that reads them. INTERNAL naming sigprocmask or signalfd.
  [[nodiscard]] absl::Status BlockSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&set, sig);
    if (sigprocmask(SIG_BLOCK, &set, nullptr) != 0) {
      return absl::InternalError(absl::StrCat("sigprocmask: ", strerror(errno)));
    }
    signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signal_fd_ < 0) return absl::InternalError(absl::StrCat("signalfd: ", strerror(errno)));
    return absl::OkStatus();
  }

  // The children.
  ProcessGroup& group() { return group_; }
  // The signalfd (ProcessGroup::WaitForAnyLine wakes on it too).
  int signal_fd() const { return signal_fd_; }

  // Waits up to `timeout` for a stop signal or a child's exit, forwarding
  // children's stdout meanwhile. Signals are looked at before exits: a
  // Ctrl-C reaches the children too, and their exit is then expected.
  UpEvent Wait(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      if (UpEvent e = Check(); e != UpEvent::kNothing) return e;
      std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}};
      for (int fd : group_.OutputFds()) fds.push_back({fd, POLLIN, 0});
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return UpEvent::kNothing;
      const int ms = timeout == absl::InfiniteDuration()
                         ? -1
                         : static_cast<int>(
                               absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
      if (poll(fds.data(), fds.size(), ms) < 0 && errno != EINTR) return UpEvent::kNothing;
      group_.ForwardOutput();
    }
  }

  // The exit that Wait() reported.
  const ProcessGroup::Exit& exit() const { return *exit_; }

  // Stops every child (SIGTERM, SIGKILL after the grace period).
  void StopAll() {
    for (const std::string& name : group_.StopAll(stop_grace_)) {
      std::cerr << "tandem: " << name << " did not stop within "
                << absl::FormatDuration(stop_grace_) << "; killed\n";
    }
  }

  // Reports an exit during start-up (the one Wait() reported, or `e`),
  // stops the rest; returns the exit status 1.
  int FailOnChildExit() { return FailOnChildExit(*exit_); }
  int FailOnChildExit(const ProcessGroup::Exit& e) {
    std::cerr << "tandem: " << e.Describe() << " unexpectedly; stopping the cluster\n";
    StopAll();
    return 1;
  }

  // Reports the router's exit and stops the workers; returns the exit
  // status: 0 when the router exited with status 0, else 1.
  int StopOnRouterExit() {
    std::cerr << "tandem: " << exit_->Describe() << "; stopping the cluster\n";
    StopAll();
    const int ws = exit_->wait_status;
    return WIFEXITED(ws) && WEXITSTATUS(ws) == 0 ? 0 : 1;
  }

  // Reports a worker's exit and who still runs; nothing else changes. A
  // worker that lost its device (kExitDeviceLost) is named as such.
  void ReportWorkerExit() {
    std::vector<std::string> running;
    for (size_t i = 0; i < group_.size(); ++i) {
      if (group_.running(static_cast<int>(i))) running.push_back(group_.name(static_cast<int>(i)));
    }
    const int ws = exit_->wait_status;
    const bool device_lost = WIFEXITED(ws) && WEXITSTATUS(ws) == kExitDeviceLost;
    std::cerr << "tandem: " << exit_->Describe() << (device_lost ? " (device lost)" : "")
              << "; still running: " << (running.empty() ? "nothing" : absl::StrJoin(running, ", "))
              << "\n";
  }

 private:
  UpEvent Check() {
    signalfd_siginfo info;
    bool stop = false;
    while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
      if (info.ssi_signo != SIGCHLD) {
        stop = true;
        std::cerr << "tandem: received SIG" << sigabbrev_np(static_cast<int>(info.ssi_signo))
                  << ", stopping the cluster\n";
      }
    }
    if (stop) return UpEvent::kStopSignal;
    exit_ = group_.ReapExited();
    return exit_.has_value() ? UpEvent::kChildExited : UpEvent::kNothing;
  }

  const absl::Duration stop_grace_;
  ProcessGroup group_;
  int signal_fd_ = -1;
  std::optional<ProcessGroup::Exit> exit_;
};

// A directory under $TMPDIR (or /tmp) for the resized config, removed with
// its contents when this object goes away.
class UpTempDir {
 public:
  UpTempDir() = default;
  UpTempDir(const UpTempDir&) = delete;
  UpTempDir& operator=(const UpTempDir&) = delete;
  ~UpTempDir() {
    if (path_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  // Creates the directory (mkdtemp); INTERNAL naming the template.
  [[nodiscard]] absl::Status Create() {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/tandem-up-XXXXXX");
    if (mkdtemp(templ.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp ", templ, ": ", strerror(errno)));
    }
    path_ = templ;
    return absl::OkStatus();
  }
  // The directory; "" until Create succeeded.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

namespace {

// Directory of the running executable, where the server binaries live.
[[nodiscard]] absl::StatusOr<std::filesystem::path> SelfDirectory() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return absl::InternalError(absl::StrCat("/proc/self/exe: ", ec.message()));
  return self.parent_path();
}

// Prints "tandem: MESSAGE" on stderr; returns the exit status 1.
int Fail(absl::string_view message) {
  std::cerr << "tandem: " << message << "\n";
  return 1;
}

// Writes --config's text with the worker lists and ports `options` asks
// for (--prefill-workers, --decode-workers, --ephemeral-ports) to
// dir/cluster.yaml; returns that path. Errors name --config or the flags.
[[nodiscard]] absl::StatusOr<std::string> WriteDerivedConfig(const UpOptions& options,
                                                             UpTempDir& dir) {
  std::ifstream in(options.config, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read cluster config '", options.config, "': ", strerror(errno)));
  }
  absl::StatusOr<std::string> resized = text.str();
  if (options.prefill_workers || options.decode_workers) {
    resized = ResizeWorkerLists(*resized, options.prefill_workers, options.decode_workers);
  }
  if (resized.ok() && options.ephemeral_ports) resized = EphemeralPorts(*resized);
  if (!resized.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.config, ": ", resized.status().message()));
  }
  if (absl::Status s = dir.Create(); !s.ok()) return s;
  const std::string path = dir.path() + "/cluster.yaml";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << "# Written by tandem up from " << options.config << " with"
      << (options.prefill_workers ? absl::StrCat(" --prefill-workers ", *options.prefill_workers)
                                  : "")
      << (options.decode_workers ? absl::StrCat(" --decode-workers ", *options.decode_workers) : "")
      << (options.ephemeral_ports ? " --ephemeral-ports" : "") << "\n"
      << *resized;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return path;
}

// Why `status` does not yet show a cluster ready to be printed: "" when it
// can serve and every name in `workers` is registered and healthy.
std::string NotReadyReason(const tandem::v1::ClusterStatus& status,
                           const std::vector<std::string>& workers) {
  if (!status.can_serve()) return "router reports can_serve=false";
  for (const std::string& name : workers) {
    const tandem::v1::WorkerStatus* found = nullptr;
    for (const tandem::v1::WorkerStatus& w : status.workers()) {
      if (w.name() == name) found = &w;
    }
    if (found == nullptr) return absl::StrCat(name, " has not registered with the router");
    if (!found->healthy()) return absl::StrCat(name, " is not healthy");
  }
  return "";
}

// The role= of a worker's FormatUpProcess line.
const char* RoleName(tandem::v1::WorkerRole role) {
  switch (role) {
    case tandem::v1::ROLE_PREFILL:
      return "prefill";
    case tandem::v1::ROLE_DECODE:
      return "decode";
    default:
      return "router";
  }
}

}  // namespace

UpRun::UpRun(UpOptions options) : options_(std::move(options)) {}

UpRun::~UpRun() = default;

int UpRun::Run() {
  if (std::optional<int> rc = Prepare()) return *rc;
  if (std::optional<int> rc = StartRouter()) return *rc;
  if (std::optional<int> rc = StartWorkers()) return *rc;
  if (std::optional<int> rc = WaitReady()) return *rc;
  PrintReady();
  return Supervise();
}

std::optional<int> UpRun::LoadConfig() {
  absl::StatusOr<ClusterConfig> config = LoadClusterConfig(options_.config);
  if (!config.ok()) return Fail(config.status().message());
  // The file the children read: --config, or its copy with resized lists
  // and/or ephemeral ports.
  config_path_ = options_.config;
  resized_dir_ = std::make_unique<UpTempDir>();
  if (options_.prefill_workers || options_.decode_workers || options_.ephemeral_ports) {
    absl::StatusOr<std::string> path = WriteDerivedConfig(options_, *resized_dir_);
    if (!path.ok()) return Fail(path.status().message());
    config = LoadClusterConfig(*path);
    if (!config.ok()) return Fail(config.status().message());
    config_path_ = *path;
  }
  config_ = *std::move(config);
  return std::nullopt;
}

std::optional<int> UpRun::Prepare() {
  if (std::optional<int> rc = LoadConfig()) return *rc;
  nccl_ = UpNcclSettingsFor(config_, options_.nccl_one_gpu_test);
  if (absl::Status s = CheckNcclOneGpuTest(config_, nccl_); !s.ok()) {
    std::cerr << "tandem up: " << s.message() << kUpUsageHint << "\n";
    return 2;
  }
  std::string notice;
  absl::StatusOr<std::string> model = ResolveUpModel(options_.model, config_, &notice);
  if (!model.ok()) return Fail(model.status().message());
  model_ = *std::move(model);
  if (!notice.empty()) std::cerr << notice << "\n";
  absl::StatusOr<std::filesystem::path> bin_dir = SelfDirectory();
  if (!bin_dir.ok()) return Fail(bin_dir.status().message());
  router_bin_ = *bin_dir / "tandem-router";
  // Every worker runs the one worker binary; --role picks its service.
  worker_bin_ = *bin_dir / "tandem-worker";
  for (const std::string& bin : {router_bin_, worker_bin_}) {
    if (access(bin.c_str(), X_OK) != 0) {
      return Fail(absl::StrCat("cannot run ", bin,
                               " (build its target: cmake --build <dir> --target ",
                               std::filesystem::path(bin).filename().string(), ")"));
    }
  }

  // The readiness polls are Generation.GetStatus calls: with API keys the
  // router answers them only with a key, so check for one before starting.
  absl::StatusOr<std::string> api_key = ResolveApiKey("");  // $TANDEM_API_KEY
  if (!api_key.ok()) return Fail(api_key.status().message());
  api_key_ = *std::move(api_key);
  if (!config_.router.api_keys_file.empty() && api_key_.empty()) {
    return Fail(absl::StrCat("router.api_keys_file is set (", config_.router.api_keys_file,
                             "): set $", kApiKeyEnv,
                             " to one of its keys, which tandem up sends to check readiness"));
  }

  sup_ = std::make_unique<UpSupervisor>(absl::Seconds(config_.shutdown_grace_s + 2));
  if (absl::Status s = sup_->BlockSignals(); !s.ok()) return Fail(s.message());
  std::cerr << "tandem: model " << model_ << ", config " << config_path_
            << (config_path_ == options_.config ? ""
                                                : absl::StrCat(" (from ", options_.config, ")"))
            << ", " << config_.prefill_workers.size() << " prefill and "
            << config_.decode_workers.size() << " decode workers\n";
  if (nccl_.one_gpu_test) {
    std::cerr << "tandem: --" << kNcclOneGpuTestFlag
              << ": each worker gets NCCL_HOSTID=tandem-<name>, NCCL_NET=Socket, "
                 "NCCL_IB_DISABLE=1, NCCL_SOCKET_IFNAME=lo (slow; a functional test only)\n";
  }
  return std::nullopt;
}

std::vector<std::string> UpRun::ArgvFor(const std::string& bin, const std::string& name) const {
  std::vector<std::string> argv = {bin, "--name", name};
  argv.insert(argv.end(), {"--config", config_path_, "--model", model_});
  return argv;
}

std::optional<int> UpRun::OnStartupEvent(UpEvent event) {
  switch (event) {
    case UpEvent::kStopSignal:
      sup_->StopAll();
      return 0;
    case UpEvent::kChildExited:
      return sup_->FailOnChildExit();
    case UpEvent::kNothing:
      break;
  }
  return std::nullopt;
}

std::optional<int> UpRun::WaitAnnouncements(int index,
                                            const std::vector<absl::string_view>& prefixes,
                                            absl::Time deadline, std::vector<std::string>* found) {
  found->assign(prefixes.size(), "");
  std::vector<bool> seen(prefixes.size(), false);
  ProcessGroup& group = sup_->group();
  for (size_t left = prefixes.size(); left > 0;) {
    absl::StatusOr<std::pair<size_t, std::string>> line =
        group.WaitForAnyLine(index, prefixes, deadline - absl::Now(), sup_->signal_fd());
    if (line.ok()) {
      if (!seen[line->first]) --left;
      seen[line->first] = true;
      (*found)[line->first] = std::move(line->second);
      continue;
    }
    if (absl::IsUnavailable(line.status()) && !group.running(index)) {
      // Closed its stdout and exited (WaitForAnyLine reaped it): said as
      // for any child that exits during start-up.
      return sup_->FailOnChildExit(
          {index, group.name(index), group.pid(index), group.wait_status(index)});
    }
    if (!absl::IsCancelled(line.status())) {
      sup_->StopAll();
      return Fail(line.status().message());
    }
    if (std::optional<int> rc = OnStartupEvent(sup_->Wait(absl::ZeroDuration()))) return *rc;
  }
  return std::nullopt;
}

// 1. The router, and the address it really bound.
std::optional<int> UpRun::StartRouter() {
  absl::StatusOr<int> router =
      sup_->group().Spawn(config_.router.name, ArgvFor(router_bin_, config_.router.name));
  if (!router.ok()) return Fail(router.status().message());
  router_ = *router;
  // The router's bound addresses: gRPC, HTTP with router.http_listen,
  // metrics with router.metrics_listen.
  std::vector<absl::string_view> router_lines = {kListeningPrefix};
  if (config_.router.http_listen.has_value()) router_lines.push_back(kHttpListeningPrefix);
  if (config_.router.metrics_listen.has_value()) router_lines.push_back(kMetricsListeningPrefix);
  std::vector<std::string> router_found;
  if (std::optional<int> rc = WaitAnnouncements(
          router_, router_lines, absl::Now() + options_.listen_timeout, &router_found)) {
    return *rc;
  }
  const std::string router_address = router_found[0];
  for (size_t i = 1; i < router_lines.size(); ++i) {
    (router_lines[i] == kHttpListeningPrefix ? http_address_ : router_metrics_address_) =
        router_found[i];
  }
  dial_ = DialAddress(router_address);
  std::cerr << "tandem: router listening on " << router_address << "\n";
  return std::nullopt;
}

// 2. Every worker, before any gRPC channel exists (fork with no threads).
std::optional<int> UpRun::StartWorkers() {
  // Workers sharing a GPU divide engine.gpu_memory_fraction among them.
  std::map<std::string, std::string> gpu_fraction_flag;  // worker name -> value
  for (const GpuShare& share : SplitGpuMemory(config_)) {
    std::cerr << "tandem: " << FormatGpuShare(share, config_.engine.gpu_memory_fraction) << "\n";
    for (const std::string& name : share.workers) {
      gpu_fraction_flag[name] = GpuShareFlagValue(share.fraction);
    }
  }
  for (const auto& [role, workers] : {std::pair{"prefill", &config_.prefill_workers},
                                      std::pair{"decode", &config_.decode_workers}}) {
    for (const WorkerConfig& w : *workers) {
      std::vector<std::string> argv = ArgvFor(worker_bin_, w.name);
      argv.insert(argv.begin() + 1, {"--role", role});
      argv.insert(argv.end(), {"--router", dial_});
      if (auto f = gpu_fraction_flag.find(w.name); f != gpu_fraction_flag.end()) {
        argv.insert(argv.end(), {"--gpu-memory-fraction", f->second});
      }
      ProcessGroup::SpawnOptions spawn;
      spawn.env = WorkerNcclEnv(nccl_, w.name);
      absl::StatusOr<int> child = sup_->group().Spawn(w.name, argv, spawn);
      if (!child.ok()) {
        sup_->StopAll();
        return Fail(child.status().message());
      }
      worker_names_.push_back(w.name);
      if (w.metrics_listen.has_value()) metrics_address_[*child] = "";
    }
  }
  ready_deadline_ = absl::Now() + options_.ready_timeout;
  // Each metrics server's bound address (announced once its model loaded).
  for (auto& [index, address] : metrics_address_) {
    std::vector<std::string> found;
    if (std::optional<int> rc =
            WaitAnnouncements(index, {kMetricsListeningPrefix}, ready_deadline_, &found)) {
      return *rc;
    }
    address = DialAddress(found[0]);
  }
  return std::nullopt;
}

// 3. Readiness as the router sees it.
std::optional<int> UpRun::WaitReady() {
  stub_ = MakeGenerationStub(dial_);
  std::string last_problem = "no answer yet";
  for (;;) {
    grpc::ClientContext context;
    SetApiKey(&context, api_key_);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    status_.Clear();
    grpc::Status rpc = stub_->GetStatus(&context, tandem::v1::GetStatusRequest(), &status_);
    if (rpc.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      // router.api_keys_file is set: no key, or a wrong one, never becomes ready.
      sup_->StopAll();
      std::cerr << GrpcErrorLine(rpc) << " (the router requires an API key: set $" << kApiKeyEnv
                << " to one of router.api_keys_file's keys)\n";
      return 1;
    }
    last_problem = rpc.ok() ? NotReadyReason(status_, worker_names_) : GrpcErrorLine(rpc);
    if (last_problem.empty()) return std::nullopt;
    if (absl::Now() >= ready_deadline_) {
      sup_->StopAll();
      return Fail(absl::StrCat("cluster not ready within ",
                               absl::FormatDuration(options_.ready_timeout), ": ", last_problem));
    }
    if (std::optional<int> rc = OnStartupEvent(sup_->Wait(absl::Milliseconds(200)))) return *rc;
  }
}

// 4. The cluster: every process with its pid and address, then ready.
void UpRun::PrintReady() {
  ProcessGroup& group = sup_->group();
  std::string table = FormatUpProcess(
      {config_.router.name, "router", group.pid(router_), dial_,
       /*kv_endpoint=*/"", http_address_.empty() ? "" : DialAddress(http_address_),
       router_metrics_address_.empty() ? "" : DialAddress(router_metrics_address_)});
  for (size_t i = 1; i < group.size(); ++i) {
    const int index = static_cast<int>(i);
    for (const tandem::v1::WorkerStatus& w : status_.workers()) {
      if (w.name() != group.name(index)) continue;
      const auto metrics = metrics_address_.find(index);
      absl::StrAppend(&table, "\n",
                      FormatUpProcess({w.name(), RoleName(w.role()), group.pid(index), w.address(),
                                       w.kv_endpoint(), /*http_address=*/"",
                                       metrics == metrics_address_.end() ? "" : metrics->second}));
    }
  }
  if (!http_address_.empty()) {
    absl::StrAppend(&table, "\n", kUpHttpPrefix, http_address_,
                    " (/v1/completions, /v1/chat/completions, /metrics)");
  }
  std::printf("%s\n%s%s\n", table.c_str(), kUpReadyPrefix, dial_.c_str());
  std::fflush(stdout);
}

// 5. Supervise until a signal or the router's exit; a worker's exit is
// reported and the rest keep running.
int UpRun::Supervise() {
  for (;;) {
    switch (sup_->Wait(absl::InfiniteDuration())) {
      case UpEvent::kStopSignal:
        sup_->StopAll();
        return 0;
      case UpEvent::kChildExited:
        if (sup_->exit().index == router_) return sup_->StopOnRouterExit();
        sup_->ReportWorkerExit();
        break;
      case UpEvent::kNothing:
        break;
    }
  }
}

}  // namespace tandem::cli
