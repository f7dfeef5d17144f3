// Running a child process to its end in a test: tandem binaries, kubectl,
// ldd. Shared by every test binary through tandem_test_util.
#ifndef TANDEM_TESTS_PROCESS_UTIL_H_
#define TANDEM_TESTS_PROCESS_UTIL_H_

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace tandem::testing {

// A finished child process run by RunProcess.
struct ProcessResult {
  bool exited = false;     // WIFEXITED
  int exit_code = -1;      // WEXITSTATUS when exited
  int signal = 0;          // WTERMSIG when killed by a signal
  bool timed_out = false;  // we killed it after the timeout
  std::string out;         // all of stdout
  std::string err;         // all of stderr
  // "exited with status N" / "killed by signal N (SIGNAME)", plus stderr.
  std::string Describe() const;
};

// Runs argv[0] (a path) with stdin from /dev/null, collecting stdout and
// stderr, until it exits or `timeout` passes (then SIGKILL).
ProcessResult RunProcess(const std::vector<std::string>& argv, absl::Duration timeout);

// Lines of `text` without their "\n"; a trailing empty line is dropped.
std::vector<std::string> Lines(const std::string& text);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_PROCESS_UTIL_H_
