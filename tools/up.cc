#include "tools/up.h"

#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cluster_config.h"
#include "tools/cli_args.h"
#include "tools/process_group.h"
#include "tools/router_client.h"
#include "tools/synth_model.h"

namespace tandem::cli {
namespace {

constexpr char kUsage[] =
    "usage: tandem up [--config deploy/local/cluster.yaml] [--model PATH] [--ready-timeout-s S]\n";
constexpr char kListeningPrefix[] = "TANDEM_LISTENING ";

// What woke the supervisor.
enum class Event { kNothing, kStopSignal, kChildExited };

// The supervisor of one `tandem up`: the children, and a signalfd for
// SIGINT/SIGTERM/SIGHUP/SIGCHLD (blocked in this process, and so in every
// thread gRPC starts later; unblocked again in each child before exec).
class Supervisor {
 public:
  explicit Supervisor(absl::Duration stop_grace) : stop_grace_(stop_grace) {}
  ~Supervisor() {
    if (signal_fd_ >= 0) close(signal_fd_);
  }

  absl::Status BlockSignals() {
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

  ProcessGroup& group() { return group_; }
  int signal_fd() const { return signal_fd_; }

  // Waits up to `timeout` for a stop signal or a child's exit, forwarding
  // children's stdout meanwhile. Signals are looked at before exits: a
  // Ctrl-C reaches the children too, and their exit is then expected.
  Event Wait(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      if (Event e = Check(); e != Event::kNothing) return e;
      std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}};
      for (int fd : group_.OutputFds()) fds.push_back({fd, POLLIN, 0});
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return Event::kNothing;
      const int ms = timeout == absl::InfiniteDuration()
                         ? -1
                         : static_cast<int>(absl::ToInt64Milliseconds(
                               absl::Ceil(left, absl::Milliseconds(1))));
      if (poll(fds.data(), fds.size(), ms) < 0 && errno != EINTR) return Event::kNothing;
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

  // Reports an unexpected exit, stops the rest; returns the exit status 1.
  int FailOnChildExit() {
    std::cerr << "tandem: " << exit_->Describe() << " unexpectedly; stopping the cluster\n";
    StopAll();
    return 1;
  }

 private:
  Event Check() {
    signalfd_siginfo info;
    bool stop = false;
    while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
      if (info.ssi_signo != SIGCHLD) {
        stop = true;
        std::cerr << "tandem: received SIG" << sigabbrev_np(static_cast<int>(info.ssi_signo))
                  << ", stopping the cluster\n";
      }
    }
    if (stop) return Event::kStopSignal;
    exit_ = group_.ReapExited();
    return exit_.has_value() ? Event::kChildExited : Event::kNothing;
  }

  const absl::Duration stop_grace_;
  ProcessGroup group_;
  int signal_fd_ = -1;
  std::optional<ProcessGroup::Exit> exit_;
};

// Directory of the running executable, where the server binaries live.
absl::StatusOr<std::filesystem::path> SelfDirectory() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return absl::InternalError(absl::StrCat("/proc/self/exe: ", ec.message()));
  return self.parent_path();
}

int Fail(absl::string_view message) {
  std::cerr << "tandem: " << message << "\n";
  return 1;
}

}  // namespace

absl::StatusOr<UpOptions> ParseUpArgs(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedArgs> parsed =
      ParseArgs(args, {{"config"}, {"model"}, {"ready-timeout-s"}});
  if (!parsed.ok()) return parsed.status();
  if (!parsed->positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parsed->positional()[0], "'"));
  }
  UpOptions o;
  o.config = parsed->GetString("config", o.config);
  o.model = parsed->GetString("model", "");
  absl::StatusOr<int64_t> ready = parsed->GetInt("ready-timeout-s", 60);
  if (!ready.ok()) return ready.status();
  if (*ready <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--ready-timeout-s: must be > 0, got ", *ready));
  }
  o.ready_timeout = absl::Seconds(*ready);
  return o;
}

std::string DialAddress(const std::string& listening) {
  absl::StatusOr<HostPort> hp = ParseHostPort(listening, "address");
  if (!hp.ok()) return listening;
  if (hp->host == "0.0.0.0") hp->host = "127.0.0.1";
  if (hp->host == "::") hp->host = "::1";
  return hp->ToString();
}

absl::StatusOr<std::string> ResolveUpModel(const std::string& flag_value,
                                           const ClusterConfig& config, std::string* notice) {
  notice->clear();
  absl::StatusOr<std::string> model = ResolveModelPath(flag_value, config);
  if (model.ok() || !absl::IsNotFound(model.status())) return model;
  const char* env = std::getenv("TANDEM_MODEL");
  const bool explicit_choice =
      !flag_value.empty() || (env != nullptr && *env != '\0') || !config.model.empty();
  if (explicit_choice) return model;
  absl::StatusOr<bool> wrote = EnsureSynthModel(OfflineModelOptions(kOfflineModelPath));
  if (!wrote.ok()) return wrote.status();
  *notice = absl::StrCat(
      "tandem: no model found; serving a small synthetic model with random weights "
      "(its text is random): ",
      kOfflineModelPath);
  return std::string(kOfflineModelPath);
}

