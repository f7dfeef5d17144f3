// The tandem binary end to end against stand-ins: tests/tools/fake_router.cc
// as tandem-router (canned Generation service) and a /bin/sh script as
// tandem-worker (every worker), all copied next to a copy of `tandem` in a temporary directory,
// because `tandem up` runs the binaries beside /proc/self/exe. Checks the
// command lines the children get, the process table and the ready line,
// generate/status output and exit codes, shutdown on SIGTERM, a dying worker
// (reported, the rest keep running), the router's exit, --prefill-workers /
// --decode-workers, no orphans after `tandem up` is SIGKILLed, and the
// offline path (no model anywhere).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/cluster_config.h"
#include "common/server/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/process_group.h"
#include "tools/up.h"

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kReady[] = "tandem: cluster ready, router at ";

// Fake worker: records its NCCL_* variables, argv and pid, then announces itself and sleeps
// (or, when $FAKE_WORKER_EXIT names it, exits with $FAKE_WORKER_EXIT_CODE,
// default 3, once the file <name>.exit exists next to it).
constexpr char kFakeWorker[] = R"(#!/bin/sh
d=$(dirname "$0")
n=$4  # tandem-worker --role R --name NAME ...
env | grep '^NCCL_' | sort > "$d/$n.env"
echo "$*" > "$d/$n.args"
echo $$ > "$d/$n.pid"
echo "TANDEM_LISTENING 127.0.0.1:1"
if [ "$FAKE_WORKER_EXIT" = "$n" ]; then
  while [ ! -e "$d/$n.exit" ]; do sleep 0.02; done
  exit ${FAKE_WORKER_EXIT_CODE:-3}
fi
exec sleep 60
)";

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs argv to completion, collecting stdout and stderr.
Result RunCommand(const std::vector<std::string>& argv) {
  int out[2], err[2];
  if (pipe(out) != 0 || pipe(err) != 0) return {};
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(err[0]);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  Result r;
  auto drain = [](int fd, std::string* into) {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) into->append(buf, static_cast<size_t>(n));
    close(fd);
  };
  drain(err[0], &r.err);  // the commands here write little; no deadlock
  drain(out[0], &r.out);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Sets an environment variable for the scope (inherited by children).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

bool Gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::path(::testing::TempDir()) / "tandem_cli_XXXXXX").string();
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    tandem_ = (dir_ / "tandem").string();
    fs::copy_file(TANDEM_CLI_PATH, tandem_);
    fs::copy_file(FAKE_ROUTER_PATH, dir_ / "tandem-router");
    std::ofstream(dir_ / "tandem-worker") << kFakeWorker;
    fs::permissions(dir_ / "tandem-worker", fs::perms::owner_all);
    config_ = (dir_ / "cluster.yaml").string();
    std::ofstream(config_) << "router: {listen: '127.0.0.1:0'}\n"
                              "prefill_workers: [{name: prefill-0}]\n"
                              "decode_workers: [{name: decode-0}]\n"
                              "shutdown_grace_s: 1\n";
    model_ = (dir_ / "model.gguf").string();
    std::ofstream(model_) << "not a real model";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The contents of a file a fake writes ("<name>.args", "<name>.pid"),
  // once complete (newline-terminated; 10 s at most): the fake router does
  // not wait for the workers, so `ready` may come before they start.
  std::string Slurp(const std::string& file) const {
    std::string text;
    for (int i = 0; i < 1000 && (text.empty() || text.back() != '\n'); ++i) {
      std::ifstream in(dir_ / file);
      std::stringstream s;
      s << in.rdbuf();
      text = s.str();
      if (text.empty() || text.back() != '\n') usleep(10000);
    }
    return text;
  }
  pid_t PidOf(const std::string& name) const { return std::stoi(Slurp(name + ".pid")); }

  // After `tandem up` has exited: true when child `name` is not running. A
  // child stopped before its script wrote "<name>.pid" (the cluster can be
  // torn down that early) is gone too; `tandem up` reaps every child before
  // it exits, so no pid file cannot mean a live process.
  bool ChildGone(const std::string& name) const {
    std::ifstream in(dir_ / (name + ".pid"));
    pid_t pid = 0;
    if (!(in >> pid) || pid <= 0) return true;
    return Gone(pid);
  }

  // Starts `tandem up` with extra flags as child 0 of `group`; its stderr
  // goes to `stderr_path` when given.
  void StartUp(ProcessGroup& group, std::vector<std::string> extra = {},
               const std::string& stderr_path = "") {
    std::vector<std::string> argv = {tandem_, "up", "--config", config_, "--model", model_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ProcessGroup::SpawnOptions options;
    options.stderr_path = stderr_path;
    ASSERT_EQ(group.Spawn("tandem-up", argv, options).value_or(-1), 0);
  }

  // Waits (`timeout` at most) for child 0 of `group` to exit; returns its
  // status, or "still running".
  static std::string AwaitExit(ProcessGroup& group, absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    do {
      if (std::optional<ProcessGroup::Exit> e = group.ReapExited()) {
        return DescribeWaitStatus(e->wait_status);
      }
      usleep(10000);
    } while (absl::Now() < deadline);
    return "still running";
  }

  // True once the file at `path` contains `text` (10 s at most).
  static bool LogHas(const std::string& path, const std::string& text) {
    for (int i = 0; i < 1000; ++i) {
      std::ifstream in(path);
      std::stringstream s;
      s << in.rdbuf();
      if (s.str().find(text) != std::string::npos) return true;
      usleep(10000);
    }
    return false;
  }

  // Starts the fake router alone; returns its address.
  std::string StartRouter(ProcessGroup& group) {
    absl::StatusOr<int> c = group.Spawn("router", {(dir_ / "tandem-router").string()});
    if (!c.ok()) return "";
    return group.WaitForLine(*c, "TANDEM_LISTENING ", absl::Seconds(20)).value_or("");
  }

  fs::path dir_;
  std::string tandem_, config_, model_;
};

