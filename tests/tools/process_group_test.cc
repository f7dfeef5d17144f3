// Tests for tools/process_group with /bin/sh children: reading the
// announcement line, forwarding other output, exit reporting, stopping with
// SIGTERM then SIGKILL, and PR_SET_PDEATHSIG (no orphans when the parent is
// SIGKILLed).
#include "tools/process_group.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> Sh(const std::string& script) { return {"/bin/sh", "-c", script}; }

bool Gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

TEST(DescribeWaitStatusTest, ExitAndSignal) {
  EXPECT_EQ(DescribeWaitStatus(3 << 8), "exited with status 3");  // W_EXITCODE(3, 0)
  EXPECT_EQ(DescribeWaitStatus(SIGKILL), "killed by SIGKILL (signal 9)");
  EXPECT_EQ(DescribeWaitStatus(SIGTERM), "killed by SIGTERM (signal 15)");
}

TEST(ProcessGroupTest, WaitForLineReturnsTheRestAndForwardsOtherLines) {
  ProcessGroup group;
  absl::StatusOr<int> c =
      group.Spawn("router", Sh("echo starting; echo 'TANDEM_LISTENING 127.0.0.1:4242 '; echo bye; "
                               "echo DONE; exec sleep 30"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, 0);
  ::testing::internal::CaptureStderr();
  absl::StatusOr<std::string> line = group.WaitForLine(*c, "TANDEM_LISTENING ", absl::Seconds(10));
  // Lines before the awaited one are forwarded, and so are lines after it.
  EXPECT_TRUE(group.WaitForLine(*c, "DONE", absl::Seconds(10)).ok());
  EXPECT_THAT(group.StopAll(absl::Seconds(5)), IsEmpty());
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "127.0.0.1:4242");
  EXPECT_EQ(err, "[router] starting\n[router] bye\n");
  EXPECT_FALSE(group.running(*c));
  EXPECT_EQ(DescribeWaitStatus(group.wait_status(*c)), "killed by SIGTERM (signal 15)");
  EXPECT_TRUE(Gone(group.pid(*c)));
}

TEST(ProcessGroupTest, StderrPathAppendsTheChildsStderrToAFile) {
  const std::string path = ::testing::TempDir() + "/process_group_stderr.txt";
  std::remove(path.c_str());
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("before\n", f);
    std::fclose(f);
  }
  ProcessGroup group;
  ProcessGroup::SpawnOptions options;
  options.stderr_path = path;
  absl::StatusOr<int> c =
      group.Spawn("w", Sh("echo to-stderr >&2; echo DONE; exec sleep 30"), options);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(group.WaitForLine(*c, "DONE", absl::Seconds(10)).ok());
  EXPECT_THAT(group.StopAll(absl::Seconds(5)), IsEmpty());
  std::FILE* f = std::fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[64] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  EXPECT_EQ(std::string(buf, n), "before\nto-stderr\n");
  std::remove(path.c_str());

  options.stderr_path = "/nonexistent-dir/x";
  EXPECT_THAT(group.Spawn("w", Sh("true"), options).status().message(),
              HasSubstr("stderr of w: /nonexistent-dir/x: No such file or directory"));
}

// SpawnOptions::env: added to what the child inherits, replacing a
// variable of the same name (the last of a repeated name wins); a bad name
// is refused before anything starts.
TEST(ProcessGroupTest, EnvIsAddedToTheInheritedEnvironment) {
  setenv("TANDEM_PG_INHERITED", "kept", 1);
  setenv("TANDEM_PG_REPLACED", "old", 1);
  ProcessGroup group;
  ProcessGroup::SpawnOptions options;
  options.env = {{"TANDEM_PG_REPLACED", "first"},
                 {"TANDEM_PG_NEW", "a b=c"},
                 {"TANDEM_PG_REPLACED", "new"}};
  absl::StatusOr<int> c = group.Spawn(
      "w",
      Sh("echo \"ENV $TANDEM_PG_INHERITED|$TANDEM_PG_REPLACED|$TANDEM_PG_NEW|"
         "$(env | grep -c ^TANDEM_PG_REPLACED=)\"; exec sleep 30"),
      options);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::string> line = group.WaitForLine(*c, "ENV ", absl::Seconds(20));
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "kept|new|a b=c|1");
  // Our own environment is untouched.
  EXPECT_STREQ(getenv("TANDEM_PG_REPLACED"), "old");
  EXPECT_EQ(getenv("TANDEM_PG_NEW"), nullptr);
  for (const char* bad : {"", "A=B"}) {
    options.env = {{bad, "x"}};
    EXPECT_THAT(group.Spawn("bad", Sh("true"), options).status().message(),
                HasSubstr("bad environment variable name"));
  }
  EXPECT_EQ(group.size(), 1u);
  unsetenv("TANDEM_PG_INHERITED");
  unsetenv("TANDEM_PG_REPLACED");
}

