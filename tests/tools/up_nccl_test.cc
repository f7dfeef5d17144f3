// tools/up_nccl: the exact NCCL environment of each worker child of
// `tandem up` with and without --nccl-one-gpu-test and
// kv.nccl_socket_ifname, and when the test mode is refused.
#include "tools/up_nccl.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::cli {
namespace {

using Env = std::vector<std::pair<std::string, std::string>>;

// P and D on cuda:0 (or both on the CPU when `device` is "cpu").
ClusterConfig Cluster(const std::string& device) {
  absl::StatusOr<ClusterConfig> c = ParseClusterConfig(
      "prefill_workers: [{name: prefill-0, device: " + device +
      "}]\n"
      "decode_workers: [{name: decode-0, device: " +
      device + "}]\n");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ClusterConfig();
}

bool HasName(const Env& env, const std::string& name) {
  for (const auto& [n, v] : env) {
    if (n == name) return true;
  }
  return false;
}

TEST(NcclTestModeEnvTest, TestModeGivesEachWorkerItsOwnHostIdAndTheSocketTransport) {
  UpNcclSettings s = UpNcclSettingsFor(Cluster("cuda:0"), /*one_gpu_test=*/true);
  EXPECT_TRUE(s.one_gpu_test);
  const Env p = WorkerNcclEnv(s, "prefill-0");
  const Env d = WorkerNcclEnv(s, "decode-0");
  EXPECT_EQ(p, (Env{{"NCCL_HOSTID", "tandem-prefill-0"},
                    {"NCCL_NET", "Socket"},
                    {"NCCL_IB_DISABLE", "1"},
                    {"NCCL_SOCKET_IFNAME", "lo"}}));
  EXPECT_EQ(d, (Env{{"NCCL_HOSTID", "tandem-decode-0"},
                    {"NCCL_NET", "Socket"},
                    {"NCCL_IB_DISABLE", "1"},
                    {"NCCL_SOCKET_IFNAME", "lo"}}));
}

TEST(NcclTestModeEnvTest, TestModesLoopbackWinsOverTheConfiguredInterface) {
  UpNcclSettings s;
  s.one_gpu_test = true;
  s.socket_ifname = "eth7";
  const Env d = WorkerNcclEnv(s, "decode-0");
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[3], (std::pair<std::string, std::string>{"NCCL_SOCKET_IFNAME", "lo"}));
  EXPECT_EQ(d[0], (std::pair<std::string, std::string>{"NCCL_HOSTID", "tandem-decode-0"}));
}

TEST(NcclTestModeEnvTest, WithoutTheFlagNoHostIdEver) {
  UpNcclSettings s = UpNcclSettingsFor(Cluster("cuda:0"), /*one_gpu_test=*/false);
  EXPECT_FALSE(s.one_gpu_test);
  EXPECT_EQ(s.kv_transport, "auto");
  EXPECT_EQ(s.socket_ifname, "");
  for (const char* name : {"prefill-0", "decode-0"}) {
    EXPECT_EQ(WorkerNcclEnv(s, name), Env{}) << name;
  }
  // kv.nccl_socket_ifname set: just that variable, for P and D alike.
  s.socket_ifname = "eth7";
  for (const char* name : {"prefill-0", "decode-0"}) {
    const Env env = WorkerNcclEnv(s, name);
    EXPECT_EQ(env, (Env{{"NCCL_SOCKET_IFNAME", "eth7"}})) << name;
    EXPECT_FALSE(HasName(env, "NCCL_HOSTID")) << name;
  }
}

// The settings come from the file: kv.transport and kv.nccl_socket_ifname.
TEST(NcclTestModeEnvTest, SettingsAreReadFromTheConfig) {
  for (const char* transport : {"tcp", "nccl", "cuda_ipc", "auto"}) {
    absl::StatusOr<ClusterConfig> c = ParseClusterConfig(
        std::string("kv: {transport: ") + transport +
        ", nccl_socket_ifname: eth3}\n"
        "prefill_workers: [{name: prefill-0, device: 'cuda:0'}]\n"
        "decode_workers: [{name: decode-0, device: 'cuda:0'}]\n");
    ASSERT_TRUE(c.ok()) << c.status();
    const UpNcclSettings s = UpNcclSettingsFor(*c, /*one_gpu_test=*/true);
    EXPECT_EQ(s.kv_transport, transport);
    EXPECT_EQ(s.socket_ifname, "eth3");
    const bool nccl_capable = std::string(transport) == "nccl" || std::string(transport) == "auto";
    EXPECT_EQ(CheckNcclOneGpuTest(*c, s).ok(), nccl_capable) << transport;
    EXPECT_EQ(WorkerNcclEnv(UpNcclSettingsFor(*c, false), "decode-0"),
              (Env{{"NCCL_SOCKET_IFNAME", "eth3"}}));
  }
}

TEST(NcclTestModeEnvTest, TestModeNeedsACudaWorkerAndAnNcclCapableTransport) {
  const ClusterConfig gpu = Cluster("cuda:0");
  const ClusterConfig cpu = Cluster("cpu");
  // Off: never refused.
  EXPECT_TRUE(CheckNcclOneGpuTest(cpu, UpNcclSettingsFor(cpu, false)).ok());
  EXPECT_TRUE(CheckNcclOneGpuTest(gpu, UpNcclSettingsFor(gpu, true)).ok());
  absl::Status s = CheckNcclOneGpuTest(cpu, UpNcclSettingsFor(cpu, true));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "--nccl-one-gpu-test: needs a worker on a CUDA device (every worker runs on cpu)");
  for (const char* transport : {"nccl", "auto"}) {
    UpNcclSettings ok = UpNcclSettingsFor(gpu, true);
    ok.kv_transport = transport;
    EXPECT_TRUE(CheckNcclOneGpuTest(gpu, ok).ok()) << transport;
  }
  for (const char* transport : {"tcp", "cuda_ipc"}) {
    UpNcclSettings bad = UpNcclSettingsFor(gpu, true);
    bad.kv_transport = transport;
    s = CheckNcclOneGpuTest(gpu, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << transport;
    EXPECT_EQ(s.message(), std::string("--nccl-one-gpu-test: needs kv.transport nccl or auto, got ") + transport);
  }
  // One CUDA worker is enough (the other on the CPU).
  absl::StatusOr<ClusterConfig> mixed = ParseClusterConfig(
      "engine: {kv_cache_dtype: f32}\n"
      "prefill_workers: [{name: prefill-0, device: cpu}]\n"
      "decode_workers: [{name: decode-0, device: 'cuda:0'}]\n");
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_TRUE(CheckNcclOneGpuTest(*mixed, UpNcclSettingsFor(*mixed, true)).ok());
}

}  // namespace
}  // namespace tandem::cli