TEST_F(CliTest, UpStartsRouterThenWorkersAndStopsOnSigterm) {
  ProcessGroup group;
  StartUp(group);
  absl::StatusOr<UpReady> ready = WaitForUpReady(group, 0, absl::Seconds(30));
  ASSERT_TRUE(ready.ok()) << ready.status();
  const std::string* address = &ready->router_address;
  absl::StatusOr<HostPort> hp = ParseHostPort(*address, "ready line");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "127.0.0.1");
  EXPECT_GT(hp->port, 0);

  const std::string common = " --config " + config_ + " --model " + model_;
  EXPECT_EQ(Slurp("router.args"), "--name router" + common + "\n");
  EXPECT_EQ(Slurp("prefill-0.args"),
            "--role prefill --name prefill-0" + common + " --router " + *address + "\n");
  EXPECT_EQ(Slurp("decode-0.args"),
            "--role decode --name decode-0" + common + " --router " + *address + "\n");
  const pid_t pids[] = {PidOf("router"), PidOf("prefill-0"), PidOf("decode-0")};
  // The table: every process with the pid it really has, in start order.
  ASSERT_EQ(ready->processes.size(), 3u);
  const std::string names[] = {"router", "prefill-0", "decode-0"};
  const std::string roles[] = {"router", "prefill", "decode"};
  for (int i = 0; i < 3; ++i) {
    const UpProcess& p = ready->processes[i];
    EXPECT_EQ(p.name, names[i]);
    EXPECT_EQ(p.role, roles[i]);
    EXPECT_EQ(p.pid, pids[i]) << names[i];
    EXPECT_EQ(p.address, i == 0 ? *address : "127.0.0.1:1") << names[i];
  }

  Result status = RunCommand({tandem_, "status", "--router", *address});
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_EQ(
      status.out,
      "router router " + *address +
          " ready healthy running=0 queued=0 kv_blocks=0/0 cached=0 transfers=0 prefill_tokens=0 "
          "decode_tokens=0 kv_sent=0 kv_received=0 max_batch=0 preemptions=0\n"
          "prefill-0 prefill 127.0.0.1:1 ready healthy running=0 kv_blocks=0/0 cached=0 "
          "kv_index=0 transfers=0 "
          "prefill_tokens=0 decode_tokens=0 kv_sent=0 kv_received=0 max_batch=0 preemptions=0\n"
          "decode-0 decode 127.0.0.1:1 ready healthy running=0 kv_blocks=0/2048 cached=0 "
          "kv_index=0 transfers=0 "
          "prefill_tokens=0 decode_tokens=0 kv_sent=0 kv_received=0 max_batch=0 preemptions=0\n"
          "slo: none; placement: threshold\n"
          "cluster: open (no cluster.secret_file: any host that reaches a worker port can "
          "register or call it)\n");

  ASSERT_EQ(kill(group.pid(0), SIGTERM), 0);
  EXPECT_EQ(AwaitExit(group), "exited with status 0");
  for (pid_t pid : pids) EXPECT_TRUE(Gone(pid)) << pid;
}

