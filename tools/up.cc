#include "tools/up.h"

#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/cluster_config.h"
#include "common/server/exit_codes.h"
#include "tools/cli_args.h"
#include "tools/process_group.h"
#include "tools/router_client.h"
#include "tools/synth_model.h"
#include "tools/up_cluster.h"
#include "tools/up_nccl.h"

namespace tandem::cli {
namespace {

constexpr char kUsageHint[] = " (usage: tandem up --help)";
// The lines the servers announce their bound addresses with, on stdout
// (common/server/server_util.h, router/main.cc).
constexpr char kListeningPrefix[] = "TANDEM_LISTENING ";
constexpr char kHttpListeningPrefix[] = "TANDEM_HTTP_LISTENING ";
constexpr char kMetricsListeningPrefix[] = "TANDEM_METRICS_LISTENING ";

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
                         : static_cast<int>(
                               absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
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
[[nodiscard]] absl::StatusOr<std::filesystem::path> SelfDirectory() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return absl::InternalError(absl::StrCat("/proc/self/exe: ", ec.message()));
  return self.parent_path();
}

int Fail(absl::string_view message) {
  std::cerr << "tandem: " << message << "\n";
  return 1;
}

// A directory under $TMPDIR (or /tmp) for the resized config, removed with
// its contents when this object goes away.
class TempDir {
 public:
  TempDir() = default;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

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
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Writes --config's text with the worker lists and ports `options` asks
// for (--prefill-workers, --decode-workers, --ephemeral-ports) to
// dir/cluster.yaml; returns that path. Errors name --config or the flags.
[[nodiscard]] absl::StatusOr<std::string> WriteDerivedConfig(const UpOptions& options,
                                                             TempDir& dir) {
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

// Parses one worker-count flag: nullopt when absent; INVALID_ARGUMENT
// naming it when not an integer in [min, kMaxWorkersPerRole].
[[nodiscard]] absl::StatusOr<std::optional<int>> WorkerCount(const ParsedArgs& parsed,
                                                             const std::string& flag, int min) {
  if (!parsed.Has(flag)) return std::optional<int>();
  absl::StatusOr<int64_t> n = parsed.GetInt(flag, 0);
  if (!n.ok()) return n.status();
  if (*n < min || *n > kMaxWorkersPerRole) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": must be in ", min, "..", kMaxWorkersPerRole, ", got ", *n));
  }
  return std::optional<int>(static_cast<int>(*n));
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

[[nodiscard]] absl::StatusOr<UpOptions> ParseUpArgs(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedArgs> parsed =
      ParseArgs(args, {{"config"},
                       {"model"},
                       {"ready-timeout-s"},
                       {"prefill-workers"},
                       {"decode-workers"},
                       {"ephemeral-ports", /*takes_value=*/false},
                       {kNcclOneGpuTestFlag, /*takes_value=*/false}});
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
  absl::StatusOr<std::optional<int>> prefill = WorkerCount(*parsed, "prefill-workers", 0);
  if (!prefill.ok()) return prefill.status();
  o.prefill_workers = *prefill;
  absl::StatusOr<std::optional<int>> decode = WorkerCount(*parsed, "decode-workers", 1);
  if (!decode.ok()) return decode.status();
  o.decode_workers = *decode;
  o.nccl_one_gpu_test = parsed->Has(kNcclOneGpuTestFlag);
  o.ephemeral_ports = parsed->Has("ephemeral-ports");
  return o;
}

std::string FormatUpProcess(const UpProcess& p) {
  std::string line = absl::StrCat(kUpProcessPrefix, p.name, " role=", p.role, " pid=", p.pid,
                                  " address=", p.address);
  for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"kv", &p.kv_endpoint},
                                   {"http", &p.http_address},
                                   {"metrics", &p.metrics_address}}) {
    if (!value->empty()) absl::StrAppend(&line, " ", key, "=", *value);
  }
  return line;
}

[[nodiscard]] absl::StatusOr<UpProcess> ParseUpProcess(const std::string& text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("not a tandem up process line: '", text, "'"));
  };
  const std::vector<std::string> fields = absl::StrSplit(text, ' ');
  if (fields.size() < 4) return bad();
  UpProcess p;
  p.name = fields[0];
  // The keys in FormatUpProcess's order; role, pid and address always, the
  // others only when set.
  std::string UpProcess::*const kFields[] = {&UpProcess::role,         nullptr,
                                             &UpProcess::address,      &UpProcess::kv_endpoint,
                                             &UpProcess::http_address, &UpProcess::metrics_address};
  static constexpr const char* kKeys[] = {"role", "pid", "address", "kv", "http", "metrics"};
  size_t next = 0;  // the first key the next field may have
  for (size_t i = 1; i < fields.size(); ++i) {
    const std::pair<std::string, std::string> kv =
        absl::StrSplit(fields[i], absl::MaxSplits('=', 1));
    while (next < std::size(kKeys) && kv.first != kKeys[next] && next >= 3) ++next;
    if (next >= std::size(kKeys) || kv.first != kKeys[next] || kv.second.empty()) return bad();
    if (kFields[next] != nullptr) {
      p.*kFields[next] = kv.second;
    } else if (!absl::SimpleAtoi(kv.second, &p.pid)) {
      return bad();
    }
    ++next;
  }
  if (p.name.empty() || p.role.empty() || p.address.empty() || p.pid <= 0) return bad();
  return p;
}

