// BuildKvDataPlanes (issue #16) on a worker whose KV is in host memory:
// what it supports under each kv.transport, and the refusal of a fixed
// device transport naming the worker (the config refuses it earlier; the
// worker checks again against its real backend).
#include "worker/kv_data_planes.h"

#include "engine/kv/cpu_kv_storage.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using kvtransfer::KvTransport;

ClusterConfig ConfigWith(kvtransfer::KvTransportSetting setting) {
  ClusterConfig c;
  c.decode_workers.push_back(WorkerConfig{});
  c.decode_workers[0].name = "decode-0";
  c.kv.transport = setting;
  return c;
}

TEST(KvTransportPlanesTest, AHostStorageHasNoDeviceCapability) {
  kv::CpuKvStorage storage(kv::KvShape{2, 1, 4, 4}, 2);
  const kvtransfer::TransportCapabilities caps = KvTransportCapabilities(storage);
  EXPECT_FALSE(caps.cuda_kv);
  EXPECT_FALSE(caps.nccl);
  EXPECT_FALSE(caps.cuda_ipc);
}

TEST(KvTransportPlanesTest, AutoAndTcpOnAHostStorageAreTcpOnly) {
  kv::CpuKvStorage storage(kv::KvShape{2, 1, 4, 4}, 2);
  for (kvtransfer::KvTransportSetting setting :
       {kvtransfer::KvTransportSetting{}, kvtransfer::KvTransportSetting{false, KvTransport::kTcp}}) {
    const ClusterConfig c = ConfigWith(setting);
    absl::StatusOr<KvDataPlanes> planes = BuildKvDataPlanes(c, c.decode_workers[0], storage);
    ASSERT_TRUE(planes.ok()) << planes.status();
    EXPECT_EQ(planes->transports, std::vector<KvTransport>{KvTransport::kTcp});
    EXPECT_TRUE(planes->senders.empty());
    EXPECT_TRUE(planes->receivers.empty());
    EXPECT_EQ(planes->sender(KvTransport::kTcp), nullptr);
    EXPECT_EQ(planes->receiver(KvTransport::kNccl), nullptr);
  }
}

TEST(KvTransportPlanesTest, AFixedDeviceTransportOnAHostStorageNamesTheWorker) {
  kv::CpuKvStorage storage(kv::KvShape{2, 1, 4, 4}, 2);
  for (KvTransport t : {KvTransport::kNccl, KvTransport::kCudaIpc}) {
    const ClusterConfig c = ConfigWith({false, t});
    absl::StatusOr<KvDataPlanes> planes = BuildKvDataPlanes(c, c.decode_workers[0], storage);
    EXPECT_EQ(planes.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string message(planes.status().message());
    EXPECT_EQ(message.rfind("decode-0: kv.transport ", 0), 0u) << message;
    EXPECT_NE(message.find("(this worker: cpu)"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace tandem