// After the ready line a worker's exit is reported (exit status or signal
// name) and the rest keep running; SIGTERM then stops them and exits 0.
TEST_F(CliTest, UpReportsAWorkerThatExitsAndKeepsTheRest) {
  ScopedEnv env("FAKE_WORKER_EXIT", "decode-0");
  const std::string log = (dir_ / "up.stderr").string();
  ProcessGroup group;
  StartUp(group, {}, log);
  absl::StatusOr<UpReady> ready = WaitForUpReady(group, 0, absl::Seconds(30));
  ASSERT_TRUE(ready.ok()) << ready.status() << Slurp(log);
  const pid_t router = PidOf("router"), prefill = PidOf("prefill-0"), decode = PidOf("decode-0");
  std::ofstream(dir_ / "decode-0.exit").close();
  const std::string exited = "tandem: decode-0 (pid " + std::to_string(decode) +
                             ") exited with status 3; still running: router, prefill-0\n";
  ASSERT_TRUE(LogHas(log, exited)) << Slurp(log);
  EXPECT_EQ(AwaitExit(group, absl::Milliseconds(300)), "still running");
  ASSERT_EQ(kill(prefill, SIGKILL), 0);
  const std::string killed = "tandem: prefill-0 (pid " + std::to_string(prefill) +
                             ") killed by SIGKILL (signal 9); still running: router\n";
  ASSERT_TRUE(LogHas(log, killed)) << Slurp(log);
  EXPECT_FALSE(Gone(router));
  Result status = RunCommand({tandem_, "status", "--router", ready->router_address});
  EXPECT_EQ(status.exit_code, 0) << status.err;  // the router still answers
  ASSERT_EQ(kill(group.pid(0), SIGTERM), 0);
  EXPECT_EQ(AwaitExit(group), "exited with status 0");
  EXPECT_TRUE(Gone(router));
}

// A worker that exits with kExitDeviceLost (its backend lost the GPU) is
// named as such in the one line; the rest keep running and serving.
TEST_F(CliTest, UpNamesAWorkerThatLostItsDevice) {
  ScopedEnv env("FAKE_WORKER_EXIT", "decode-0");
  const std::string device_lost = std::to_string(kExitDeviceLost);
  ScopedEnv code("FAKE_WORKER_EXIT_CODE", device_lost.c_str());
  const std::string log = (dir_ / "up.stderr").string();
  ProcessGroup group;
  StartUp(group, {}, log);
  absl::StatusOr<UpReady> ready = WaitForUpReady(group, 0, absl::Seconds(30));
  ASSERT_TRUE(ready.ok()) << ready.status() << Slurp(log);
  const pid_t router = PidOf("router"), prefill = PidOf("prefill-0"), decode = PidOf("decode-0");
  std::ofstream(dir_ / "decode-0.exit").close();
  const std::string exited = "tandem: decode-0 (pid " + std::to_string(decode) +
                             ") exited with status 75 (device lost); still running: router, "
                             "prefill-0\n";
  ASSERT_TRUE(LogHas(log, exited)) << Slurp(log);
  EXPECT_EQ(AwaitExit(group, absl::Milliseconds(300)), "still running");
  EXPECT_FALSE(Gone(router));
  EXPECT_FALSE(Gone(prefill));
  Result status = RunCommand({tandem_, "status", "--router", ready->router_address});
  EXPECT_EQ(status.exit_code, 0) << status.err;  // the router still answers
  ASSERT_EQ(kill(group.pid(0), SIGTERM), 0);
  EXPECT_EQ(AwaitExit(group), "exited with status 0");
}

// Before the ready line any child's exit ends `tandem up` with status 1.
TEST_F(CliTest, UpFailsWhenAWorkerExitsDuringStartUp) {
  ScopedEnv not_ready("FAKE_ROUTER_NOT_READY", "1");  // keeps it starting up
  ScopedEnv env("FAKE_WORKER_EXIT", "decode-0");
  std::ofstream(dir_ / "decode-0.exit").close();  // exits at once
  ProcessGroup group;
  ::testing::internal::CaptureStderr();
  StartUp(group);
  const std::string how = AwaitExit(group);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(how, "exited with status 1");
  EXPECT_THAT(err, HasSubstr("tandem: decode-0 (pid " + std::to_string(PidOf("decode-0")) +
                             ") exited with status 3 unexpectedly; stopping the cluster\n"));
  EXPECT_TRUE(ChildGone("router"));
  EXPECT_TRUE(ChildGone("prefill-0"));
}

