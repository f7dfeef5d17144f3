// Start-up errors of the real server binaries: each must exit with status
// 1 (not a signal, not a hang) and say what is wrong in one stderr line
// (worker/worker_main.h, router/main.cc).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "engine/backend/device.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/test_util.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A listening socket held on an ephemeral port of 127.0.0.1 (port 0 when
// it could not be made), closed on destruction: a port a server must
// find busy.
struct BusyPort {
  BusyPort() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd, 1) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
  }
  ~BusyPort() {
    if (fd >= 0) close(fd);
  }
  BusyPort(const BusyPort&) = delete;
  BusyPort& operator=(const BusyPort&) = delete;
  int fd = -1;
  int port = 0;
};

// A server that fails at start-up is expected within this time; one that
// starts instead is killed then and the test fails.
constexpr absl::Duration kExitTimeout = absl::Seconds(15);

enum class Server { kRouter, kPrefill, kDecode };

std::string ServerName(Server s) {
  switch (s) {
    case Server::kRouter:
      return "router";
    case Server::kPrefill:
      return "prefill";
    case Server::kDecode:
      return "decode";
  }
  return "";
}

void PrintTo(Server s, std::ostream* os) { *os << ServerName(s); }

// The command line of `server` on `config` and `model`, as the fixture's.
std::vector<std::string> ServerArgv(Server server, const std::string& config,
                                    const std::string& model) {
  switch (server) {
    case Server::kRouter:
      return {
          BinaryPath("tandem-router"), "--config", config, "--name", "router", "--model", model};
    case Server::kPrefill:
      return {BinaryPath("tandem-prefill-worker"),
              "--config",
              config,
              "--name",
              LocalCluster::kPrefillName,
              "--model",
              model,
              "--router",
              "127.0.0.1:1"};
    case Server::kDecode:
      return {BinaryPath("tandem-decode-worker"),
              "--config",
              config,
              "--name",
              LocalCluster::kDecodeName,
              "--model",
              model,
              "--router",
              "127.0.0.1:1"};
  }
  return {};
}

// Exit status 1 and exactly one stderr line, which is returned ("" after a
// test failure).
std::string ExpectOneLineFailure(const ProcessResult& r) {
  EXPECT_FALSE(r.timed_out) << "still running after " << kExitTimeout;
  EXPECT_TRUE(r.exited) << r.Describe();
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.out, Not(HasSubstr("TANDEM_LISTENING")));
  const std::vector<std::string> lines = Lines(r.err);
  EXPECT_EQ(lines.size(), 1u) << r.err;
  return lines.empty() ? "" : lines[0];
}

class StartupErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }
  // Writes `contents` as <dir>/<name> and returns the path.
  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    EXPECT_TRUE(WriteFile(path, contents)) << path;
    return path;
  }

  std::string dir_;
};

// ---- Unknown config key -----------------------------------------------------------

class UnknownConfigKeyTest : public StartupErrorTest,
                             public ::testing::WithParamInterface<Server> {};

TEST_P(UnknownConfigKeyTest, ExitsOneNamingTheKey) {
  const std::string yaml = absl::StrReplaceAll(
      ClusterYaml(ClusterOptions()), {{"  threads: 1\n", "  threads: 1\n  bogus_key: 3\n"}});
  ASSERT_THAT(yaml, HasSubstr("bogus_key"));
  const std::string config = Write("cluster.yaml", yaml);
  const std::string line =
      ExpectOneLineFailure(RunProcess(ServerArgv(GetParam(), config, ModelPath()), kExitTimeout));
  EXPECT_THAT(line, HasSubstr("engine.bogus_key"));
}

INSTANTIATE_TEST_SUITE_P(Servers, UnknownConfigKeyTest,
                         ::testing::Values(Server::kRouter, Server::kPrefill, Server::kDecode),
                         [](const ::testing::TestParamInfo<Server>& info) {
                           return ServerName(info.param);
                         });

// ---- --help -----------------------------------------------------------------------

class HelpTest : public StartupErrorTest, public ::testing::WithParamInterface<Server> {};

