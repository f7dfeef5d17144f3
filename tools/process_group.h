// ProcessGroup: the child processes of `tandem up` (router, workers).
//
// Owns: the children's pids, their stdout pipes, and the decision to
// SIGTERM / SIGKILL them. Does not touch: signals of the calling process
// (the caller blocks SIGINT/SIGTERM/SIGCHLD and watches them, e.g. through a
// signalfd), gRPC. Threads: not thread-safe; call from the thread that will
// outlive the children (the main thread), because PR_SET_PDEATHSIG fires
// when the *thread* that forked exits, not the process.
//
// Each child:
//   * stdin from /dev/null, stderr inherited (its logs reach our stderr)
//     or appended to SpawnOptions::stderr_path,
//     stdout a pipe read by WaitForLine() / ForwardOutput(); lines other than
//     the awaited one are copied to our stderr prefixed "[name] ", so our own
//     stdout stays clean for the CLI's one result line;
//   * empty signal mask and default SIGINT/SIGTERM/SIGCHLD/SIGPIPE
//     dispositions, whatever the parent had blocked or ignored;
//   * PR_SET_PDEATHSIG(SIGTERM), then getppid() is compared with the
//     parent's pid, closing the race where the parent died before prctl:
//     the children never outlive `tandem up`, even if it is SIGKILLed.
// Fork happens with no other threads running in the caller (tandem up spawns
// every child before creating a gRPC channel), so the child may run the
// prepared exec without async-signal-unsafe calls.
#ifndef TANDEM_TOOLS_PROCESS_GROUP_H_
#define TANDEM_TOOLS_PROCESS_GROUP_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tandem::cli {

// "exited with status N" / "killed by SIGNAME (signal N)" for a waitpid()
// status ("killed by signal N" when the signal has no name).
std::string DescribeWaitStatus(int wait_status);

class ProcessGroup {
 public:
  // A child that has exited and been reaped.
  struct Exit {
    int index = -1;
    std::string name;
    pid_t pid = -1;
    int wait_status = 0;  // as from waitpid()
    // "decode-0 (pid 123) exited with status 1".
    std::string Describe() const;
  };

  ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  // Stops whatever still runs (StopAll with a 2 s grace).
  ~ProcessGroup();

  // How to start one child.
  struct SpawnOptions {
    // Non-empty: the child's stderr is appended to this file (created 0644
    // if missing) instead of being ours.
    std::string stderr_path;
    // Environment variables set in the child (added to, or replacing,
    // what it inherits from us), in order; the last of a repeated name
    // wins. Names must be non-empty and hold no '=' (INVALID_ARGUMENT).
    std::vector<std::pair<std::string, std::string>> env;
  };

  // Starts argv[0] (a path; no $PATH search) with argv as its arguments,
  // under `name`. Returns the child's index (0, 1, ...). INTERNAL when pipe
  // or fork fails or stderr_path cannot be opened; an exec failure shows up
  // as the child exiting with status 127 after printing "tandem: cannot
  // exec <path>" to stderr.
  [[nodiscard]] absl::StatusOr<int> Spawn(const std::string& name,
                                          const std::vector<std::string>& argv);
  [[nodiscard]] absl::StatusOr<int> Spawn(const std::string& name,
                                          const std::vector<std::string>& argv,
                                          const SpawnOptions& options);

  // Reads child `index`'s stdout until a line that starts with `prefix` and
  // returns the rest of that line (surrounding whitespace trimmed). Errors:
  // DEADLINE_EXCEEDED after `timeout`; UNAVAILABLE when the child closes its
  // stdout first (the message says how it exited, when it did within 1 s);
  // CANCELLED as soon as `interrupt_fd` (if >= 0) becomes readable.
  [[nodiscard]] absl::StatusOr<std::string> WaitForLine(int index, absl::string_view prefix,
                                                        absl::Duration timeout,
                                                        int interrupt_fd = -1);
  // WaitForLine for the first line that starts with any of `prefixes`:
  // returns the index of the prefix it starts with (the first that
  // matches) and the rest of the line, trimmed. The errors name every
  // prefix ("'A' or 'B'").
  [[nodiscard]] absl::StatusOr<std::pair<size_t, std::string>> WaitForAnyLine(
      int index, const std::vector<absl::string_view>& prefixes, absl::Duration timeout,
      int interrupt_fd = -1);

  // Copies whatever the children have written to stdout so far to our
  // stderr ("[name] line"); never blocks.
  void ForwardOutput();
  // The children's open stdout pipes, to poll() alongside other events.
  std::vector<int> OutputFds() const;

  // Reaps one child that has exited, without blocking; nullopt if none has.
  std::optional<Exit> ReapExited();

  // SIGTERM to every running child, waits up to `grace` for all of them,
  // then SIGKILLs and reaps the rest. Returns the names of the children that
  // had to be SIGKILLed. Idempotent.
  std::vector<std::string> StopAll(absl::Duration grace);

  size_t size() const { return children_.size(); }
  pid_t pid(int index) const { return children_[index].pid; }
  const std::string& name(int index) const { return children_[index].name; }
  bool running(int index) const { return children_[index].running; }
  // waitpid() status of a child that is no longer running.
  int wait_status(int index) const { return children_[index].wait_status; }

 private:
  struct Child {
    std::string name;
    pid_t pid = -1;
    int stdout_fd = -1;   // read end, non-blocking; -1 once closed
    bool running = true;  // false once reaped
    int wait_status = 0;
    std::string pending;  // stdout bytes not yet split into lines
  };

  // Reads what is available from child.stdout_fd into child.pending; closes
  // the fd at EOF. Returns false at EOF or on a read error.
  static bool ReadAvailable(Child& child);
  // Forwards every complete line of child.pending (and, at EOF, the rest).
  static void ForwardLines(Child& child);
  // Non-blocking waitpid on one child; true if it has now been reaped.
  static bool TryReap(Child& child);

  std::vector<Child> children_;
};

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_PROCESS_GROUP_H_