// The router's exit stops the cluster; tandem up's status follows the
// router's: 0 after a clean exit (the fake exits 0 on SIGTERM), 1 when it
// was killed.
TEST_F(CliTest, UpStopsTheClusterWhenTheRouterExits) {
  for (const int sig : {SIGTERM, SIGKILL}) {
    ProcessGroup group;
    const std::string log = (dir_ / ("up.stderr." + std::to_string(sig))).string();
    StartUp(group, {}, log);
    ASSERT_TRUE(WaitForUpReady(group, 0, absl::Seconds(30)).ok()) << Slurp(log);
    const pid_t router = PidOf("router"), prefill = PidOf("prefill-0"), decode = PidOf("decode-0");
    ASSERT_EQ(kill(router, sig), 0);
    EXPECT_EQ(AwaitExit(group), sig == SIGTERM ? "exited with status 0" : "exited with status 1");
    EXPECT_THAT(Slurp(log), HasSubstr("tandem: router (pid " + std::to_string(router) + ") " +
                                      (sig == SIGTERM ? "exited with status 0"
                                                      : "killed by SIGKILL (signal 9)") +
                                      "; stopping the cluster\n"));
    EXPECT_TRUE(Gone(prefill));
    EXPECT_TRUE(Gone(decode));
    for (const char* f : {"router.pid", "prefill-0.pid", "decode-0.pid"}) fs::remove(dir_ / f);
  }
}

// --prefill-workers 2 --decode-workers 3: a temporary config (removed at
// exit) with prefill-0..1 and decode-0..2, each started under its name.
TEST_F(CliTest, UpResizesTheWorkerLists) {
  ProcessGroup group;
  StartUp(group, {"--prefill-workers", "2", "--decode-workers", "3"});
  absl::StatusOr<UpReady> ready = WaitForUpReady(group, 0, absl::Seconds(30));
  ASSERT_TRUE(ready.ok()) << ready.status();
  const std::string names[] = {"router",   "prefill-0", "prefill-1",
                               "decode-0", "decode-1",  "decode-2"};
  ASSERT_EQ(ready->processes.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(ready->processes[i].name, names[i]);
    EXPECT_EQ(ready->processes[i].pid, PidOf(names[i])) << names[i];
  }
  EXPECT_EQ(ready->Find("decode-2")->role, "decode");
  EXPECT_EQ(ready->Find("nobody"), nullptr);
  // Every child reads the same resized file, not --config.
  const std::string router_args = Slurp("router.args");
  const std::string prefix = "--name router --config ";
  ASSERT_THAT(router_args, StartsWith(prefix));
  const std::string resized =
      router_args.substr(prefix.size(), router_args.find(' ', prefix.size()) - prefix.size());
  EXPECT_NE(resized, config_);
  EXPECT_EQ(Slurp("decode-2.args"), "--role decode --name decode-2 --config " + resized +
                                        " --model " + model_ + " --router " +
                                        ready->router_address + "\n");
  absl::StatusOr<ClusterConfig> config = LoadClusterConfig(resized);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->prefill_workers.size(), 2u);
  EXPECT_EQ(config->decode_workers.size(), 3u);
  EXPECT_EQ(config->shutdown_grace_s, 1);
  ASSERT_EQ(kill(group.pid(0), SIGTERM), 0);
  EXPECT_EQ(AwaitExit(group), "exited with status 0");
  for (const std::string& name : names) EXPECT_TRUE(Gone(PidOf(name))) << name;
  EXPECT_FALSE(fs::exists(fs::path(resized).parent_path())) << resized;
}

TEST_F(CliTest, UpBadWorkerCountsAreOneLineAndExitTwo) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--prefill-workers", "-1"}, "--prefill-workers: must be in 0..64, got -1"},
      {{"--decode-workers", "0"}, "--decode-workers: must be in 1..64, got 0"},
      {{"--decode-workers", "x"}, "--decode-workers: expected an integer, got 'x'"},
      {{"--prefill-workers=1e3"}, "--prefill-workers: expected an integer, got '1e3'"}};
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> argv = {tandem_, "up", "--config", config_, "--model", model_};
    argv.insert(argv.end(), flags.begin(), flags.end());
    Result r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 2) << flags[0];
    EXPECT_EQ(r.err, "tandem up: " + message + " (usage: tandem up --help)\n");
  }
}

TEST_F(CliTest, UpGivesUpWhenTheClusterNeverBecomesReady) {
  ScopedEnv env("FAKE_ROUTER_NOT_READY", "1");
  ProcessGroup group;
  ::testing::internal::CaptureStderr();
  StartUp(group, {"--ready-timeout-s", "1"});
  const std::string how = AwaitExit(group);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(how, "exited with status 1");
  EXPECT_THAT(err, HasSubstr("tandem: cluster not ready within 1s: "));
  EXPECT_TRUE(Gone(PidOf("router")));
  EXPECT_TRUE(Gone(PidOf("decode-0")));
}

