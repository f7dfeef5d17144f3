#include "tools/process_group.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::cli {
namespace {

// Writes all of `text` to fd, retrying on EINTR / short writes.
void WriteAll(int fd, absl::string_view text) {
  while (!text.empty()) {
    ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<size_t>(n));
  }
}

// Milliseconds left until `deadline`, rounded up, for poll(); -1 = infinite.
int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))));
}

// Runs in the child between fork and exec: async-signal-safe calls only.
// `stderr_fd` >= 0 replaces our stderr.
// `envp` is the child's whole environment.
[[noreturn]] void ExecChild(pid_t parent, int stdout_fd, int stderr_fd, char* const argv[],
                            char* const envp[]) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP}) sigaction(sig, &dfl, nullptr);

  if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) _exit(126);
  // The parent may have died before prctl took effect: we would have been
  // reparented already and the death signal would never come.
  if (getppid() != parent) _exit(1);

  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) {
    dup2(devnull, STDIN_FILENO);
    if (devnull != STDIN_FILENO) close(devnull);
  }
  if (dup2(stdout_fd, STDOUT_FILENO) < 0) _exit(126);
  if (stderr_fd >= 0 && dup2(stderr_fd, STDERR_FILENO) < 0) _exit(126);
  // stdout_fd, stderr_fd and every other pipe of the group are O_CLOEXEC.
  execve(argv[0], argv, envp);
  static const char kMsg[] = "tandem: cannot exec ";
  WriteAll(STDERR_FILENO, absl::string_view(kMsg, sizeof(kMsg) - 1));
  WriteAll(STDERR_FILENO, absl::string_view(argv[0], strlen(argv[0])));
  WriteAll(STDERR_FILENO, "\n");
  _exit(127);
}

// Our environment with `overrides` applied ("NAME=value" strings), for
// execve. Errors: INVALID_ARGUMENT for an empty name or one with '='.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  for (const auto& [name, value] : overrides) {
    if (name.empty() || name.find('=') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("Spawn: bad environment variable name '", name, "'"));
    }
    const std::string prefix = name + "=";
    std::erase_if(env, [&](const std::string& e) { return absl::StartsWith(e, prefix); });
    env.push_back(prefix + value);
  }
  return env;
}

}  // namespace

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* abbrev = sigabbrev_np(sig);
    if (abbrev == nullptr) return absl::StrCat("killed by signal ", sig);
    return absl::StrCat("killed by SIG", abbrev, " (signal ", sig, ")");
  }
  return absl::StrCat("stopped (wait status ", wait_status, ")");
}

std::string ProcessGroup::Exit::Describe() const {
  return absl::StrCat(name, " (pid ", pid, ") ", DescribeWaitStatus(wait_status));
}

ProcessGroup::~ProcessGroup() { StopAll(absl::Seconds(2)); }

absl::StatusOr<int> ProcessGroup::Spawn(const std::string& name,
                                        const std::vector<std::string>& argv) {
  return Spawn(name, argv, SpawnOptions());
}

