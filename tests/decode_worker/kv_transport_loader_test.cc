// The decode worker's transport offer (issue #16): every load's
// core::KvTarget carries the receiver's transports, this host's id and
// the process's instance id (-> NeedRemotePrefill.kv_target, which the
// router forwards to P);
// the per-transport byte counters read the right source; and one device
// transfer end to end through both workers' wiring (P's SenderKvExport, D's
// ReceiverKvLoader) over the real KV connection, with recording fakes as
// the data path (fake_data_plane.h). Real sockets on 127.0.0.1.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "decode_worker/remote_kv_loader.h"
#include "engine/kv/cpu_kv_storage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prefill_worker/prefill_call.h"
#include "tests/decode_worker/fake_data_plane.h"

namespace tandem::decode {
namespace {

using kvtransfer::KvTransport;
using ::testing::ElementsAre;

kvtransfer::KvLayout Layout() { return worker_testing::SmallLayout(); }

kvtransfer::KvReceiver::Options ReceiverOptions() {
  kvtransfer::KvReceiver::Options o;
  o.handshake_timeout_ms = 2000;
  o.transfer_timeout_ms = 2000;
  return o;
}

using worker_testing::FakeDataReceiver;
using worker_testing::FakeSender;

bool IsHex32(const std::string& s) {
  return s.size() == 32 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// A prefill worker of another bit-exact class is noted once per class;
// the same class, an empty one (a peer that sent none) and repeats are not.
TEST(PeerClassNotesTest, NotesEachDifferingPeerClassOnce) {
  PeerClassNotes notes("tandem-cpu/int8/int8/f16/v4");
  EXPECT_EQ(notes.Note("tandem-cpu/int8/int8/f16/v4"), std::nullopt);
  EXPECT_EQ(notes.Note(""), std::nullopt);
  EXPECT_EQ(notes.Note("tandem-cpu/avx512/exact/f16/v4"),
            "KV from a prefill worker of bit-exact class tandem-cpu/avx512/exact/f16/v4, but "
            "this decode worker's is tandem-cpu/int8/int8/f16/v4: a request prefilled there may "
            "differ in its last bits from one prefilled here (check engine.q8_matmul, "
            "engine.kernel_isa and engine.kv_cache_dtype on both; logged once per class)");
  EXPECT_EQ(notes.Note("tandem-cpu/avx512/exact/f16/v4"), std::nullopt);
  EXPECT_NE(notes.Note("tandem-cpu/avx2/exact/f16/v4"), std::nullopt);
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
  EXPECT_EQ(target->endpoint, (*loader)->endpoint());
  EXPECT_EQ(target->hit_tokens, 2u);
  EXPECT_EQ(target->request_id, "r1");
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
  for (KvTransport t : {KvTransport::kTcp, KvTransport::kNccl, KvTransport::kCudaIpc}) {
    EXPECT_EQ((*loader)->bytes_received_total(t), 0u);  // nothing received yet
  }
}

// A KV storage "on a device": host memory, plus DeviceKvAccess so that the
// loader's writer offers a device target.
class DeviceStorage : public kv::KvStorage, public worker_testing::NoDeviceKv {
 public:
  const kv::KvShape& shape() const override { return shape_; }
  kv::KvDtype dtype() const override { return kv::KvDtype::kF32; }
  int32_t num_blocks() const override { return 4; }
  void ReadTokens(std::span<const int32_t>, int32_t, int32_t, int32_t, char*,
                  char*) const override {}
  void WriteTokens(std::span<const int32_t>, int32_t, int32_t, int32_t, const char*,
                   const char*) override {}

 private:
  const kv::KvShape shape_{2, 1, 4, 4};
};

// D offers nccl; P (nccl, tcp) takes it: P's HELLO carries its sender's
// setup, D's data receiver gets it with the load's device target, every
// descriptor in order, and both ends succeed once D's ACK came and P's data
// path is done.
TEST(KvTransportWiringTest, ADeviceTransferRunsThroughBothWorkersWiring) {
  auto d_nccl = std::make_shared<FakeDataReceiver>(KvTransport::kNccl);
  auto planes = std::make_shared<KvDataPlanes>();
  planes->transports = {KvTransport::kNccl, KvTransport::kTcp};
  planes->receivers = {d_nccl.get()};
  planes->owners = {d_nccl};
  auto loader = ReceiverKvLoader::Start(ReceiverOptions(), Layout(), planes);
  ASSERT_TRUE(loader.ok()) << loader.status();
  DeviceStorage storage;
  absl::Mutex mu;
  std::optional<absl::Status> loaded;
  core::RemotePrefillResult loaded_result;
  auto target = (*loader)->StartLoad(
      "w1", 1, 0, 5, &storage, {2, 0},
      [&](absl::Status status, core::RemotePrefillResult result) {
        absl::MutexLock lock(&mu);
        loaded = status;
        loaded_result = std::move(result);
      });
  ASSERT_TRUE(target.ok()) << target.status();

  FakeSender p_nccl(KvTransport::kNccl);
  p_nccl.poll_answer = absl::OkStatus();
  prefill::KvSendOptions send;
  send.layout = Layout();
  send.bit_exact_class = "test";
  auto p_planes = std::make_shared<KvDataPlanes>();
  p_planes->transports = {KvTransport::kNccl, KvTransport::kTcp};
  p_planes->senders = {&p_nccl};
  send.planes = p_planes;
  ASSERT_TRUE(prefill::StartKvSendQueue(&send).ok());
  absl::StatusOr<kvtransfer::TransportOffer> offer =
      TransportOfferFromTarget(*target, send.transports());
  ASSERT_TRUE(offer.ok()) << offer.status();
  prefill::SenderKvExport e(send, target->endpoint, "w1", 1, 0, *offer);
  const absl::Status open = e.Open(nullptr, [] {});
  ASSERT_TRUE(open.ok()) << open;
  EXPECT_EQ(e.transport(), KvTransport::kNccl);
  ASSERT_EQ(p_nccl.peers.size(), 1u);
  EXPECT_EQ(p_nccl.peers[0].instance_id, (*loader)->offer().instance_id);
  worker_testing::NoDeviceKv p_kv;
  const std::vector<int32_t> p_table = {1};
  for (int32_t layer = 0; layer < 2; ++layer) {
    ASSERT_TRUE(e.SendDeviceRows(p_kv, p_table, layer, 0, 5).ok());
  }
  core::SampleStart first;
  first.token.token_id = 7;
  ASSERT_TRUE(e.Finish({first}).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::optional<absl::Status> result;
  while (!(result = e.Result()).has_value() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(result.has_value()) << "no result within 10 s";
  EXPECT_TRUE(result->ok()) << *result;
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithDeadline(absl::Condition(
                                         +[](std::optional<absl::Status>* l) {
                                           return l->has_value();
                                         },
                                         &loaded),
                                     deadline));
    EXPECT_TRUE(loaded->ok()) << *loaded;
    ASSERT_EQ(loaded_result.samples.size(), 1u);
    EXPECT_EQ(loaded_result.samples[0].token.token_id, 7);
  }
  EXPECT_EQ((*loader)->bytes_received_total(KvTransport::kNccl), 2u * 2 * 5 * 16);
  EXPECT_EQ((*loader)->bytes_received_total(KvTransport::kTcp), 0u);
  EXPECT_EQ((*loader)->transfers_completed_total(), 1u);
  absl::MutexLock lock(&d_nccl->mu);
  ASSERT_EQ(d_nccl->setups.size(), 1u);
  EXPECT_EQ(d_nccl->setups[0], "setup-bytes");
  ASSERT_EQ(d_nccl->targets.size(), 1u);
  EXPECT_EQ(d_nccl->targets[0].kv, static_cast<kv::DeviceKvAccess*>(&storage));
  EXPECT_EQ(d_nccl->targets[0].block_table, (std::vector<int32_t>{2, 0}));
  ASSERT_EQ(d_nccl->frames.size(), 2u);
  EXPECT_EQ(d_nccl->frames[0].layer, 0u);
  EXPECT_EQ(d_nccl->frames[1].layer, 1u);
  EXPECT_EQ(d_nccl->frames[1].comm_seq, 1u);
  e.Close();
  EXPECT_EQ(send.bytes_by_transport->Get(KvTransport::kNccl), 2u * 2 * 5 * 16);
}

}  // namespace
}  // namespace tandem::decode
