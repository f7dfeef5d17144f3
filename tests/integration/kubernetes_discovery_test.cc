// What Kubernetes relies on in the router and workers (issue #18), with
// real processes:
//   * RouterRegistration registers with every address the router's name
//     resolves to (two real routers on 127.0.0.1:P and 127.0.0.2:P, the
//     same port, as a headless Service's A records would give), logs each
//     once, and stops heartbeating an address that leaves the answer; a name
//     that does not resolve is logged once and retried, and a worker whose
//     --router does not resolve keeps running.
//   * --config-entry: a worker takes its settings from the entry named there
//     and registers under its --name (a pod name the config does not list).
//   * The "liveness" health service is SERVING where "" (readiness) is
//     NOT_SERVING: a router without workers, a draining worker.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "worker/router_registration.h"
#include "common/server/server_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"
#include "tests/test_util.h"
#include "tools/process_group.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// grpc.health.v1.HealthCheckResponse as bytes: field 1 (status) = SERVING
// (1) / NOT_SERVING (2), from grpc's health.proto.
const std::string kServing("\x08\x01", 2);
const std::string kNotServing("\x08\x02", 2);

// grpc.health.v1.Health/Check of `service` at `address`: the response's
// bytes (kServing, kNotServing), or "error: <message>".
std::string HealthCheck(const std::string& address, const std::string& service) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  const std::string wire = WireLen(1, service);  // HealthCheckRequest.service
  grpc::Slice slice(wire);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return absl::StrCat("error: ", status.error_code(), " ", status.error_message());
  grpc::Slice bytes;
  if (!response.DumpToSingleSlice(&bytes).ok()) return "error: unreadable response";
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

// Generation.GetStatus of the router at `address`.
absl::StatusOr<v1::ClusterStatus> RouterStatus(const std::string& address) {
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ClusterStatus status;
  grpc::Status s = stub->GetStatus(&context, v1::GetStatusRequest(), &status);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return status;
}

// The worker `name` in the router's status, or nullptr.
const v1::WorkerStatus* FindWorker(const v1::ClusterStatus& status, const std::string& name) {
  for (const v1::WorkerStatus& w : status.workers()) {
    if (w.name() == name) return &w;
  }
  return nullptr;
}

// A port free a moment ago on both 127.0.0.1 and 127.0.0.2 (0 if none
// found in a few tries).
int PortFreeOnBothLoopbacks() {
  auto bind_to = [](const char* ip, int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, ip, &addr.sin_addr);
    socklen_t len = sizeof(addr);
    int bound = -1;
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      bound = ntohs(addr.sin_port);
    }
    close(fd);
    return bound;
  };
  for (int attempt = 0; attempt < 20; ++attempt) {
    const int port = bind_to("127.0.0.1", 0);
    if (port > 0 && bind_to("127.0.0.2", port) == port) return port;
  }
  return 0;
}

// Lines of `log` containing `needle`.
int CountLines(const std::string& log, const std::string& needle) {
  int n = 0;
  for (const std::string& line : Lines(log)) n += line.find(needle) != std::string::npos;
  return n;
}