// --help (and -h) print the usage to stdout and exit 0, whatever else is on
// the line; every flag the usage names is one the binary accepts.
TEST_P(HelpTest, PrintsUsageAndExitsZero) {
  for (const char* help : {"--help", "-h"}) {
    SCOPED_TRACE(help);
    std::vector<std::string> argv = ServerArgv(GetParam(), "/nonexistent.yaml", ModelPath());
    argv.push_back(help);
    const ProcessResult r = RunProcess(argv, kExitTimeout);
    EXPECT_TRUE(r.exited && r.exit_code == 0) << r.Describe();
    EXPECT_THAT(r.out, HasSubstr("usage: tandem-"));
    EXPECT_EQ(r.err, "");
    for (const char* flag : {"--config PATH", "--model PATH", "--name NAME"}) {
      EXPECT_THAT(r.out, HasSubstr(flag));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Servers, HelpTest,
                         ::testing::Values(Server::kRouter, Server::kPrefill, Server::kDecode),
                         [](const ::testing::TestParamInfo<Server>& info) {
                           return ServerName(info.param);
                         });

// ---- tandem-worker --role (issue #33) ----------------------------------------------

// The one worker binary: --role picks the role's usage and flags; without a
// role, or with another one, it is a one-line start-up error.
TEST_F(StartupErrorTest, WorkerBinaryTakesItsRole) {
  for (const char* role : {"prefill", "decode"}) {
    SCOPED_TRACE(role);
    const ProcessResult r =
        RunProcess({BinaryPath("tandem-worker"), "--role", role, "--help"}, kExitTimeout);
    EXPECT_TRUE(r.exited && r.exit_code == 0) << r.Describe();
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("usage: tandem-worker --role ", role)));
    for (const char* flag : {"--config PATH", "--model PATH", "--name NAME", "--router"}) {
      EXPECT_THAT(r.out, HasSubstr(flag));
    }
    // Every worker has a KV receiver (it may become a decode worker).
    EXPECT_THAT(r.out, HasSubstr("--kv-advertise"));
  }
  const std::string config = Write("cluster.yaml", ClusterYaml(ClusterOptions()));
  EXPECT_EQ(
      ExpectOneLineFailure(RunProcess(
          {BinaryPath("tandem-worker"), "--config", config, "--name", "decode-0"}, kExitTimeout)),
      "--role is required: prefill or decode");
  EXPECT_EQ(ExpectOneLineFailure(RunProcess(
                {BinaryPath("tandem-worker"), "--role=router", "--config", config}, kExitTimeout)),
            "--role: expected prefill or decode, got 'router'");
  // Two roles on one line (a fresh user's slip): refused, not "unknown flag".
  EXPECT_EQ(
      ExpectOneLineFailure(RunProcess({BinaryPath("tandem-worker"), "--role", "decode",
                                       "--role=prefill", "--config", config, "--name", "decode-0"},
                                      kExitTimeout)),
      "flag --role given more than once");
}

// ---- Wildcard listen address without advertise ----------------------------------------

class WildcardListenTest : public StartupErrorTest, public ::testing::WithParamInterface<Server> {};

// 0.0.0.0 binds every interface, but no peer can dial it: the address
// other hosts use must be given (issue #12, item 1).
TEST_P(WildcardListenTest, ExitsOneNamingTheKeyAndItsAdvertise) {
  ClusterOptions options;
  std::string key;
  if (GetParam() == Server::kRouter) {
    options.router_listen = "0.0.0.0:0";
    key = "router.";
  } else {
    options.worker_listen_host = "0.0.0.0";
    key = GetParam() == Server::kPrefill
              ? absl::StrCat("prefill_workers[", LocalCluster::kPrefillName, "].")
              : absl::StrCat("decode_workers[", LocalCluster::kDecodeName, "].");
  }
  const std::string config = Write("cluster.yaml", ClusterYaml(options));
  const std::string line =
      ExpectOneLineFailure(RunProcess(ServerArgv(GetParam(), config, ModelPath()), kExitTimeout));
  EXPECT_THAT(line, HasSubstr(key + "listen: binds the wildcard address 0.0.0.0"));
  EXPECT_THAT(line, HasSubstr(key + "advertise"));
  // A wildcard given as the advertise is refused too.
  std::vector<std::string> argv = ServerArgv(GetParam(), config, ModelPath());
  argv.push_back("--advertise");
  argv.push_back("0.0.0.0");
  EXPECT_THAT(ExpectOneLineFailure(RunProcess(argv, kExitTimeout)),
              HasSubstr("--advertise: '0.0.0.0' is a wildcard address"));
}

INSTANTIATE_TEST_SUITE_P(Servers, WildcardListenTest,
                         ::testing::Values(Server::kRouter, Server::kPrefill, Server::kDecode),
                         [](const ::testing::TestParamInfo<Server>& info) {
                           return ServerName(info.param);
                         });

// ---- Bad model file -----------------------------------------------------------------

enum class BadModel { kNotGguf, kTruncated };