TEST(ProcessGroupTest, ChildExitingBeforeTheLineIsUnavailableWithItsStatus) {
  ProcessGroup group;
  ::testing::internal::CaptureStderr();
  absl::StatusOr<int> c = group.Spawn("router", Sh("echo 'router.listen: busy' >&2; exit 1"));
  ASSERT_TRUE(c.ok());
  absl::StatusOr<std::string> line = group.WaitForLine(*c, "TANDEM_LISTENING ", absl::Seconds(10));
  // The child's stderr is ours.
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "router.listen: busy\n");
  EXPECT_EQ(line.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(line.status().message(),
            "router closed its stdout before printing 'TANDEM_LISTENING ': exited with status 1");
}

// The announcements of a server in any order (tandem up waits for the
// router's TANDEM_LISTENING and TANDEM_HTTP_LISTENING lines this way);
// other lines go to our stderr.
TEST(ProcessGroupTest, WaitForAnyLineReturnsWhichPrefixMatched) {
  ProcessGroup group;
  absl::StatusOr<int> c = group.Spawn(
      "router", Sh("echo 'TANDEM_HTTP_LISTENING 127.0.0.1:8000'; echo log; "
                   "echo 'TANDEM_LISTENING 127.0.0.1:50051'; exec sleep 30"));
  ASSERT_TRUE(c.ok());
  const std::vector<absl::string_view> prefixes = {"TANDEM_LISTENING ", "TANDEM_HTTP_LISTENING "};
  ::testing::internal::CaptureStderr();
  absl::StatusOr<std::pair<size_t, std::string>> first =
      group.WaitForAnyLine(*c, prefixes, absl::Seconds(10));
  absl::StatusOr<std::pair<size_t, std::string>> second =
      group.WaitForAnyLine(*c, prefixes, absl::Seconds(10));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "[router] log\n");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, std::make_pair(size_t{1}, std::string("127.0.0.1:8000")));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, std::make_pair(size_t{0}, std::string("127.0.0.1:50051")));
  absl::StatusOr<std::pair<size_t, std::string>> none =
      group.WaitForAnyLine(*c, prefixes, absl::Milliseconds(100));
  EXPECT_EQ(none.status().message(),
            "router did not print 'TANDEM_LISTENING ' or 'TANDEM_HTTP_LISTENING ' within 100ms");
}

TEST(ProcessGroupTest, WaitForLineTimesOut) {
  ProcessGroup group;
  absl::StatusOr<int> c = group.Spawn("quiet", Sh("exec sleep 30"));
  ASSERT_TRUE(c.ok());
  absl::StatusOr<std::string> line =
      group.WaitForLine(*c, "TANDEM_LISTENING ", absl::Milliseconds(200));
  EXPECT_EQ(line.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(line.status().message(), HasSubstr("quiet did not print 'TANDEM_LISTENING '"));
}

TEST(ProcessGroupTest, InterruptFdCancelsTheWait) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ASSERT_EQ(write(fds[1], "x", 1), 1);
  ProcessGroup group;
  absl::StatusOr<int> c = group.Spawn("quiet", Sh("exec sleep 30"));
  ASSERT_TRUE(c.ok());
  absl::StatusOr<std::string> line =
      group.WaitForLine(*c, "TANDEM_LISTENING ", absl::Seconds(30), fds[0]);
  EXPECT_EQ(line.status().code(), absl::StatusCode::kCancelled);
  close(fds[0]);
  close(fds[1]);
}

TEST(ProcessGroupTest, ReapExitedReportsWhichChildAndHow) {
  ProcessGroup group;
  ASSERT_TRUE(group.Spawn("prefill-0", Sh("exec sleep 30")).ok());
  absl::StatusOr<int> d = group.Spawn("decode-0", Sh("exit 3"));
  ASSERT_TRUE(d.ok());
  std::optional<ProcessGroup::Exit> exit;
  for (int i = 0; i < 1000 && !exit.has_value(); ++i) {
    exit = group.ReapExited();
    if (!exit.has_value()) usleep(10000);
  }
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->index, *d);
  EXPECT_EQ(exit->Describe(),
            "decode-0 (pid " + std::to_string(group.pid(*d)) + ") exited with status 3");
  EXPECT_FALSE(group.ReapExited().has_value());
  EXPECT_TRUE(group.running(0));
}

