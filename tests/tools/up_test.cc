// Tests for tools/up's pure parts: flags, the dial address, the process
// lines, the resized worker lists and the ephemeral ports (tools/up_cluster).
#include "tools/up.h"

#include "common/cluster_config.h"
#include "gtest/gtest.h"
#include "tools/up_cluster.h"

namespace tandem::cli {
namespace {

TEST(UpArgsTest, DefaultsAndFlags) {
  absl::StatusOr<UpOptions> o = ParseUpArgs({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->config, "deploy/local/cluster.yaml");
  EXPECT_EQ(o->model, "");
  EXPECT_EQ(o->listen_timeout, absl::Seconds(30));
  EXPECT_EQ(o->ready_timeout, absl::Seconds(60));
  o = ParseUpArgs({"--config", "c.yaml", "--model=m.gguf", "--ready-timeout-s", "5"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->config, "c.yaml");
  EXPECT_EQ(o->model, "m.gguf");
  EXPECT_EQ(o->ready_timeout, absl::Seconds(5));
  EXPECT_EQ(ParseUpArgs({"now"}).status().message(), "unexpected argument 'now'");
  EXPECT_EQ(ParseUpArgs({"--ready-timeout-s", "0"}).status().message(),
            "--ready-timeout-s: must be > 0, got 0");
}

TEST(UpArgsTest, NcclOneGpuTestIsABooleanFlag) {
  absl::StatusOr<UpOptions> o = ParseUpArgs({});
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->nccl_one_gpu_test);
  o = ParseUpArgs({"--nccl-one-gpu-test"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->nccl_one_gpu_test);
  EXPECT_FALSE(ParseUpArgs({"--nccl-one-gpu-test=yes"}).ok());
}

TEST(UpArgsTest, EphemeralPortsIsABooleanFlag) {
  EXPECT_FALSE(ParseUpArgs({})->ephemeral_ports);
  absl::StatusOr<UpOptions> o = ParseUpArgs({"--ephemeral-ports"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->ephemeral_ports);
  EXPECT_EQ(ParseUpArgs({"--ephemeral-ports=1"}).status().message(),
            "--ephemeral-ports: takes no value");
}

TEST(UpArgsTest, WorkerCounts) {
  absl::StatusOr<UpOptions> o = ParseUpArgs({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->prefill_workers, std::nullopt);
  EXPECT_EQ(o->decode_workers, std::nullopt);
  o = ParseUpArgs({"--prefill-workers", "0", "--decode-workers=3"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->prefill_workers, 0);
  EXPECT_EQ(o->decode_workers, 3);
  o = ParseUpArgs({"--decode-workers", "64"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->prefill_workers, std::nullopt);
  EXPECT_EQ(o->decode_workers, 64);
  EXPECT_EQ(ParseUpArgs({"--prefill-workers", "-1"}).status().message(),
            "--prefill-workers: must be in 0..64, got -1");
  EXPECT_EQ(ParseUpArgs({"--decode-workers", "0"}).status().message(),
            "--decode-workers: must be in 1..64, got 0");
  EXPECT_EQ(ParseUpArgs({"--decode-workers", "65"}).status().message(),
            "--decode-workers: must be in 1..64, got 65");
  EXPECT_EQ(ParseUpArgs({"--prefill-workers", "two"}).status().message(),
            "--prefill-workers: expected an integer, got 'two'");
  EXPECT_EQ(ParseUpArgs({"--decode-workers", "1.5"}).status().message(),
            "--decode-workers: expected an integer, got '1.5'");
  EXPECT_EQ(ParseUpArgs({"--decode-workers"}).status().message(),
            "--decode-workers: missing value");
}

TEST(UpProcessTest, FormatAndParse) {
  const UpProcess decode{"decode-1",        "decode", 4321, "127.0.0.1:40001",
                         "127.0.0.1:40002", "",       ""};
  const std::string line = FormatUpProcess(decode);
  EXPECT_EQ(line,
            "tandem: process decode-1 role=decode pid=4321 address=127.0.0.1:40001 "
            "kv=127.0.0.1:40002");
  absl::StatusOr<UpProcess> back = ParseUpProcess(line.substr(sizeof(kUpProcessPrefix) - 1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->name, "decode-1");
  EXPECT_EQ(back->role, "decode");
  EXPECT_EQ(back->pid, 4321);
  EXPECT_EQ(back->address, "127.0.0.1:40001");
  EXPECT_EQ(back->kv_endpoint, "127.0.0.1:40002");
  EXPECT_EQ(FormatUpProcess({"router", "router", 7, "[::1]:50051", "", "", ""}),
            "tandem: process router role=router pid=7 address=[::1]:50051");
  back = ParseUpProcess("router role=router pid=7 address=[::1]:50051");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kv_endpoint, "");
  // The bound HTTP and metrics addresses (issue #32), each only when set.
  const UpProcess router{"router", "router", 7, "127.0.0.1:50051", "", "127.0.0.1:8000", ""};
  EXPECT_EQ(FormatUpProcess(router),
            "tandem: process router role=router pid=7 address=127.0.0.1:50051 "
            "http=127.0.0.1:8000");
  UpProcess d = decode;
  d.metrics_address = "127.0.0.1:9102";
  EXPECT_EQ(FormatUpProcess(d),
            "tandem: process decode-1 role=decode pid=4321 address=127.0.0.1:40001 "
            "kv=127.0.0.1:40002 metrics=127.0.0.1:9102");
  back = ParseUpProcess(FormatUpProcess(d).substr(sizeof(kUpProcessPrefix) - 1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kv_endpoint, "127.0.0.1:40002");
  EXPECT_EQ(back->metrics_address, "127.0.0.1:9102");
  EXPECT_EQ(back->http_address, "");
  back = ParseUpProcess("p role=prefill pid=8 address=a:1 metrics=b:2");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->metrics_address, "b:2");
  EXPECT_EQ(back->kv_endpoint, "");
  back = ParseUpProcess("router role=router pid=7 address=a:1 http=h:1 metrics=m:2");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->http_address, "h:1");
  EXPECT_EQ(back->metrics_address, "m:2");
  for (const char* bad :
       {"", "router", "router role=router pid=x address=a:1",
        "router pid=7 role=router address=a:1", "r role=router pid=7 address=a:1 x=1",
        "r role=router pid=0 address=a:1", "r role=router pid=7 address=a:1 metrics=m:1 kv=k:1",
        "r role=router pid=7 address=a:1 kv=k:1 kv=k:2", "r role=router pid=7 address=a:1 http=",
        "r role=router pid=7 kv=k:1"}) {
    EXPECT_EQ(ParseUpProcess(bad).status().message(),
              std::string("not a tandem up process line: '") + bad + "'");
  }
}

// The text of deploy/local/cluster.yaml's lists, with fixed ports and
// advertise addresses to show which keys are copied and which are zeroed.
constexpr char kTwoListed[] = R"(
model: m.gguf
router: {name: router, listen: 127.0.0.1:50051}
prefill_workers:
  - name: p-a
    listen: 0.0.0.0:50061
    advertise: 10.0.0.5:50061
    metrics_listen: 0.0.0.0:9101
decode_workers:
  - listen: 0.0.0.0:50071
    name: d-a
    advertise: 10.0.0.5
    kv_listen: 0.0.0.0:50072
    kv_advertise: 10.0.0.6:50072
  - name: d-b
    listen: 127.0.0.1:50073
    kv_listen: 127.0.0.1:50074
engine: {block_size: 32}
shutdown_grace_s: 1
)";

ClusterConfig ResizedConfig(const std::string& yaml, std::optional<int> prefill,
                            std::optional<int> decode) {
  absl::StatusOr<std::string> text = ResizeWorkerLists(yaml, prefill, decode);
  EXPECT_TRUE(text.ok()) << text.status();
  absl::StatusOr<ClusterConfig> config = ParseClusterConfig(text.value_or(""));
  EXPECT_TRUE(config.ok()) << config.status() << "\n" << text.value_or("");
  return config.value_or(ClusterConfig());
}

TEST(ResizeWorkerListsTest, ListedEntriesKeepTheirPortsExtraOnesAreEphemeral) {
  const ClusterConfig c = ResizedConfig(kTwoListed, 3, 3);
  ASSERT_EQ(c.prefill_workers.size(), 3u);
  ASSERT_EQ(c.decode_workers.size(), 3u);
  // Listed entries: renamed, every other key as written.
  EXPECT_EQ(c.prefill_workers[0].name, "prefill-0");
  EXPECT_EQ(c.prefill_workers[0].listen.ToString(), "0.0.0.0:50061");
  EXPECT_EQ(c.prefill_workers[0].advertise.host, "10.0.0.5");
  EXPECT_EQ(c.prefill_workers[0].advertise.port, 50061);
  EXPECT_EQ(c.decode_workers[0].name, "decode-0");
  EXPECT_EQ(c.decode_workers[0].listen.ToString(), "0.0.0.0:50071");
  EXPECT_EQ(c.decode_workers[0].kv_listen.ToString(), "0.0.0.0:50072");
  EXPECT_EQ(c.decode_workers[0].kv_advertise.port, 50072);
  EXPECT_EQ(c.decode_workers[1].name, "decode-1");
  EXPECT_EQ(c.decode_workers[1].listen.ToString(), "127.0.0.1:50073");
  EXPECT_EQ(c.decode_workers[1].kv_listen.ToString(), "127.0.0.1:50074");
  // Extra entries: the last listed one with port 0 everywhere.
  for (int i : {1, 2}) {
    const WorkerConfig& p = c.prefill_workers[i];
    EXPECT_EQ(p.name, "prefill-" + std::to_string(i));
    EXPECT_EQ(p.listen.ToString(), "0.0.0.0:0");
    EXPECT_EQ(p.advertise.host, "10.0.0.5");
    EXPECT_EQ(p.advertise.port, 0);
    ASSERT_TRUE(p.metrics_listen.has_value());
    EXPECT_EQ(p.metrics_listen->ToString(), "0.0.0.0:0");
  }
  ASSERT_TRUE(c.prefill_workers[0].metrics_listen.has_value());
  EXPECT_EQ(c.prefill_workers[0].metrics_listen->ToString(), "0.0.0.0:9101");
  EXPECT_EQ(c.decode_workers[2].name, "decode-2");
  EXPECT_EQ(c.decode_workers[2].listen.ToString(), "127.0.0.1:0");
  EXPECT_EQ(c.decode_workers[2].kv_listen.ToString(), "127.0.0.1:0");
  EXPECT_TRUE(c.decode_workers[2].advertise.empty());
  // Everything else is copied.
  EXPECT_EQ(c.model, "m.gguf");
  EXPECT_EQ(c.router.listen.ToString(), "127.0.0.1:50051");
  EXPECT_EQ(c.engine.block_size, 32);
  EXPECT_EQ(c.shutdown_grace_s, 1);
}

TEST(ResizeWorkerListsTest, ShrinksKeepsAnUnresizedRoleAndAllowsNoPrefill) {
  ClusterConfig c = ResizedConfig(kTwoListed, 0, 1);
  EXPECT_TRUE(c.prefill_workers.empty());
  ASSERT_EQ(c.decode_workers.size(), 1u);
  EXPECT_EQ(c.decode_workers[0].name, "decode-0");
  EXPECT_EQ(c.decode_workers[0].listen.ToString(), "0.0.0.0:50071");
  // Only --decode-workers: the prefill list stays as written (name too).
  c = ResizedConfig(kTwoListed, std::nullopt, 4);
  ASSERT_EQ(c.prefill_workers.size(), 1u);
  EXPECT_EQ(c.prefill_workers[0].name, "p-a");
  EXPECT_EQ(c.decode_workers.size(), 4u);
  EXPECT_EQ(c.decode_workers[3].name, "decode-3");
}

TEST(ResizeWorkerListsTest, ARoleWithNoEntryTakesTheOtherRolesHosts) {
  const ClusterConfig c = ResizedConfig(
      "decode_workers:\n"
      "  - {name: d, listen: '0.0.0.0:7000', advertise: 'node-1:7000', kv_listen: "
      "'0.0.0.0:7001'}\n",
      2, std::nullopt);
  ASSERT_EQ(c.prefill_workers.size(), 2u);
  EXPECT_EQ(c.prefill_workers[1].name, "prefill-1");
  EXPECT_EQ(c.prefill_workers[1].listen.ToString(), "0.0.0.0:0");
  EXPECT_EQ(c.prefill_workers[1].advertise.host, "node-1");
  EXPECT_EQ(c.prefill_workers[1].advertise.port, 0);
  EXPECT_EQ(c.decode_workers[0].name, "d");
  // A flow-style entry with no listen at all copies as it is (default
  // 127.0.0.1:0); an IPv6 advertise keeps its brackets.
  const ClusterConfig v6 = ResizedConfig(
      "prefill_workers: [{name: p}]\n"
      "decode_workers: [{name: d, listen: '[::]:7000', advertise: '[fd00::1]:7000'}]\n",
      2, 2);
  EXPECT_EQ(v6.prefill_workers[1].listen.ToString(), "127.0.0.1:0");
  EXPECT_EQ(v6.decode_workers[1].listen.ToString(), "[::]:0");
  EXPECT_EQ(v6.decode_workers[1].advertise.host, "fd00::1");
  EXPECT_EQ(v6.decode_workers[1].advertise.port, 0);
}

TEST(ResizeWorkerListsTest, Errors) {
  EXPECT_EQ(ResizeWorkerLists(kTwoListed, -1, 1).status().message(),
            "prefill worker count must be in 0..64, got -1");
  EXPECT_EQ(ResizeWorkerLists(kTwoListed, 1, 0).status().message(),
            "decode worker count must be in 1..64, got 0");
  EXPECT_EQ(ResizeWorkerLists("decode_workers: 3\n", 1, 1).status().message(),
            "decode_workers: expected a list");
  EXPECT_EQ(ResizeWorkerLists("decode_workers: [3]\n", 1, 1).status().message(),
            "decode_workers[0]: expected a map");
  EXPECT_EQ(ResizeWorkerLists("- 1\n", 1, 1).status().message(), "cluster config: expected a map");
  EXPECT_FALSE(ResizeWorkerLists("a: [\n", 1, 1).ok());
  // Names the resized lists take that another entry already has are left
  // for ParseClusterConfig to refuse.
  absl::StatusOr<std::string> clash = ResizeWorkerLists(
      "prefill_workers: [{name: decode-1}]\ndecode_workers: [{name: d}]\n", std::nullopt, 2);
  ASSERT_TRUE(clash.ok()) << clash.status();
  EXPECT_EQ(ParseClusterConfig(*clash).status().message(),
            "duplicate process name 'decode-1': router and worker names must be unique");
}

// --ephemeral-ports (issue #32): every listen port that is not 0 becomes 0,
// the advertise address of such a listener loses its port; the rest as
// written.
TEST(EphemeralPortsTest, EveryFixedListenPortBecomesZero) {
  std::string with_http = kTwoListed;
  with_http.replace(with_http.find("listen: 127.0.0.1:50051}"), 24,
                    "listen: 127.0.0.1:50051, advertise: 'router.local:50051', "
                    "http_listen: 127.0.0.1:8000, metrics_listen: 127.0.0.1:9100}");
  absl::StatusOr<std::string> text = EphemeralPorts(with_http);
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(*text);
  ASSERT_TRUE(c.ok()) << c.status() << "\n" << *text;
  EXPECT_EQ(c->router.listen.ToString(), "127.0.0.1:0");
  EXPECT_EQ(c->router.advertise.host, "router.local");
  EXPECT_EQ(c->router.advertise.port, 0);
  ASSERT_TRUE(c->router.http_listen.has_value());
  EXPECT_EQ(c->router.http_listen->ToString(), "127.0.0.1:0");
  ASSERT_TRUE(c->router.metrics_listen.has_value());
  EXPECT_EQ(c->router.metrics_listen->ToString(), "127.0.0.1:0");
  ASSERT_EQ(c->prefill_workers.size(), 1u);
  const WorkerConfig& p = c->prefill_workers[0];
  EXPECT_EQ(p.name, "p-a");
  EXPECT_EQ(p.listen.ToString(), "0.0.0.0:0");
  EXPECT_EQ(p.advertise.host, "10.0.0.5");
  EXPECT_EQ(p.advertise.port, 0);
  ASSERT_TRUE(p.metrics_listen.has_value());
  EXPECT_EQ(p.metrics_listen->ToString(), "0.0.0.0:0");
  ASSERT_EQ(c->decode_workers.size(), 2u);
  EXPECT_EQ(c->decode_workers[0].listen.ToString(), "0.0.0.0:0");
  EXPECT_EQ(c->decode_workers[0].advertise.host, "10.0.0.5");
  EXPECT_EQ(c->decode_workers[0].kv_listen.ToString(), "0.0.0.0:0");
  EXPECT_EQ(c->decode_workers[0].kv_advertise.host, "10.0.0.6");
  EXPECT_EQ(c->decode_workers[0].kv_advertise.port, 0);
  EXPECT_EQ(c->decode_workers[1].listen.ToString(), "127.0.0.1:0");
  EXPECT_EQ(c->decode_workers[1].kv_listen.ToString(), "127.0.0.1:0");
  EXPECT_FALSE(c->decode_workers[1].metrics_listen.has_value());  // none stays none
  EXPECT_EQ(c->model, "m.gguf");
  EXPECT_EQ(c->engine.block_size, 32);
  EXPECT_EQ(c->shutdown_grace_s, 1);
}

TEST(EphemeralPortsTest, PortZeroStaysAsWrittenAndAnAbsentRouterListenIsWrittenOut) {
  // A listener already on port 0 keeps its advertise port (a mapping the
  // user chose); router.listen's default 127.0.0.1:50051 is written out as
  // port 0.
  absl::StatusOr<std::string> text = EphemeralPorts(
      "decode_workers: [{name: d, listen: '127.0.0.1:0', advertise: 'gw:7000'}]\n");
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(*text);
  ASSERT_TRUE(c.ok()) << c.status() << "\n" << *text;
  EXPECT_EQ(c->router.listen.ToString(), "127.0.0.1:0");
  EXPECT_FALSE(c->router.http_listen.has_value());
  EXPECT_EQ(c->decode_workers[0].listen.ToString(), "127.0.0.1:0");
  EXPECT_EQ(c->decode_workers[0].advertise.port, 7000);
  // deploy/local/cluster.yaml's fixed ports, IPv6 included.
  text = EphemeralPorts(
      "router: {listen: '[::1]:50051', http_listen: '127.0.0.1:8000'}\n"
      "prefill_workers: [{name: p, listen: '127.0.0.1:0', metrics_listen: '127.0.0.1:9101'}]\n"
      "decode_workers: [{name: d, metrics_listen: '[::]:9102'}]\n");
  ASSERT_TRUE(text.ok()) << text.status();
  c = ParseClusterConfig(*text);
  ASSERT_TRUE(c.ok()) << c.status() << "\n" << *text;
  EXPECT_EQ(c->router.listen.ToString(), "[::1]:0");
  EXPECT_EQ(c->router.http_listen->ToString(), "127.0.0.1:0");
  EXPECT_EQ(c->prefill_workers[0].metrics_listen->ToString(), "127.0.0.1:0");
  EXPECT_EQ(c->decode_workers[0].metrics_listen->ToString(), "[::]:0");
}

TEST(EphemeralPortsTest, Errors) {
  EXPECT_EQ(EphemeralPorts("- 1\n").status().message(), "cluster config: expected a map");
  EXPECT_EQ(EphemeralPorts("router: 3\n").status().message(), "router: expected a map");
  EXPECT_EQ(EphemeralPorts("decode_workers: 3\n").status().message(),
            "decode_workers: expected a list");
  EXPECT_EQ(EphemeralPorts("prefill_workers: [3]\n").status().message(),
            "prefill_workers[0]: expected a map");
  EXPECT_FALSE(EphemeralPorts("a: [\n").ok());
}

TEST(SplitGpuMemoryTest, WorkersSharingAGpuDivideTheFraction) {
  absl::StatusOr<ClusterConfig> config = ParseClusterConfig(R"(
prefill_workers:
  - {name: prefill-0}
  - {name: prefill-1, device: "cuda:1"}
decode_workers:
  - {name: decode-0}
  - {name: decode-1, device: cpu}
  - {name: decode-2}
engine: {device: "cuda:0", kv_cache_dtype: f32}
)");
  ASSERT_TRUE(config.ok()) << config.status();
  std::vector<GpuShare> shares = SplitGpuMemory(*config);
  ASSERT_EQ(shares.size(), 1u);  // cuda:1 has one worker; decode-1 is on the CPU
  EXPECT_EQ(shares[0].device, "cuda:0");
  EXPECT_EQ(shares[0].workers, (std::vector<std::string>{"prefill-0", "decode-0", "decode-2"}));
  EXPECT_DOUBLE_EQ(shares[0].fraction, 0.3);
  EXPECT_EQ(FormatGpuShare(shares[0], 0.9),
            "GPU cuda:0: 3 workers (prefill-0, decode-0, decode-2), "
            "engine.gpu_memory_fraction 0.9 split as 0.3 each");
  EXPECT_EQ(GpuShareFlagValue(shares[0].fraction), "0.3");

  absl::StatusOr<ClusterConfig> two = ParseClusterConfig(
      "prefill_workers: [{name: prefill-0}]\n"
      "decode_workers: [{name: decode-0}, {name: decode-1, device: \"cuda:1\"},\n"
      "                 {name: decode-2, device: \"cuda:1\"}]\n"
      "engine: {device: \"cuda:0\", gpu_memory_fraction: 0.9}\n");
  ASSERT_TRUE(two.ok()) << two.status();
  shares = SplitGpuMemory(*two);
  ASSERT_EQ(shares.size(), 2u);
  EXPECT_EQ(FormatGpuShare(shares[0], 0.9),
            "GPU cuda:0: 2 workers (prefill-0, decode-0), engine.gpu_memory_fraction 0.9 "
            "split as 0.45 each");
  EXPECT_EQ(FormatGpuShare(shares[1], 0.9),
            "GPU cuda:1: 2 workers (decode-1, decode-2), engine.gpu_memory_fraction 0.9 "
            "split as 0.45 each");
  EXPECT_EQ(GpuShareFlagValue(shares[0].fraction), "0.45");
  // Shares that are not round, or tiny, are neither truncated nor shown
  // as zero.
  EXPECT_EQ(GpuShareFlagValue(0.9 / 4), "0.225");
  EXPECT_EQ(GpuShareFlagValue(0.0001 / 2), "5e-05");
}

TEST(SplitGpuMemoryTest, NoSharedGpuNoSplit) {
  absl::StatusOr<ClusterConfig> cpu = ParseClusterConfig("decode_workers: [{name: d}, {name: e}]\n");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(SplitGpuMemory(*cpu).empty());
  absl::StatusOr<ClusterConfig> own = ParseClusterConfig(
      "decode_workers: [{name: d, device: \"cuda:0\"}, {name: e, device: \"cuda:1\"}]\n");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_TRUE(SplitGpuMemory(*own).empty());
}

TEST(SplitGpuMemoryTest, FlagValueRoundsDownSoSharesNeverExceedTheFraction) {
  EXPECT_EQ(GpuShareFlagValue(1.0 / 6), "0.166666");
  EXPECT_EQ(GpuShareFlagValue(0.2 / 3), "0.0666666");
  EXPECT_EQ(GpuShareFlagValue(0.9), "0.9");
  EXPECT_EQ(GpuShareFlagValue(1.0), "1");
}

TEST(DialAddressTest, WildcardsBecomeLoopback) {
  EXPECT_EQ(DialAddress("0.0.0.0:50051"), "127.0.0.1:50051");
  EXPECT_EQ(DialAddress("[::]:7"), "[::1]:7");
  EXPECT_EQ(DialAddress("127.0.0.1:40000"), "127.0.0.1:40000");
  EXPECT_EQ(DialAddress("router.svc:1"), "router.svc:1");
  EXPECT_EQ(DialAddress("garbage"), "garbage");
}

}  // namespace
}  // namespace tandem::cli