struct BadModelCase {
  Server server;
  BadModel model;
};

std::string BadModelCaseName(const BadModelCase& c) {
  return ServerName(c.server) + (c.model == BadModel::kNotGguf ? "_not_gguf" : "_truncated");
}
void PrintTo(const BadModelCase& c, std::ostream* os) { *os << BadModelCaseName(c); }

class BadModelTest : public StartupErrorTest, public ::testing::WithParamInterface<BadModelCase> {};

TEST_P(BadModelTest, ExitsOneWithAClearMessage) {
  const std::string config = Write("cluster.yaml", ClusterYaml(ClusterOptions()));
  std::string model;
  std::string why;  // what the message must say besides the path
  if (GetParam().model == BadModel::kNotGguf) {
    std::string garbage;
    for (int i = 0; i < 4096; ++i) garbage.push_back(static_cast<char>((i * 131 + 7) % 251));
    model = Write("garbage.gguf", garbage);
    why = "GGUF";
  } else {
    const std::string real = ReadFileOrDie(ModelPath());
    ASSERT_GT(real.size(), 1000u);
    model = Write("truncated.gguf", real.substr(0, 1000));
    why = "truncated";
  }
  const std::string line =
      ExpectOneLineFailure(RunProcess(ServerArgv(GetParam().server, config, model), kExitTimeout));
  EXPECT_THAT(line, HasSubstr(model));
  EXPECT_THAT(absl::AsciiStrToLower(line), HasSubstr(absl::AsciiStrToLower(why)));
}

INSTANTIATE_TEST_SUITE_P(Servers, BadModelTest,
                         ::testing::Values(BadModelCase{Server::kRouter, BadModel::kNotGguf},
                                           BadModelCase{Server::kRouter, BadModel::kTruncated},
                                           BadModelCase{Server::kPrefill, BadModel::kNotGguf},
                                           BadModelCase{Server::kPrefill, BadModel::kTruncated},
                                           BadModelCase{Server::kDecode, BadModel::kNotGguf},
                                           BadModelCase{Server::kDecode, BadModel::kTruncated}),
                         [](const ::testing::TestParamInfo<BadModelCase>& info) {
                           return BadModelCaseName(info.param);
                         });

// ---- Device and KV dtype refused by the backend factory ------------------------------

// Exit status 1, the refusal as the last stderr line (after the model's
// "loaded" log line) and no other line naming `key`; returns that line.
std::string ExpectBackendRefusal(const ProcessResult& r, const std::string& key) {
  EXPECT_FALSE(r.timed_out) << "still running after " << kExitTimeout;
  EXPECT_TRUE(r.exited) << r.Describe();
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.out, Not(HasSubstr("TANDEM_LISTENING")));
  const std::vector<std::string> lines = Lines(r.err);
  int naming = 0;
  for (const std::string& l : lines) naming += l.find(key) != std::string::npos;
  EXPECT_EQ(naming, 1) << r.err;
  return lines.empty() ? "" : lines.back();
}

// True where the CUDA runtime sees a device (then cuda:0 would start).
bool HasCudaGpu() { return backend::SystemDeviceQuery().DeviceCount(nullptr) > 0; }

class WorkerBackendRefusalTest : public StartupErrorTest,
                                 public ::testing::WithParamInterface<Server> {};

// engine.device: cuda:0 on a machine without a GPU (this one, CI): the
// worker refuses at start in one line naming engine.device.
TEST_P(WorkerBackendRefusalTest, Cuda0WithoutAGpuNamesEngineDevice) {
  if (HasCudaGpu()) GTEST_SKIP() << "a CUDA GPU is present: cuda:0 would start";
  const std::string yaml = absl::StrReplaceAll(
      ClusterYaml(ClusterOptions()), {{"  threads: 1\n", "  threads: 1\n  device: \"cuda:0\"\n"}});
  ASSERT_THAT(yaml, HasSubstr("cuda:0"));
  const std::string config = Write("cluster.yaml", yaml);
  const std::string line = ExpectBackendRefusal(
      RunProcess(ServerArgv(GetParam(), config, ModelPath()), kExitTimeout), "engine.device");
  EXPECT_THAT(line, ::testing::StartsWith("engine.device: cuda:0, but this "));
}