int RunUp(const std::vector<std::string>& args) {
  absl::StatusOr<UpOptions> options = ParseUpArgs(args);
  if (!options.ok()) {
    std::cerr << "tandem up: " << options.status().message() << "\n" << kUsage;
    return 2;
  }
  absl::StatusOr<ClusterConfig> config = LoadClusterConfig(options->config);
  if (!config.ok()) return Fail(config.status().message());
  std::string notice;
  absl::StatusOr<std::string> model = ResolveUpModel(options->model, *config, &notice);
  if (!model.ok()) return Fail(model.status().message());
  if (!notice.empty()) std::cerr << notice << "\n";
  absl::StatusOr<std::filesystem::path> bin_dir = SelfDirectory();
  if (!bin_dir.ok()) return Fail(bin_dir.status().message());
  const std::string router_bin = *bin_dir / "tandem-router";
  const std::string prefill_bin = *bin_dir / "tandem-prefill-worker";
  const std::string decode_bin = *bin_dir / "tandem-decode-worker";
  for (const std::string& bin : {router_bin, prefill_bin, decode_bin}) {
    if (bin == prefill_bin && config->prefill_workers.empty()) continue;
    if (access(bin.c_str(), X_OK) != 0) {
      return Fail(absl::StrCat("cannot run ", bin, " (build its target: cmake --build <dir> --target ",
                               std::filesystem::path(bin).filename().string(), ")"));
    }
  }

  Supervisor sup(absl::Seconds(config->shutdown_grace_s + 2));
  if (absl::Status s = sup.BlockSignals(); !s.ok()) return Fail(s.message());
  std::cerr << "tandem: model " << *model << ", config " << options->config << "\n";

  // 1. The router, and the address it really bound.
  const std::vector<std::string> common_args = {"--config", options->config, "--model", *model};
  auto argv_for = [&](const std::string& bin, const std::string& name) {
    std::vector<std::string> argv = {bin, "--name", name};
    argv.insert(argv.end(), common_args.begin(), common_args.end());
    return argv;
  };
  absl::StatusOr<int> router = sup.group().Spawn(config->router.name,
                                                 argv_for(router_bin, config->router.name));
  if (!router.ok()) return Fail(router.status().message());
  std::string router_address;
  const absl::Time listen_deadline = absl::Now() + options->listen_timeout;
  for (;;) {
    absl::StatusOr<std::string> line = sup.group().WaitForLine(
        *router, kListeningPrefix, listen_deadline - absl::Now(), sup.signal_fd());
    if (line.ok()) {
      router_address = *line;
      break;
    }
    if (!absl::IsCancelled(line.status())) {
      sup.StopAll();
      return Fail(line.status().message());
    }
    switch (sup.Wait(absl::ZeroDuration())) {
      case Event::kStopSignal:
        sup.StopAll();
        return 0;
      case Event::kChildExited:
        return sup.FailOnChildExit();
      case Event::kNothing:
        break;  // a SIGCHLD already handled; keep waiting
    }
  }
  const std::string dial = DialAddress(router_address);
  std::cerr << "tandem: router listening on " << router_address << "\n";

  // 2. Every worker, before any gRPC channel exists (fork with no threads).
  for (const auto& [bin, workers] : {std::pair{prefill_bin, &config->prefill_workers},
                                     std::pair{decode_bin, &config->decode_workers}}) {
    for (const WorkerConfig& w : *workers) {
      std::vector<std::string> argv = argv_for(bin, w.name);
      argv.insert(argv.end(), {"--router", dial});
      absl::StatusOr<int> child = sup.group().Spawn(w.name, argv);
      if (!child.ok()) {
        sup.StopAll();
        return Fail(child.status().message());
      }
    }
  }

  // 3. Readiness as the router sees it.
  std::unique_ptr<tandem::v1::Generation::Stub> stub = MakeGenerationStub(dial);
  const absl::Time ready_deadline = absl::Now() + options->ready_timeout;
  std::string last_problem = "no answer yet";
  for (;;) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    tandem::v1::ClusterStatus status;
    grpc::Status rpc = stub->GetStatus(&context, tandem::v1::GetStatusRequest(), &status);
    if (rpc.ok() && status.can_serve()) break;
    last_problem = rpc.ok() ? "router reports can_serve=false" : GrpcErrorLine(rpc);
    if (absl::Now() >= ready_deadline) {
      sup.StopAll();
      return Fail(absl::StrCat("cluster not ready within ",
                               absl::FormatDuration(options->ready_timeout), ": ", last_problem));
    }
    switch (sup.Wait(absl::Milliseconds(200))) {
      case Event::kStopSignal:
        sup.StopAll();
        return 0;
      case Event::kChildExited:
        return sup.FailOnChildExit();
      case Event::kNothing:
        break;
    }
  }
  std::printf("tandem: cluster ready, router at %s\n", dial.c_str());
  std::fflush(stdout);

  // 4. Supervise until a signal or a child's death.
  for (;;) {
    switch (sup.Wait(absl::InfiniteDuration())) {
      case Event::kStopSignal:
        sup.StopAll();
        return 0;
      case Event::kChildExited:
        return sup.FailOnChildExit();
      case Event::kNothing:
        break;
    }
  }
}

}  // namespace tandem::cli