std::string DialAddress(const std::string& listening) {
  absl::StatusOr<HostPort> hp = ParseHostPort(listening, "address");
  if (!hp.ok()) return listening;
  if (hp->host == "0.0.0.0") hp->host = "127.0.0.1";
  if (hp->host == "::") hp->host = "::1";
  return hp->ToString();
}

[[nodiscard]] absl::StatusOr<std::string> ResolveUpModel(const std::string& flag_value,
                                                         const ClusterConfig& config,
                                                         std::string* notice) {
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

const UpProcess* UpReady::Find(const std::string& name) const {
  for (const UpProcess& p : processes) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

[[nodiscard]] absl::StatusOr<UpReady> WaitForUpReady(ProcessGroup& group, int index,
                                                     absl::Duration timeout) {
  // Every kind of line (process, HTTP, ready) starts with "tandem: ";
  // nothing else of tandem up goes to its stdout.
  constexpr absl::string_view kLine = "tandem: ";
  const absl::string_view process = absl::string_view(kUpProcessPrefix).substr(kLine.size());
  const absl::string_view ready = absl::string_view(kUpReadyPrefix).substr(kLine.size());
  const absl::string_view http = absl::string_view(kUpHttpPrefix).substr(kLine.size());
  const absl::Time deadline = absl::Now() + timeout;
  UpReady out;
  for (;;) {
    absl::StatusOr<std::string> line = group.WaitForLine(index, kLine, deadline - absl::Now());
    if (!line.ok()) return line.status();
    if (absl::StartsWith(*line, ready)) {
      out.router_address = line->substr(ready.size());
      return out;
    }
    if (absl::StartsWith(*line, http)) {
      const std::string rest = line->substr(http.size());
      out.http_address = rest.substr(0, rest.find(' '));
      continue;
    }
    if (!absl::StartsWith(*line, process)) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected line from tandem up: ", *line));
    }
    absl::StatusOr<UpProcess> p = ParseUpProcess(line->substr(process.size()));
    if (!p.ok()) return p.status();
    out.processes.push_back(*std::move(p));
  }
}

int RunUp(const std::vector<std::string>& args) {
  absl::StatusOr<UpOptions> options = ParseUpArgs(args);
  if (!options.ok()) {
    std::cerr << "tandem up: " << options.status().message() << kUsageHint << "\n";
    return 2;
  }
  absl::StatusOr<ClusterConfig> config = LoadClusterConfig(options->config);
  if (!config.ok()) return Fail(config.status().message());
  // The file the children read: --config, or its copy with resized lists
  // and/or ephemeral ports.
  std::string config_path = options->config;
  TempDir resized_dir;
  if (options->prefill_workers || options->decode_workers || options->ephemeral_ports) {
    absl::StatusOr<std::string> path = WriteDerivedConfig(*options, resized_dir);
    if (!path.ok()) return Fail(path.status().message());
    config = LoadClusterConfig(*path);
    if (!config.ok()) return Fail(config.status().message());
    config_path = *path;
  }
  const UpNcclSettings nccl = UpNcclSettingsFor(*config, options->nccl_one_gpu_test);
  if (absl::Status s = CheckNcclOneGpuTest(*config, nccl); !s.ok()) {
    std::cerr << "tandem up: " << s.message() << kUsageHint << "\n";
    return 2;
  }
  std::string notice;
  absl::StatusOr<std::string> model = ResolveUpModel(options->model, *config, &notice);
  if (!model.ok()) return Fail(model.status().message());
  if (!notice.empty()) std::cerr << notice << "\n";
  absl::StatusOr<std::filesystem::path> bin_dir = SelfDirectory();
  if (!bin_dir.ok()) return Fail(bin_dir.status().message());
  const std::string router_bin = *bin_dir / "tandem-router";
  // Every worker runs the one worker binary; --role picks its service.
  const std::string worker_bin = *bin_dir / "tandem-worker";
  for (const std::string& bin : {router_bin, worker_bin}) {
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
  if (!config->router.api_keys_file.empty() && api_key->empty()) {
    return Fail(absl::StrCat("router.api_keys_file is set (", config->router.api_keys_file,
                             "): set $", kApiKeyEnv,
                             " to one of its keys, which tandem up sends to check readiness"));
  }

  Supervisor sup(absl::Seconds(config->shutdown_grace_s + 2));
  if (absl::Status s = sup.BlockSignals(); !s.ok()) return Fail(s.message());
  std::cerr << "tandem: model " << *model << ", config " << config_path
            << (config_path == options->config ? "" : absl::StrCat(" (from ", options->config, ")"))
            << ", " << config->prefill_workers.size() << " prefill and "
            << config->decode_workers.size() << " decode workers\n";
  if (nccl.one_gpu_test) {
    std::cerr << "tandem: --" << kNcclOneGpuTestFlag
              << ": each worker gets NCCL_HOSTID=tandem-<name>, NCCL_NET=Socket, "
                 "NCCL_IB_DISABLE=1, NCCL_SOCKET_IFNAME=lo (slow; a functional test only)\n";
  }

  // 1. The router, and the address it really bound.
  const std::vector<std::string> common_args = {"--config", config_path, "--model", *model};
  auto argv_for = [&](const std::string& bin, const std::string& name) {
    std::vector<std::string> argv = {bin, "--name", name};
    argv.insert(argv.end(), common_args.begin(), common_args.end());
    return argv;
  };
  absl::StatusOr<int> router =
      sup.group().Spawn(config->router.name, argv_for(router_bin, config->router.name));
  if (!router.ok()) return Fail(router.status().message());
  // While starting: a stop signal stops everything (exit 0), a child's exit
  // fails `up`; nothing (a SIGCHLD already handled): keep waiting.
  auto OnStartupEvent = [&](Event event) -> std::optional<int> {
    switch (event) {
      case Event::kStopSignal:
        sup.StopAll();
        return 0;
      case Event::kChildExited:
        return sup.FailOnChildExit();
      case Event::kNothing:
        break;
    }
    return std::nullopt;
  };
  // Reads child `index`'s stdout until it has announced each of `prefixes`
  // (in any order); (*found)[i] is the address after prefixes[i]. An exit
  // code when up must end: the child exited (its own error is on stderr
  // above), a stop signal, no announcement by `deadline`.
  auto wait_announcements = [&](int index, const std::vector<absl::string_view>& prefixes,
                                absl::Time deadline,
                                std::vector<std::string>* found) -> std::optional<int> {
    found->assign(prefixes.size(), "");
    std::vector<bool> seen(prefixes.size(), false);
    for (size_t left = prefixes.size(); left > 0;) {
      absl::StatusOr<std::pair<size_t, std::string>> line =
          sup.group().WaitForAnyLine(index, prefixes, deadline - absl::Now(), sup.signal_fd());
      if (line.ok()) {
        if (!seen[line->first]) --left;
        seen[line->first] = true;
        (*found)[line->first] = std::move(line->second);
        continue;
      }
      ProcessGroup& group = sup.group();
      if (absl::IsUnavailable(line.status()) && !group.running(index)) {
        // Closed its stdout and exited (WaitForAnyLine reaped it): said as
        // for any child that exits during start-up.
        return sup.FailOnChildExit(
            {index, group.name(index), group.pid(index), group.wait_status(index)});
      }
      if (!absl::IsCancelled(line.status())) {
        sup.StopAll();
        return Fail(line.status().message());
      }
      if (std::optional<int> rc = OnStartupEvent(sup.Wait(absl::ZeroDuration()))) return *rc;
    }
    return std::nullopt;
  };
  // The router's bound addresses: gRPC, HTTP with router.http_listen,
  // metrics with router.metrics_listen.
  std::vector<absl::string_view> router_lines = {kListeningPrefix};
  if (config->router.http_listen.has_value()) router_lines.push_back(kHttpListeningPrefix);
  if (config->router.metrics_listen.has_value()) router_lines.push_back(kMetricsListeningPrefix);
  std::vector<std::string> router_found;
  if (std::optional<int> rc = wait_announcements(
          *router, router_lines, absl::Now() + options->listen_timeout, &router_found)) {
    return *rc;
  }
  const std::string router_address = router_found[0];
  std::string http_address, router_metrics_address;
  for (size_t i = 1; i < router_lines.size(); ++i) {
    (router_lines[i] == kHttpListeningPrefix ? http_address : router_metrics_address) =
        router_found[i];
  }
  const std::string dial = DialAddress(router_address);
  std::cerr << "tandem: router listening on " << router_address << "\n";

  // 2. Every worker, before any gRPC channel exists (fork with no threads).
  // Workers sharing a GPU divide engine.gpu_memory_fraction among them.
  std::map<std::string, std::string> gpu_fraction_flag;  // worker name -> value
  for (const GpuShare& share : SplitGpuMemory(*config)) {
    std::cerr << "tandem: " << FormatGpuShare(share, config->engine.gpu_memory_fraction) << "\n";
    for (const std::string& name : share.workers) {
      gpu_fraction_flag[name] = GpuShareFlagValue(share.fraction);
    }
  }
  std::vector<std::string> worker_names;
  std::map<int, std::string> metrics_address;  // child index -> bound address
  for (const auto& [role, workers] : {std::pair{"prefill", &config->prefill_workers},
                                      std::pair{"decode", &config->decode_workers}}) {
    for (const WorkerConfig& w : *workers) {
      std::vector<std::string> argv = argv_for(worker_bin, w.name);
      argv.insert(argv.begin() + 1, {"--role", role});
      argv.insert(argv.end(), {"--router", dial});
      if (auto f = gpu_fraction_flag.find(w.name); f != gpu_fraction_flag.end()) {
        argv.insert(argv.end(), {"--gpu-memory-fraction", f->second});
      }
      ProcessGroup::SpawnOptions spawn;
      spawn.env = WorkerNcclEnv(nccl, w.name);
      absl::StatusOr<int> child = sup.group().Spawn(w.name, argv, spawn);
      if (!child.ok()) {
        sup.StopAll();
        return Fail(child.status().message());
      }
      worker_names.push_back(w.name);
      if (w.metrics_listen.has_value()) metrics_address[*child] = "";
    }
  }
  const absl::Time ready_deadline = absl::Now() + options->ready_timeout;
  // Each metrics server's bound address (announced once its model loaded).
  for (auto& [index, address] : metrics_address) {
    std::vector<std::string> found;
    if (std::optional<int> rc =
            wait_announcements(index, {kMetricsListeningPrefix}, ready_deadline, &found)) {
      return *rc;
    }
    address = DialAddress(found[0]);
  }

  // 3. Readiness as the router sees it.
  std::unique_ptr<tandem::v1::Generation::Stub> stub = MakeGenerationStub(dial);
  std::string last_problem = "no answer yet";
  tandem::v1::ClusterStatus status;
  for (;;) {
    grpc::ClientContext context;
    SetApiKey(&context, *api_key);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    status.Clear();
    grpc::Status rpc = stub->GetStatus(&context, tandem::v1::GetStatusRequest(), &status);
    if (rpc.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      // router.api_keys_file is set: no key, or a wrong one, never becomes ready.
      sup.StopAll();
      std::cerr << GrpcErrorLine(rpc) << " (the router requires an API key: set $" << kApiKeyEnv
                << " to one of router.api_keys_file's keys)\n";
      return 1;
    }
    last_problem = rpc.ok() ? NotReadyReason(status, worker_names) : GrpcErrorLine(rpc);
    if (last_problem.empty()) break;
    if (absl::Now() >= ready_deadline) {
      sup.StopAll();
      return Fail(absl::StrCat("cluster not ready within ",
                               absl::FormatDuration(options->ready_timeout), ": ", last_problem));
    }
    if (std::optional<int> rc = OnStartupEvent(sup.Wait(absl::Milliseconds(200)))) return *rc;
  }
  // 4. The cluster: every process with its pid and address, then ready.
  std::string table =
      FormatUpProcess({config->router.name, "router", sup.group().pid(*router), dial,
                       /*kv_endpoint=*/"", http_address.empty() ? "" : DialAddress(http_address),
                       router_metrics_address.empty() ? "" : DialAddress(router_metrics_address)});
  for (size_t i = 1; i < sup.group().size(); ++i) {
    const int index = static_cast<int>(i);
    for (const tandem::v1::WorkerStatus& w : status.workers()) {
      if (w.name() != sup.group().name(index)) continue;
      const auto metrics = metrics_address.find(index);
      absl::StrAppend(&table, "\n",
                      FormatUpProcess({w.name(), RoleName(w.role()), sup.group().pid(index),
                                       w.address(), w.kv_endpoint(), /*http_address=*/"",
                                       metrics == metrics_address.end() ? "" : metrics->second}));
    }
  }
  if (!http_address.empty()) {
    absl::StrAppend(&table, "\n", kUpHttpPrefix, http_address,
                    " (/v1/completions, /v1/chat/completions, /metrics)");
  }
  std::printf("%s\n%s%s\n", table.c_str(), kUpReadyPrefix, dial.c_str());
  std::fflush(stdout);

  // 5. Supervise until a signal or the router's exit; a worker's exit is
  // reported and the rest keep running.
  for (;;) {
    switch (sup.Wait(absl::InfiniteDuration())) {
      case Event::kStopSignal:
        sup.StopAll();
        return 0;
      case Event::kChildExited:
        if (sup.exit().index == *router) return sup.StopOnRouterExit();
        sup.ReportWorkerExit();
        break;
      case Event::kNothing:
        break;
    }
  }
}

}  // namespace tandem::cli