std::string ReadAll(const std::string& path) {
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

// A temporary directory with the default cluster YAML, removed at the end.
class KubernetesDiscoveryTest : public OwnClusterTest {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    ASSERT_FALSE(dir_.empty());
    config_ = dir_ + "/cluster.yaml";
    ASSERT_TRUE(WriteFile(config_, ClusterYaml(ClusterOptions())));
  }
  void TearDown() override {
    group_.StopAll(absl::Seconds(5));
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  // Starts a router of config_ on `listen`; its address.
  absl::StatusOr<std::string> StartRouter(const std::string& name, const std::string& listen) {
    absl::StatusOr<int> index =
        group_.Spawn(name, {BinaryPath("tandem-router"), "--config", config_, "--model",
                            ModelPath(), "--listen", listen});
    if (!index.ok()) return index.status();
    return group_.WaitForLine(*index, "TANDEM_LISTENING ", absl::Seconds(30));
  }

  // Starts a decode worker of config_ with `flags`, stderr to `err_path`;
  // its index in group_ (its TANDEM_LISTENING address in *address).
  absl::StatusOr<int> StartDecodeWorker(const std::string& name,
                                        const std::vector<std::string>& flags,
                                        const std::string& err_path, std::string* address) {
    std::vector<std::string> argv = {BinaryPath("tandem-decode-worker"), "--config", config_,
                                     "--model", ModelPath()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<int> index =
        group_.Spawn(name, argv, cli::ProcessGroup::SpawnOptions{.stderr_path = err_path, .env = {}});
    if (!index.ok()) return index.status();
    absl::StatusOr<std::string> listening =
        group_.WaitForLine(*index, "TANDEM_LISTENING ", absl::Seconds(30));
    if (!listening.ok()) return listening.status();
    *address = *listening;
    return index;
  }

  std::string dir_;
  std::string config_;
  cli::ProcessGroup group_;
};

// A resolver the test changes while RouterRegistration runs, and the log
// lines it wrote.
struct FakeDns {
  absl::Mutex mu;
  absl::StatusOr<std::vector<std::string>> answer ABSL_GUARDED_BY(mu);
  int calls ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::string> lines ABSL_GUARDED_BY(mu);

  void Set(absl::StatusOr<std::vector<std::string>> a) {
    absl::MutexLock lock(&mu);
    answer = std::move(a);
  }
  std::string Log() {
    absl::MutexLock lock(&mu);
    std::string all;
    for (const std::string& l : lines) absl::StrAppend(&all, l, "\n");
    return all;
  }
  int Calls() {
    absl::MutexLock lock(&mu);
    return calls;
  }
  void Wire(RouterRegistrationOptions* options) {
    options->resolve = [this](const std::string&) {
      absl::MutexLock lock(&mu);
      ++calls;
      return answer;
    };
    options->log = [this](const std::string& line) {
      absl::MutexLock lock(&mu);
      lines.push_back(line);
    };
  }
};

TEST_F(KubernetesDiscoveryTest, RegistersWithEveryResolvedRouterAndStopsWithOneThatGoes) {
  const int port = PortFreeOnBothLoopbacks();
  ASSERT_NE(port, 0) << "no port free on both 127.0.0.1 and 127.0.0.2";
  const std::string a = absl::StrCat("127.0.0.1:", port);
  const std::string b = absl::StrCat("127.0.0.2:", port);
  // router.drop_after_ms 1500: the router the worker stops heartbeating
  // forgets it soon (the registered address answers no poll).
  {
    ClusterOptions o;
    o.drop_after_ms = 1500;
    ASSERT_TRUE(WriteFile(config_, ClusterYaml(o)));
  }
  for (const auto& [name, listen] : {std::pair{"router-a", a}, std::pair{"router-b", b}}) {
    absl::StatusOr<std::string> started = StartRouter(name, listen);
    ASSERT_TRUE(started.ok()) << started.status();
    ASSERT_EQ(*started, listen);
  }
  absl::StatusOr<v1::ClusterStatus> first = RouterStatus(a);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string fingerprint = first->router().model_fingerprint();

  const std::string name = "decode-7c9f-x2k4";  // a pod name the config does not list
  const std::string router = absl::StrCat("tandem-router-peers.test:", port);
  FakeDns dns;
  dns.Set(std::vector<std::string>{a, b});
  RouterRegistrationOptions options;
  options.router = router;
  options.request.set_name(name);
  options.request.set_role(v1::ROLE_DECODE);
  options.request.set_address("127.0.0.1:1");  // nothing answers the router's polls there
  options.request.set_kv_endpoint("127.0.0.1:1");
  options.request.set_model_fingerprint(fingerprint);
  // The router's expected layout for an unlisted name (engine.device's):
  // stories260K, 5 layers, 4 KV heads of 8, f32.
  options.request.set_kv_layout_id(absl::StrCat("kv4/", fingerprint, "/L5.H4.D8/f32"));
  options.resolve_interval = absl::Milliseconds(100);
  dns.Wire(&options);
  RouterRegistration registration(std::move(options));
  registration.Start();

  for (const std::string& address : {a, b}) {
    EXPECT_TRUE(PollUntil(absl::Seconds(10), [&] {
      absl::StatusOr<v1::ClusterStatus> s = RouterStatus(address);
      return s.ok() && FindWorker(*s, name) != nullptr;
    })) << "router " << address << " does not list " << name << "\n" << dns.Log();
  }
  absl::SleepFor(absl::Milliseconds(500));  // a few resolves and heartbeats more
  EXPECT_EQ(CountLines(dns.Log(), absl::StrCat("registered with router ", router, " (", a, ")")),
            1)
      << dns.Log();
  EXPECT_EQ(CountLines(dns.Log(), absl::StrCat("registered with router ", router, " (", b, ")")),
            1)
      << dns.Log();

  dns.Set(std::vector<std::string>{a});
  const std::string gone =
      absl::StrCat("router ", router, " no longer resolves to ", b, "; stopped registering there");
  EXPECT_TRUE(PollUntil(absl::Seconds(5), [&] { return CountLines(dns.Log(), gone) == 1; }))
      << dns.Log();
  // No heartbeat reaches b any more: it drops the worker (drop_after_ms)
  // and keeps it dropped.
  EXPECT_TRUE(PollUntil(absl::Seconds(15), [&] {
    absl::StatusOr<v1::ClusterStatus> s = RouterStatus(b);
    return s.ok() && FindWorker(*s, name) == nullptr;
  })) << "router " << b << " still lists " << name;
  absl::SleepFor(absl::Milliseconds(1500));
  absl::StatusOr<v1::ClusterStatus> after = RouterStatus(b);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(FindWorker(*after, name), nullptr) << after->DebugString();
  EXPECT_EQ(CountLines(dns.Log(), gone), 1) << dns.Log();
  EXPECT_EQ(CountLines(dns.Log(), "registered with router"), 2) << dns.Log();
  registration.Stop();
  EXPECT_EQ(registration.refusal(), "");
}

TEST(RouterResolveTest, NameThatDoesNotResolveIsLoggedOnceAndRetried) {
  FakeDns dns;
  dns.Set(absl::UnavailableError("Name or service not known"));
  RouterRegistrationOptions options;
  options.router = "tandem-router-peers.test:50051";
  options.request.set_name("decode-0");
  options.resolve_interval = absl::Milliseconds(20);
  dns.Wire(&options);
  RouterRegistration registration(std::move(options));
  registration.Start();
  EXPECT_TRUE(PollUntil(absl::Seconds(5), [&] { return dns.Calls() >= 5; }));
  registration.Stop();
  EXPECT_EQ(dns.Log(),
            "router tandem-router-peers.test:50051 does not resolve: Name or service not known; "
            "retrying\n");
}

TEST(RouterResolveTest, ResolvesLiteralsToThemselvesAndNamesToEveryAddress) {
  using Addresses = std::vector<std::string>;
  EXPECT_EQ(ResolveRouterAddresses("127.0.0.1:50051").value_or(Addresses{}),
            Addresses{"127.0.0.1:50051"});
  EXPECT_EQ(ResolveRouterAddresses("[::1]:7").value_or(Addresses{}), Addresses{"[::1]:7"});
  absl::StatusOr<std::vector<std::string>> local = ResolveRouterAddresses("localhost:9");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_THAT(*local, ::testing::Contains("127.0.0.1:9"));
  absl::StatusOr<std::vector<std::string>> none = ResolveRouterAddresses("no-such-host.invalid:1");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable) << none.status();
  absl::StatusOr<std::vector<std::string>> bad = ResolveRouterAddresses("no-port");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
}

TEST_F(KubernetesDiscoveryTest, WorkerWhoseRouterDoesNotResolveKeepsRunningAndRetries) {
  const std::string err = dir_ + "/worker.err";
  std::string address;
  absl::StatusOr<int> worker = StartDecodeWorker(
      "decode-0", {"--name", "decode-0", "--router", "no-such-host.invalid:50051"}, err, &address);
  ASSERT_TRUE(worker.ok()) << worker.status() << "\n" << ReadAll(err);
  const std::string line = "router no-such-host.invalid:50051 does not resolve: ";
  EXPECT_TRUE(PollUntil(absl::Seconds(10), [&] { return CountLines(ReadAll(err), line) == 1; }))
      << ReadAll(err);
  // Past the next resolve (kRouterResolveInterval): still running, logged once.
  absl::SleepFor(kRouterResolveInterval + absl::Seconds(1));
  EXPECT_FALSE(group_.ReapExited().has_value()) << ReadAll(err);
  EXPECT_TRUE(group_.running(*worker));
  EXPECT_EQ(CountLines(ReadAll(err), line), 1) << ReadAll(err);
  EXPECT_THAT(ReadAll(err), HasSubstr("; retrying\n"));
  // Alive, but ready only once registered with a router.
  EXPECT_EQ(HealthCheck(address, ""), kNotServing);
  EXPECT_EQ(HealthCheck(address, rpc::kLivenessHealthService), kServing);
}

// A router that resolves but does not answer: the worker says so once,
// keeps trying and is not ready; once a router answers there, it is.
TEST_F(KubernetesDiscoveryTest, WorkerNotYetRegisteredIsNotReadyAndSaysWhy) {
  const int port = PortFreeOnBothLoopbacks();
  ASSERT_NE(port, 0);
  const std::string router = absl::StrCat("127.0.0.1:", port);
  const std::string err = dir_ + "/worker.err";
  std::string address;
  absl::StatusOr<int> worker =
      StartDecodeWorker("decode-0", {"--name", "decode-0", "--router", router}, err, &address);
  ASSERT_TRUE(worker.ok()) << worker.status() << "\n" << ReadAll(err);
  const std::string line = absl::StrCat("router ", router, ": cannot register (UNAVAILABLE: ");
  EXPECT_TRUE(PollUntil(absl::Seconds(10), [&] { return CountLines(ReadAll(err), line) == 1; }))
      << ReadAll(err);
  absl::SleepFor(absl::Seconds(1));  // five more attempts: still one line
  EXPECT_EQ(CountLines(ReadAll(err), line), 1) << ReadAll(err);
  EXPECT_EQ(HealthCheck(address, ""), kNotServing);
  EXPECT_EQ(HealthCheck(address, rpc::kLivenessHealthService), kServing);

  absl::StatusOr<std::string> started = StartRouter("router", router);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_TRUE(PollUntil(absl::Seconds(10), [&] { return HealthCheck(address, "") == kServing; }))
      << ReadAll(err);
  EXPECT_THAT(ReadAll(err), HasSubstr("registered with router " + router));
}

// A Deployment's replica: settings from entry decode-0, registered under
// its pod name, held to the router's expected layout for unlisted names.
TEST_F(KubernetesDiscoveryTest, ConfigEntryReplicaRegistersUnderItsPodName) {
  ClusterOptions o;
  o.capture_stderr = true;
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  const std::string err = dir_ + "/pod.err";
  const std::string pod = "decode-7c9f-x2k4";
  std::string address;
  absl::StatusOr<int> worker = StartDecodeWorker(
      pod,
      {"--config-entry", LocalCluster::kDecodeName, "--name", pod, "--router",
       cluster().router_address()},
      err, &address);
  ASSERT_TRUE(worker.ok()) << worker.status() << "\n" << ReadAll(err);
  v1::ClusterStatus last;
  EXPECT_TRUE(PollUntil(absl::Seconds(10), [&] {
    absl::StatusOr<v1::ClusterStatus> s = cluster().ClusterStatus();
    if (!s.ok()) return false;
    last = *s;
    const v1::WorkerStatus* w = FindWorker(last, pod);
    return w != nullptr && w->healthy() && w->address() == address;
  })) << last.DebugString() << "\n" << ReadAll(err);
  const v1::WorkerStatus* w = FindWorker(last, pod);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->role(), v1::ROLE_DECODE);
  EXPECT_EQ(w->kv_layout_id(),
            absl::StrCat("kv4/", last.router().model_fingerprint(), "/L5.H4.D8/f32"));
  // The entry's own worker is still there beside it.
  ASSERT_NE(FindWorker(last, LocalCluster::kDecodeName), nullptr);
  EXPECT_EQ(CountLines(ReadAll(err), absl::StrCat(pod, ": registered with router ",
                                                  cluster().router_address())),
            1)
      << ReadAll(err);
}