// --gpu-memory-fraction is validated before the model loads: one line.
TEST_P(WorkerBackendRefusalTest, GpuMemoryFractionFlagIsValidated) {
  const std::string config = Write("cluster.yaml", ClusterYaml(ClusterOptions()));
  std::vector<std::string> argv = ServerArgv(GetParam(), config, ModelPath());
  argv.insert(argv.end(), {"--gpu-memory-fraction", "0.5"});
  EXPECT_EQ(ExpectOneLineFailure(RunProcess(argv, kExitTimeout)),
            "--gpu-memory-fraction: this worker runs on cpu (no GPU memory to divide)");
  argv.back() = "1.5";
  EXPECT_EQ(ExpectOneLineFailure(RunProcess(argv, kExitTimeout)),
            "--gpu-memory-fraction: must be in (0, 1], got 1.5");
}

// `tandem up` with both workers on cuda:0 prints how it splits the GPU's
// memory between them, then fails at start with the workers' refusal (no
// GPU here).
TEST_F(StartupErrorTest, UpSplitsTheGpuMemoryFractionAndReportsTheRefusal) {
  if (HasCudaGpu()) GTEST_SKIP() << "a CUDA GPU is present: the cluster would start";
  const std::string yaml = absl::StrReplaceAll(
      ClusterYaml(ClusterOptions()), {{"  threads: 1\n", "  threads: 1\n  device: \"cuda:0\"\n"}});
  const std::string config = Write("cluster.yaml", yaml);
  const ProcessResult r = RunProcess(
      {BinaryPath("tandem"), "up", "--config", config, "--model", ModelPath()}, kExitTimeout);
  EXPECT_FALSE(r.timed_out) << r.Describe();
  EXPECT_TRUE(r.exited) << r.Describe();
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(Lines(r.err), ::testing::Contains(absl::StrCat(
                                "tandem: GPU cuda:0: 2 workers (", LocalCluster::kPrefillName, ", ",
                                LocalCluster::kDecodeName,
                                "), engine.gpu_memory_fraction 0.9 split as "
                                "0.45 each")))
      << r.err;
  EXPECT_THAT(r.err, HasSubstr("engine.device: cuda:0, but this machine has no CUDA GPU"));
}

INSTANTIATE_TEST_SUITE_P(Workers, WorkerBackendRefusalTest,
                         ::testing::Values(Server::kPrefill, Server::kDecode),
                         [](const ::testing::TestParamInfo<Server>& info) {
                           return ServerName(info.param);
                         });

// ---- Busy port ----------------------------------------------------------------------

TEST_F(StartupErrorTest, RouterOnBusyPortExitsOneNamingRouterListen) {
  const BusyPort held;
  ASSERT_GT(held.port, 0);
  const int port = held.port;

  ClusterOptions options;
  options.router_listen = absl::StrCat("127.0.0.1:", port);
  const std::string config = Write("cluster.yaml", ClusterYaml(options));
  const ProcessResult r =
      RunProcess(ServerArgv(Server::kRouter, config, ModelPath()), kExitTimeout);
  EXPECT_FALSE(r.timed_out) << "the router started on a busy port";
  EXPECT_TRUE(r.exited) << r.Describe();
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("router.listen"));
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat(port)));
}

// router.metrics_listen (and --metrics-listen, which wins) that cannot be
// bound: exit 1 naming the key or flag.
TEST_F(StartupErrorTest, RouterMetricsListenOnBusyPortExitsOneNamingIt) {
  const BusyPort held;
  ASSERT_GT(held.port, 0);
  const std::string busy = absl::StrCat("127.0.0.1:", held.port);

  ClusterOptions options;
  options.router_metrics_listen = busy;
  const std::string config = Write("cluster.yaml", ClusterYaml(options));
  const ProcessResult r =
      RunProcess(ServerArgv(Server::kRouter, config, ModelPath()), kExitTimeout);
  EXPECT_TRUE(r.exited) << r.Describe();
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("router.metrics_listen: cannot listen on " + busy));
  EXPECT_THAT(r.out, Not(HasSubstr("TANDEM_METRICS_LISTENING")));

  options.router_metrics_listen = "127.0.0.1:0";  // the flag wins over a good key
  std::vector<std::string> argv =
      ServerArgv(Server::kRouter, Write("flag.yaml", ClusterYaml(options)), ModelPath());
  argv.push_back("--metrics-listen");
  argv.push_back(busy);
  const ProcessResult f = RunProcess(argv, kExitTimeout);
  EXPECT_TRUE(f.exited) << f.Describe();
  EXPECT_EQ(f.exit_code, 1) << f.Describe();
  EXPECT_THAT(f.err, HasSubstr("--metrics-listen: cannot listen on " + busy));
}

}  // namespace
}  // namespace tandem::testing