absl::StatusOr<int> ProcessGroup::Spawn(const std::string& name,
                                        const std::vector<std::string>& argv,
                                        const SpawnOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("Spawn: empty argv");
  absl::StatusOr<std::vector<std::string>> env = ChildEnvironment(options.env);
  if (!env.ok()) return env.status();
  int stderr_fd = -1;
  if (!options.stderr_path.empty()) {
    stderr_fd = open(options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (stderr_fd < 0) {
      return absl::InternalError(
          absl::StrCat("stderr of ", name, ": ", options.stderr_path, ": ", strerror(errno)));
    }
  }
  // Everything the child needs is built before fork.
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  for (std::string& e : *env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    const int err = errno;
    if (stderr_fd >= 0) close(stderr_fd);
    return absl::InternalError(absl::StrCat("pipe for ", name, ": ", strerror(err)));
  }
  const pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  const int fork_errno = errno;
  if (pid == 0) ExecChild(parent, fds[1], stderr_fd, cargv.data(), cenv.data());
  close(fds[1]);
  if (stderr_fd >= 0) close(stderr_fd);
  if (pid < 0) {
    close(fds[0]);
    return absl::InternalError(absl::StrCat("fork for ", name, ": ", strerror(fork_errno)));
  }
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  Child child;
  child.name = name;
  child.pid = pid;
  child.stdout_fd = fds[0];
  children_.push_back(std::move(child));
  return static_cast<int>(children_.size() - 1);
}

bool ProcessGroup::ReadAvailable(Child& child) {
  if (child.stdout_fd < 0) return false;
  char buf[4096];
  for (;;) {
    ssize_t n = read(child.stdout_fd, buf, sizeof(buf));
    if (n > 0) {
      child.pending.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    close(child.stdout_fd);  // EOF or a hard error
    child.stdout_fd = -1;
    return false;
  }
}

void ProcessGroup::ForwardLines(Child& child) {
  size_t start = 0;
  for (size_t nl; (nl = child.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    WriteAll(STDERR_FILENO,
             absl::StrCat("[", child.name, "] ",
                          absl::string_view(child.pending).substr(start, nl - start), "\n"));
  }
  child.pending.erase(0, start);
  if (child.stdout_fd < 0 && !child.pending.empty()) {
    WriteAll(STDERR_FILENO, absl::StrCat("[", child.name, "] ", child.pending, "\n"));
    child.pending.clear();
  }
}

absl::StatusOr<std::string> ProcessGroup::WaitForLine(int index, absl::string_view prefix,
                                                      absl::Duration timeout, int interrupt_fd) {
  absl::StatusOr<std::pair<size_t, std::string>> line =
      WaitForAnyLine(index, {prefix}, timeout, interrupt_fd);
  if (!line.ok()) return line.status();
  return std::move(line->second);
}

absl::StatusOr<std::pair<size_t, std::string>> ProcessGroup::WaitForAnyLine(
    int index, const std::vector<absl::string_view>& prefixes, absl::Duration timeout,
    int interrupt_fd) {
  Child& child = children_[index];
  const absl::Time deadline = absl::Now() + timeout;
  const std::string wanted = absl::StrCat("'", absl::StrJoin(prefixes, "' or '"), "'");
  for (;;) {
    // Look through the complete lines we already have.
    size_t nl;
    while ((nl = child.pending.find('\n')) != std::string::npos) {
      std::string line = child.pending.substr(0, nl);
      child.pending.erase(0, nl + 1);
      for (size_t i = 0; i < prefixes.size(); ++i) {
        if (absl::StartsWith(line, prefixes[i])) {
          return std::make_pair(
              i, std::string(absl::StripAsciiWhitespace(line.substr(prefixes[i].size()))));
        }
      }
      WriteAll(STDERR_FILENO, absl::StrCat("[", child.name, "] ", line, "\n"));
    }
    if (child.stdout_fd < 0) {
      // Closed stdout: give the child a moment to exit so we can say how.
      for (int i = 0; i < 100 && !TryReap(child); ++i) absl::SleepFor(absl::Milliseconds(10));
      return absl::UnavailableError(absl::StrCat(
          child.name, " closed its stdout before printing ", wanted,
          child.running ? "" : absl::StrCat(": ", DescribeWaitStatus(child.wait_status))));
    }
    pollfd pfds[2] = {{child.stdout_fd, POLLIN, 0}, {interrupt_fd, POLLIN, 0}};
    const int timeout_ms = PollTimeoutMs(deadline);
    int n = poll(pfds, interrupt_fd >= 0 ? 2 : 1, timeout_ms);
    if (n < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
    }
    if (interrupt_fd >= 0 && (pfds[1].revents & POLLIN)) {
      return absl::CancelledError(absl::StrCat("interrupted while waiting for ", child.name));
    }
    if (n == 0 && timeout_ms == 0) {
      return absl::DeadlineExceededError(absl::StrCat(child.name, " did not print ", wanted,
                                                      " within ", absl::FormatDuration(timeout)));
    }
    ReadAvailable(child);
  }
}

void ProcessGroup::ForwardOutput() {
  for (Child& child : children_) {
    ReadAvailable(child);
    ForwardLines(child);
  }
}

std::vector<int> ProcessGroup::OutputFds() const {
  std::vector<int> fds;
  for (const Child& child : children_) {
    if (child.stdout_fd >= 0) fds.push_back(child.stdout_fd);
  }
  return fds;
}

bool ProcessGroup::TryReap(Child& child) {
  if (!child.running) return true;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(child.pid, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  // r < 0 (ECHILD): someone else reaped it; treat as gone.
  child.running = false;
  child.wait_status = r == child.pid ? status : 0;
  return true;
}

std::optional<ProcessGroup::Exit> ProcessGroup::ReapExited() {
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& child = children_[i];
    if (child.running && TryReap(child)) {
      ReadAvailable(child);
      ForwardLines(child);
      return Exit{static_cast<int>(i), child.name, child.pid, child.wait_status};
    }
  }
  return std::nullopt;
}

std::vector<std::string> ProcessGroup::StopAll(absl::Duration grace) {
  for (Child& child : children_) {
    if (child.running && !TryReap(child)) kill(child.pid, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + grace;
  for (;;) {
    bool any_running = false;
    for (Child& child : children_) any_running |= !TryReap(child);
    ForwardOutput();
    if (!any_running || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::vector<std::string> killed;
  for (Child& child : children_) {
    if (!child.running) continue;
    kill(child.pid, SIGKILL);
    killed.push_back(child.name);
    int status = 0;
    while (waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
    }
    child.running = false;
    child.wait_status = status;
  }
  for (Child& child : children_) {
    ReadAvailable(child);
    if (child.stdout_fd >= 0) {  // a grandchild may still hold the pipe open
      close(child.stdout_fd);
      child.stdout_fd = -1;
    }
    ForwardLines(child);
  }
  return killed;
}

}  // namespace tandem::cli