TEST_F(KubernetesDiscoveryTest, ConfigEntryErrorsNameTheEntry) {
  const std::vector<std::string> base = {BinaryPath("tandem-decode-worker"), "--config", config_,
                                         "--model", ModelPath(), "--name", "decode-pod-1"};
  auto run = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunProcess(argv, absl::Seconds(30));
  };
  ProcessResult r = run({"--config-entry", "decode"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_EQ(r.err, absl::StrCat("--config-entry decode: no such entry in decode_workers of ",
                                config_, "\n"));
  // Without --config-entry the name is the entry, as before.
  r = run({});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_EQ(r.err, absl::StrCat("--name decode-pod-1: no such entry in decode_workers of ",
                                config_, "\n"));
  r = run({"--config-entry", "decode-0", "--router", "no-port"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("--router: expected host:port, got 'no-port'"));
  r = run({"--config-entry", "decode-0", "--router", "127.0.0.1:0"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_EQ(r.err, "--router: port 0 cannot be dialled; give the router's port (got "
                   "'127.0.0.1:0')\n");
  r = run({"--config-entry", "decode-0", "--advertise", "$(POD_IP)"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("an unexpanded $(VAR)"));
  // A wildcard listen without advertise: the key names the entry.
  ClusterOptions wildcard;
  wildcard.worker_listen_host = "0.0.0.0";
  ASSERT_TRUE(WriteFile(config_, ClusterYaml(wildcard)));
  r = run({"--config-entry", "decode-0"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("decode_workers[decode-0].listen"));
  EXPECT_THAT(r.err, Not(HasSubstr("decode-pod-1")));
}

TEST_F(KubernetesDiscoveryTest, RouterWithoutWorkersIsAliveButNotReady) {
  absl::StatusOr<std::string> router = StartRouter("router", "127.0.0.1:0");
  ASSERT_TRUE(router.ok()) << router.status();
  EXPECT_EQ(HealthCheck(*router, ""), kNotServing);
  EXPECT_EQ(HealthCheck(*router, rpc::kLivenessHealthService), kServing);
}

// SIGTERM with streams running (as ClusterShutdownTest's drain test): the
// worker is no longer ready but still alive until its streams are done.
TEST_F(KubernetesDiscoveryTest, DrainingWorkerIsAliveButNotReady) {
  ClusterOptions o;
  o.poll_interval_ms = 100;
  o.shutdown_grace_s = 30;
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  const std::string decode = cluster().decode_address();
  EXPECT_EQ(HealthCheck(decode, ""), kServing);
  EXPECT_EQ(HealthCheck(decode, rpc::kLivenessHealthService), kServing);
  const GoldenCase& g = Golden("boundary_33tok");
  std::vector<std::unique_ptr<GenerateStream>> streams;
  for (int i = 0; i < 64; ++i) {
    streams.push_back(std::make_unique<GenerateStream>(
        cluster().stub(), MakeRequest(g.prompt, 400, v1::ROUTE_LOCAL), absl::Seconds(60)));
  }
  for (auto& s : streams) ASSERT_TRUE(s->ReadUntilFirstToken()) << s->Finish().status.error_message();
  ASSERT_EQ(kill(cluster().decode_pid(), SIGTERM), 0);
  EXPECT_TRUE(PollUntil(absl::Seconds(5), [&] {
    return HealthCheck(decode, "") == kNotServing;
  }));
  EXPECT_EQ(HealthCheck(decode, rpc::kLivenessHealthService), kServing);
  // Still draining while it answered.
  absl::StatusOr<v1::WorkerStatus> status = cluster().DecodeStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_GT(status->running_requests(), 0);
  for (auto& s : streams) EXPECT_TRUE(s->Finish().status.ok());
}

}  // namespace
}  // namespace tandem::testing