TEST(ProcessGroupTest, StopAllKillsWhatIgnoresSigterm) {
  ProcessGroup group;
  // exec keeps the ignored SIGTERM (dispositions set to SIG_IGN survive exec).
  absl::StatusOr<int> stubborn =
      group.Spawn("stubborn", Sh("trap '' TERM; echo READY; exec sleep 30"));
  absl::StatusOr<int> polite = group.Spawn("polite", Sh("echo READY; exec sleep 30"));
  ASSERT_TRUE(stubborn.ok() && polite.ok());
  ASSERT_TRUE(group.WaitForLine(*stubborn, "READY", absl::Seconds(10)).ok());
  ASSERT_TRUE(group.WaitForLine(*polite, "READY", absl::Seconds(10)).ok());
  EXPECT_THAT(group.StopAll(absl::Seconds(1)), ElementsAre("stubborn"));
  EXPECT_EQ(DescribeWaitStatus(group.wait_status(*stubborn)), "killed by SIGKILL (signal 9)");
  EXPECT_EQ(DescribeWaitStatus(group.wait_status(*polite)), "killed by SIGTERM (signal 15)");
  EXPECT_TRUE(Gone(group.pid(*stubborn)));
  EXPECT_TRUE(Gone(group.pid(*polite)));
  EXPECT_THAT(group.StopAll(absl::Seconds(1)), IsEmpty());  // idempotent
}

TEST(ProcessGroupTest, ChildrenStartWithSignalsUnblocked) {
  // tandem up blocks SIGTERM for its signalfd; children must not inherit it.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(sigprocmask(SIG_BLOCK, &term, &old), 0);
  {
    ProcessGroup group;
    absl::StatusOr<int> c = group.Spawn("child", Sh("echo READY; exec sleep 30"));
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(group.WaitForLine(*c, "READY", absl::Seconds(10)).ok());
    EXPECT_THAT(group.StopAll(absl::Seconds(10)), IsEmpty());
    EXPECT_EQ(DescribeWaitStatus(group.wait_status(*c)), "killed by SIGTERM (signal 15)");
  }
  sigprocmask(SIG_SETMASK, &old, nullptr);
}

TEST(ProcessGroupTest, ExecFailureExits127) {
  ProcessGroup group;
  ::testing::internal::CaptureStderr();
  absl::StatusOr<int> c = group.Spawn("ghost", {"/nonexistent/tandem-router"});
  ASSERT_TRUE(c.ok());
  absl::StatusOr<std::string> line = group.WaitForLine(*c, "TANDEM_LISTENING ", absl::Seconds(10));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(line.status().message(),
            "ghost closed its stdout before printing 'TANDEM_LISTENING ': exited with status 127");
  EXPECT_EQ(err, "tandem: cannot exec /nonexistent/tandem-router\n");
}

// The parent of a ProcessGroup is SIGKILLed: its children must get SIGTERM
// from PR_SET_PDEATHSIG. This test process becomes a child subreaper so the
// orphaned grandchild is reparented to it and its fate can be read with
// waitpid.
TEST(ProcessGroupTest, ChildrenDieWithTheirParent) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t middle = fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {  // plays `tandem up`
    close(report[0]);
    ProcessGroup group;
    absl::StatusOr<int> c = group.Spawn("worker", Sh("echo READY; exec sleep 60"));
    if (!c.ok() || !group.WaitForLine(*c, "READY", absl::Seconds(10)).ok()) _exit(2);
    const pid_t pid = group.pid(*c);
    if (write(report[1], &pid, sizeof(pid)) != sizeof(pid)) _exit(2);
    for (;;) pause();
  }
  close(report[1]);
  pid_t worker = -1;
  ASSERT_EQ(read(report[0], &worker, sizeof(worker)), static_cast<ssize_t>(sizeof(worker)));
  close(report[0]);

  ASSERT_EQ(kill(middle, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(middle, &status, 0), middle);
  EXPECT_EQ(DescribeWaitStatus(status), "killed by SIGKILL (signal 9)");

  pid_t reaped = 0;
  for (int i = 0; i < 1000 && reaped == 0; ++i) {  // up to 10 s
    reaped = waitpid(worker, &status, WNOHANG);
    if (reaped == 0) usleep(10000);
  }
  if (reaped == 0) {  // do not leak it, but fail
    kill(worker, SIGKILL);
    waitpid(worker, &status, 0);
    ADD_FAILURE() << "worker survived its parent";
  } else {
    ASSERT_EQ(reaped, worker);
    EXPECT_EQ(DescribeWaitStatus(status), "killed by SIGTERM (signal 15)");
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

}  // namespace
}  // namespace tandem::cli
