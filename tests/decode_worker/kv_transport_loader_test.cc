// The decode worker's transport offer (issue #16): every load's
// RemotePrefillTarget carries the receiver's transports, this host's id and
// the process's instance id (-> NeedRemotePrefill -> the router's KvTarget);
// the per-transport byte counters read the right source. A real KvReceiver
// on 127.0.0.1; the device data path is a recording fake (its transfers
// need the control plane and are not run here).
#include <memory>
#include <string>
#include <vector>

#include "decode_worker/remote_kv_loader.h"
#include "engine/kv/cpu_kv_storage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::decode {
namespace {

using kvtransfer::KvTransport;
using ::testing::ElementsAre;

kvtransfer::KvLayout Layout() {
  kvtransfer::KvLayout layout;
  layout.model_fingerprint = "fp";
  layout.n_layers = 2;
  layout.n_kv_heads = 1;
  layout.head_dim = 4;
  layout.dtype = kv::KvDtype::kF32;
  return layout;
}

kvtransfer::KvReceiver::Options ReceiverOptions() {
  kvtransfer::KvReceiver::Options o;
  o.handshake_timeout_ms = 2000;
  o.transfer_timeout_ms = 2000;
  return o;
}

// A data receiver that only reports a byte total.
class FakeDataReceiver : public kvtransfer::KvDataReceiver {
 public:
  explicit FakeDataReceiver(KvTransport t) : transport_(t) {}
  KvTransport transport() const override { return transport_; }
  absl::Status OpenTransfer(const kvtransfer::TransferKey&, std::string_view,
                            const kvtransfer::DeviceKvTarget&) override {
    return absl::OkStatus();
  }
  void Receive(const kvtransfer::TransferKey&, const kvtransfer::FrameDescriptor&,
               std::function<void(absl::Status)> done) override {
    done(absl::UnimplementedError("not in this test"));
  }
  void CloseTransfer(const kvtransfer::TransferKey&, std::function<void()> quiesced) override {
    quiesced();
  }
  uint64_t bytes_total() const override { return bytes; }
  uint64_t bytes = 0;

 private:
  const KvTransport transport_;
};

bool IsHex32(const std::string& s) {
  return s.size() == 32 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST(KvTransportLoaderTest, ATcpOnlyReceiverOffersTcpWithItsHostAndInstance) {
  auto loader = ReceiverKvLoader::Start(ReceiverOptions(), Layout());
  ASSERT_TRUE(loader.ok()) << loader.status();
  const kvtransfer::TransportOffer& offer = (*loader)->offer();
  EXPECT_EQ(offer.transports, std::vector<KvTransport>{KvTransport::kTcp});
  EXPECT_EQ(offer.host_id, kvtransfer::LocalHostId());
  EXPECT_TRUE(IsHex32(offer.instance_id)) << offer.instance_id;

  kv::CpuKvStorage storage(kv::KvShape{2, 1, 4, 4}, 4);
  auto target = (*loader)->StartLoad("r1", 3, 2, 9, &storage, {0, 1, 2},
                                     [](absl::Status, core::RemotePrefillResult) {});
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(target->kv_endpoint, (*loader)->endpoint());
  EXPECT_EQ(target->hit_tokens, 2);
  EXPECT_EQ(target->attempt, 3u);
  EXPECT_THAT(target->kv_transports, ElementsAre("tcp"));
  EXPECT_EQ(target->kv_host_id, offer.host_id);
  EXPECT_EQ(target->kv_instance_id, offer.instance_id);
  (*loader)->CancelLoad("r1");

  // Another process (loader) is another instance.
  auto other = ReceiverKvLoader::Start(ReceiverOptions(), Layout());
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE((*other)->offer().instance_id, offer.instance_id);
  EXPECT_EQ((*other)->offer().host_id, offer.host_id);
}

TEST(KvTransportLoaderTest, PlanesSetTheOfferAndTheByteCounters) {
  auto nccl = std::make_shared<FakeDataReceiver>(KvTransport::kNccl);
  auto planes = std::make_shared<KvDataPlanes>();
  planes->transports = {KvTransport::kNccl, KvTransport::kTcp};
  planes->receivers = {nccl.get()};
  planes->owners = {nccl};
  auto loader = ReceiverKvLoader::Start(ReceiverOptions(), Layout(), planes);
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ((*loader)->offer().transports,
            (std::vector<KvTransport>{KvTransport::kNccl, KvTransport::kTcp}));
  kv::CpuKvStorage storage(kv::KvShape{2, 1, 4, 4}, 4);
  auto target = (*loader)->StartLoad("r2", 1, 0, 5, &storage, {3, 1},
                                     [](absl::Status, core::RemotePrefillResult) {});
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_THAT(target->kv_transports, ElementsAre("nccl", "tcp"));
  (*loader)->CancelLoad("r2");
  nccl->bytes = 4096;
  EXPECT_EQ((*loader)->bytes_received_total(KvTransport::kNccl), 4096u);
  EXPECT_EQ((*loader)->bytes_received_total(KvTransport::kTcp), 0u);
  EXPECT_EQ((*loader)->bytes_received_total(KvTransport::kCudaIpc), 0u);  // not offered
}

}  // namespace
}  // namespace tandem::decode