TEST_F(CliTest, SigkilledUpLeavesNoOrphans) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // orphans come to us
  ProcessGroup group;
  StartUp(group);
  ASSERT_TRUE(group.WaitForLine(0, kReady, absl::Seconds(30)).ok());
  const pid_t router = PidOf("router"), prefill = PidOf("prefill-0"), decode = PidOf("decode-0");
  ASSERT_EQ(kill(group.pid(0), SIGKILL), 0);
  EXPECT_EQ(AwaitExit(group), "killed by SIGKILL (signal 9)");
  for (pid_t pid : {router, prefill, decode}) {
    int status = 0;
    pid_t reaped = 0;
    for (int i = 0; i < 1000 && reaped == 0; ++i) {
      reaped = waitpid(pid, &status, WNOHANG);
      if (reaped == 0) usleep(10000);
    }
    if (reaped == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << pid << " outlived tandem up";
      continue;
    }
    // The fake router exits cleanly on SIGTERM; the shell workers die of it.
    EXPECT_EQ(DescribeWaitStatus(status),
              pid == router ? "exited with status 0" : "killed by SIGTERM (signal 15)");
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST_F(CliTest, UpStartUpErrorsAreOneLine) {
  fs::remove(dir_ / "tandem-router");
  Result r = RunCommand({tandem_, "up", "--config", config_, "--model", model_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "tandem: cannot run " + (dir_ / "tandem-router").string() +
                       " (build its target: cmake --build <dir> --target tandem-router)\n");
  // Issue #32: each with the OS's reason (strerror).
  r = RunCommand({tandem_, "up", "--config", (dir_ / "missing.yaml").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "tandem: cannot read cluster config '" + (dir_ / "missing.yaml").string() +
                       "': No such file or directory\n");
  r = RunCommand({tandem_, "up", "--config", dir_.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "tandem: cannot read cluster config '" + dir_.string() + "': Is a directory\n");
  r = RunCommand({tandem_, "up", "--config", config_, "--model", "/nonexistent.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "tandem: --model /nonexistent.gguf: cannot read model file: No such file or "
            "directory (pass --model PATH)\n");
  r = RunCommand({tandem_, "up", "--config", config_, "--model", dir_.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "tandem: --model " + dir_.string() +
                       ": cannot read model file: Is a directory (pass --model PATH)\n");
}

// Issue #32: a router that cannot load its model writes why on stderr and
// exits before it listens; tandem up then says which child exited, as for
// any start-up exit, not how it read the router's stdout.
TEST_F(CliTest, UpReportsARouterThatFailsToStart) {
  ScopedEnv bad_model("FAKE_ROUTER_BAD_MODEL", "1");
  Result r = RunCommand({tandem_, "up", "--config", config_, "--model", model_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr(model_ + ": not a GGUF file\n"));
  EXPECT_THAT(r.err, ::testing::ContainsRegex(
                         "\ntandem: router \\(pid [0-9]+\\) exited with status 1 unexpectedly; "
                         "stopping the cluster\n$"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("stdout")));
  EXPECT_FALSE(fs::exists(dir_ / "decode-0.args"));  // no worker was started
}

// --nccl-one-gpu-test on a cluster of CPU workers: one line naming the
// flag, exit 2, nothing started.
TEST_F(CliTest, UpRefusesTheNcclOneGpuTestModeWithoutACudaWorker) {
  Result r = RunCommand(
      {tandem_, "up", "--config", config_, "--model", model_, "--nccl-one-gpu-test"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "tandem up: --nccl-one-gpu-test: needs a worker on a CUDA device (every worker runs "
            "on cpu) (usage: tandem up --help)\n");
  EXPECT_FALSE(fs::exists(dir_ / "router.args"));
}

// P and D on cuda:0: with --nccl-one-gpu-test each worker (not the router)
// gets its own NCCL_HOSTID and the socket transport over loopback; without
// it, no NCCL variable at all. (The router, fake_router.cc here, gets none
// by construction: only worker spawns carry WorkerNcclEnv.)
TEST_F(CliTest, UpGivesEachWorkerItsNcclEnvironmentInTheOneGpuTestMode) {
  // None inherited from whoever runs the test.
  for (const char* name : {"NCCL_HOSTID", "NCCL_NET", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME"}) {
    unsetenv(name);
  }
  std::ofstream(config_) << "router: {listen: '127.0.0.1:0'}\n"
                            "prefill_workers: [{name: prefill-0, device: 'cuda:0'}]\n"
                            "decode_workers: [{name: decode-0, device: 'cuda:0'}]\n"
                            "shutdown_grace_s: 1\n";
  for (bool test_mode : {true, false}) {
    SCOPED_TRACE(test_mode ? "--nccl-one-gpu-test" : "no flag");
    for (const char* f : {"prefill-0.env", "decode-0.env", "prefill-0.pid",
                          "decode-0.pid", "prefill-0.args", "decode-0.args"}) {
      fs::remove(dir_ / f);
    }
    ProcessGroup group;
    StartUp(group, test_mode ? std::vector<std::string>{"--nccl-one-gpu-test"}
                             : std::vector<std::string>{});
    absl::StatusOr<UpReady> ready = WaitForUpReady(group, 0, absl::Seconds(30));
    ASSERT_TRUE(ready.ok()) << ready.status();
    Slurp("prefill-0.args");  // the fake writes <name>.env before <name>.args
    Slurp("decode-0.args");
    auto env_of = [&](const std::string& name) {
      std::ifstream in(dir_ / (name + ".env"));
      std::stringstream text;
      text << in.rdbuf();
      return text.str();
    };
    if (test_mode) {
      EXPECT_EQ(env_of("prefill-0"),
                "NCCL_HOSTID=tandem-prefill-0\nNCCL_IB_DISABLE=1\nNCCL_NET=Socket\n"
                "NCCL_SOCKET_IFNAME=lo\n");
      EXPECT_EQ(env_of("decode-0"),
                "NCCL_HOSTID=tandem-decode-0\nNCCL_IB_DISABLE=1\nNCCL_NET=Socket\n"
                "NCCL_SOCKET_IFNAME=lo\n");
    } else {
      EXPECT_EQ(env_of("prefill-0"), "");
      EXPECT_EQ(env_of("decode-0"), "");
    }
    ASSERT_EQ(kill(group.pid(0), SIGTERM), 0);
    EXPECT_EQ(AwaitExit(group), "exited with status 0");
  }
}

// Changes the working directory for the scope (children inherit it).
class ScopedCwd {
 public:
  explicit ScopedCwd(const fs::path& dir) : old_(fs::current_path()) { fs::current_path(dir); }
  ~ScopedCwd() { fs::current_path(old_); }

 private:
  fs::path old_;
};

// No model anywhere (no --model, $TANDEM_MODEL or `model:`, no default in a
// fresh working directory): up writes the synthetic model under models/,
// says so in one line, and gives the children that path.
TEST_F(CliTest, UpWithNoModelServesTheSyntheticOne) {
  const fs::path cwd = dir_ / "work";  // ../shared/models is then dir_/shared: absent
  fs::create_directory(cwd);
  ScopedCwd in(cwd);
  unsetenv("TANDEM_MODEL");
  const std::string kModel = "models/tandem-synthetic-byte.gguf";
  const std::string notice =
      "tandem: no model found; serving a small synthetic model with random weights "
      "(its text is random): " +
      kModel + "\n";
  fs::file_time_type written;
  for (int run = 0; run < 2; ++run) {  // the second run reuses the file
    ProcessGroup group;
    ::testing::internal::CaptureStderr();
    ASSERT_EQ(group.Spawn("tandem-up", {tandem_, "up", "--config", config_}).value_or(-1), 0);
    absl::StatusOr<std::string> address = group.WaitForLine(0, kReady, absl::Seconds(30));
    ASSERT_TRUE(address.ok()) << address.status();
    const std::string common = " --config " + config_ + " --model " + kModel;
    EXPECT_EQ(Slurp("router.args"), "--name router" + common + "\n");
    EXPECT_EQ(Slurp("decode-0.args"),
              "--role decode --name decode-0" + common + " --router " + *address + "\n");
    ASSERT_EQ(kill(group.pid(0), SIGTERM), 0);
    EXPECT_EQ(AwaitExit(group), "exited with status 0");
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_THAT(err, StartsWith(notice));
    EXPECT_EQ(err.find(notice, 1), std::string::npos) << err;  // once
    ASSERT_TRUE(fs::is_regular_file(cwd / kModel));
    if (run == 0) written = fs::last_write_time(cwd / kModel);
    EXPECT_EQ(fs::last_write_time(cwd / kModel), written) << "rewritten on run " << run;
    for (const char* f : {"router.args", "decode-0.args", "prefill-0.args"}) fs::remove(dir_ / f);
  }
  // An explicit choice that does not exist stays an error, files or not.
  Result r = RunCommand({tandem_, "up", "--config", config_, "--model", "missing.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "tandem: --model missing.gguf: cannot read model file: No such file or directory "
                   "(pass --model PATH)\n");
  {
    ScopedEnv env("TANDEM_MODEL", "missing.gguf");
    r = RunCommand({tandem_, "up", "--config", config_});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, StartsWith("tandem: $TANDEM_MODEL missing.gguf: cannot read model file"));
  }
  std::ofstream(config_, std::ios::app) << "model: missing.gguf\n";
  r = RunCommand({tandem_, "up", "--config", config_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, StartsWith("tandem: model (config) missing.gguf: cannot read model file"));
}

TEST_F(CliTest, GenerateJsonAndText) {
  ProcessGroup group;
  const std::string address = StartRouter(group);
  ASSERT_FALSE(address.empty());
  Result r = RunCommand({tandem_, "generate", "--router", address, "--json", "--max-tokens", "3",
                         "--seed", "9", "hi"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  const double ttft = j["timing"]["ttft_ms"], e2e = j["timing"]["e2e_ms"];
  EXPECT_LE(0, ttft);
  EXPECT_LE(ttft, e2e);
  // The fake router sends no RequestTiming: the server's fields are null.
  for (const char* f : {"server_ttft_ms", "router_queue_ms", "placement_ms", "prefill_queue_ms",
                        "prefill_ms", "kv_transfer_ms", "decode_admission_ms", "first_decode_ms"}) {
    EXPECT_TRUE(j["timing"][f].is_null()) << f;
  }
  j.erase("timing");
  EXPECT_EQ(j.dump(), nlohmann::json::parse(R"({
      "request_id": "fake-1", "route": "remote", "prefill_worker": "prefill-0",
      "decode_worker": "decode-0", "prompt_token_ids": [1, 2], "token_ids": [100, 101, 102],
      "text": " t0 t1 t2", "finish_reason": "length", "stop_reason": null,
      "usage": {"prompt_tokens": 2, "completion_tokens": 3, "cached_prompt_tokens": 0},
      "placement": null, "seed": 9})")
                          .dump());

  r = RunCommand({tandem_, "generate", "--router", address, "--max-tokens", "2", "--route", "local",
                  "hello", "there"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, " t0 t1\n");
}

TEST_F(CliTest, GenerateSeveralSamples) {
  ProcessGroup group;
  const std::string address = StartRouter(group);
  ASSERT_FALSE(address.empty());
  // Text: one line per sample, in finishing order (the fake finishes
  // sample 0 last).
  Result r =
      RunCommand({tandem_, "generate", "--router", address, "--n", "2", "--max-tokens", "2", "hi"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[sample 1]  s1t0 s1t1\n[sample 0]  t0 t1\n");
  // --json: sample 0 at the top, every sample under "samples".
  r = RunCommand({tandem_, "generate", "--router", address, "--json", "--n", "2", "--max-tokens",
                  "1", "--stop", "\n", "--logprobs", "2", "--seed", "1", "hi"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  j.erase("timing");
  EXPECT_EQ(j.dump(), nlohmann::json::parse(R"({
      "request_id": "fake-1", "route": "remote", "prefill_worker": "prefill-0",
      "decode_worker": "decode-0", "prompt_token_ids": [1, 2], "token_ids": [100],
      "text": " t0", "finish_reason": "stop", "stop_reason": "\n",
      "logprobs": [{"token_id": 100, "logprob": -0.5,
                    "top_logprobs": [{"token_id": 100, "logprob": -0.5},
                                     {"token_id": 101, "logprob": -1.5}]}],
      "usage": {"prompt_tokens": 2, "completion_tokens": 1, "cached_prompt_tokens": 0},
      "placement": null, "seed": 1,
      "samples": [
        {"sample_index": 0, "token_ids": [100], "text": " t0", "finish_reason": "stop",
         "stop_reason": "\n", "completion_tokens": 1,
         "logprobs": [{"token_id": 100, "logprob": -0.5,
                       "top_logprobs": [{"token_id": 100, "logprob": -0.5},
                                        {"token_id": 101, "logprob": -1.5}]}]},
        {"sample_index": 1, "token_ids": [1100], "text": " s1t0", "finish_reason": "stop",
         "stop_reason": "\n", "completion_tokens": 1,
         "logprobs": [{"token_id": 1100, "logprob": -0.5,
                       "top_logprobs": [{"token_id": 1100, "logprob": -0.5},
                                        {"token_id": 1101, "logprob": -1.5}]}]}]})")
                          .dump());
}

TEST_F(CliTest, GenerateErrors) {
  ProcessGroup group;
  const std::string address = StartRouter(group);
  ASSERT_FALSE(address.empty());
  Result r = RunCommand({tandem_, "generate", "--router", address, "fail"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "tandem: INVALID_ARGUMENT: prompt: rejected by the fake router\n");
  EXPECT_EQ(r.out, "");
  r = RunCommand({tandem_, "generate", "--router", "127.0.0.1:1", "hi"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, StartsWith("tandem: UNAVAILABLE: "));
  r = RunCommand({tandem_, "generate", "--route", "nowhere", "hi"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, StartsWith("tandem generate: --route: expected auto, local or remote"));
  // Issue #32: a value the router would refuse is a bad flag, refused
  // before any call (the address is unreachable), one line then the usage.
  r = RunCommand({tandem_, "generate", "--router", "127.0.0.1:1", "--max-tokens", "0", "hi"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, StartsWith("tandem generate: --max-tokens: must be >= 1, got 0\nusage: "));
}

TEST_F(CliTest, StatusExitCodes) {
  {
    ScopedEnv busy("FAKE_ROUTER_BUSY", "1");
    ProcessGroup group;
    const std::string address = StartRouter(group);
    ASSERT_FALSE(address.empty());
    EXPECT_EQ(RunCommand({tandem_, "status", "--router", address}).exit_code, 0);
    Result r = RunCommand({tandem_, "status", "--router", address, "--check-idle", "--json"});
    EXPECT_EQ(r.exit_code, 3);
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["can_serve"], true);
    EXPECT_EQ(j["workers"][0]["kv_blocks_in_use"], 3);
  }
  {
    ScopedEnv not_ready("FAKE_ROUTER_NOT_READY", "1");
    ProcessGroup group;
    const std::string address = StartRouter(group);
    ASSERT_FALSE(address.empty());
    Result r = RunCommand({tandem_, "status", "--router", address, "--check-idle"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err, "tandem: the cluster cannot serve\n");
  }
  Result r = RunCommand({tandem_, "status", "--router", "127.0.0.1:1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, StartsWith("tandem: UNAVAILABLE: "));
}

TEST_F(CliTest, UsageExitsTwoAndHelpZero) {
  EXPECT_EQ(RunCommand({tandem_}).exit_code, 2);
  for (std::vector<std::string> argv : {std::vector<std::string>{tandem_, "--help"},
                                        {tandem_, "up", "--help"},
                                        {tandem_, "synth-model", "-h"},
                                        {tandem_, "selftest", "--help"}}) {
    Result help = RunCommand(argv);
    EXPECT_EQ(help.exit_code, 0) << argv[1];
    EXPECT_THAT(help.out, StartsWith("usage: tandem <command>")) << argv[1];
    EXPECT_THAT(help.out, HasSubstr("  selftest  check the CUDA backend")) << argv[1];
    EXPECT_THAT(help.out, HasSubstr("[--preset 15M|110M|1B|llama3.2-1b")) << argv[1];
  }
  Result bad = RunCommand({tandem_, "selftest", "--device", "cuda"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, StartsWith("tandem selftest: --device: "));
  Result unknown = RunCommand({tandem_, "launch"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, StartsWith("tandem: unknown command 'launch'\nusage:"));
  // An unknown command is reported before any --help after it (it used to
  // print the general usage and exit 0).
  for (const char* help : {"--help", "-h"}) {
    Result unknown_help = RunCommand({tandem_, "no-such-command", help});
    EXPECT_EQ(unknown_help.exit_code, 2) << help;
    EXPECT_THAT(unknown_help.err,
                StartsWith("tandem: unknown command 'no-such-command'\nusage: tandem <command>"))
        << help;
    EXPECT_THAT(unknown_help.err, HasSubstr("  bench     a serving benchmark")) << help;
    EXPECT_EQ(unknown_help.out, "") << help;
  }
  // bench has its own usage: every flag, on stdout.
  Result bench_help = RunCommand({tandem_, "bench", "--help"});
  EXPECT_EQ(bench_help.exit_code, 0);
  EXPECT_THAT(bench_help.out, StartsWith("usage: tandem bench [--router H:P]"));
  EXPECT_THAT(bench_help.out, HasSubstr("[--goodput ttft:MS [tpot:MS] [e2el:MS]]"));
  EXPECT_EQ(bench_help.err, "");
  Result bench_bad = RunCommand({tandem_, "bench", "--request-rate", "0"});
  EXPECT_EQ(bench_bad.exit_code, 2);
  EXPECT_EQ(bench_bad.err,
            "tandem bench: --request-rate: must be > 0 or inf, got '0' (usage: tandem bench "
            "--help)\n");
  EXPECT_EQ(RunCommand({tandem_, "up", "--bogus"}).exit_code, 2);
  EXPECT_EQ(RunCommand({tandem_, "status", "--check-idle=yes"}).exit_code, 2);
  EXPECT_EQ(RunCommand({tandem_, "generate"}).exit_code, 2);
}

}  // namespace
}  // namespace tandem::cli
