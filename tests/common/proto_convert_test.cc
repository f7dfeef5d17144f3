// The KV target's one converter pair (common/server/proto_convert.h,
// issue #33) and the transport offer it carries
// (worker/kv_data_planes.h): every field survives core -> proto ->
// core, and D's target reaches P as D sent it.
#include "common/server/proto_convert.h"

#include <string>
#include <vector>

#include "worker/kv_data_planes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;

// Every field set, none to its default.
core::KvTarget FullTarget() {
  core::KvTarget t;
  t.endpoint = "10.0.0.7:7001";
  t.request_id = "r-17.1";
  t.attempt = 3;
  t.hit_tokens = 48;
  t.kv_transports = {"cuda_ipc", "nccl", "tcp"};
  t.kv_host_id = "boot-1234";
  t.kv_instance_id = "0123456789abcdef0123456789abcdef";
  return t;
}

TEST(KvTargetConvertTest, RoundTripsEveryField) {
  const core::KvTarget target = FullTarget();
  v1::KvTarget proto;
  KvTargetToProto(target, &proto);
  EXPECT_EQ(proto.endpoint(), "10.0.0.7:7001");
  EXPECT_EQ(proto.request_id(), "r-17.1");
  EXPECT_EQ(proto.attempt(), 3u);
  EXPECT_EQ(proto.hit_tokens(), 48u);
  EXPECT_THAT(proto.kv_transports(), ElementsAre("cuda_ipc", "nccl", "tcp"));
  EXPECT_EQ(proto.kv_host_id(), "boot-1234");
  EXPECT_EQ(proto.kv_instance_id(), "0123456789abcdef0123456789abcdef");
  // Every field of the message is one the converter sets: a field added to
  // tandem.v1.KvTarget without a converter line fails here.
  EXPECT_EQ(v1::KvTarget::descriptor()->field_count(), 7);
  EXPECT_EQ(KvTargetFromProto(proto), target);

  // And back from a message with every field set.
  v1::KvTarget again;
  KvTargetToProto(KvTargetFromProto(proto), &again);
  EXPECT_EQ(again.SerializeAsString(), proto.SerializeAsString());
}

TEST(KvTargetConvertTest, DefaultsRoundTrip) {
  const core::KvTarget empty;
  v1::KvTarget proto;
  KvTargetToProto(empty, &proto);
  EXPECT_EQ(KvTargetFromProto(proto), empty);
}

// D's target, sent in NeedRemotePrefill and forwarded as the router does
// (the message copied untouched into PrefillRequest.kv_target), is what P
// reads: endpoint, request id, attempt, hit and the transport offer.
TEST(KvTargetConvertTest, TheDecodeWorkersTargetReachesThePrefillWorkerUnchanged) {
  v1::DecodeGenerateResponse from_d;
  KvTargetToProto(FullTarget(), from_d.mutable_need_remote_prefill()->mutable_kv_target());
  v1::PrefillRequest to_p;
  *to_p.mutable_kv_target() = from_d.need_remote_prefill().kv_target();
  v1::PrefillRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(to_p.SerializeAsString()));
  EXPECT_EQ(KvTargetFromProto(parsed.kv_target()), FullTarget());
}

// The transport offer inside the target: names in order, host and instance
// id; back on P unknown names are skipped, only unknown ones refused.
TEST(KvTargetConvertTest, TransportOfferRoundTrips) {
  using kvtransfer::KvTransport;
  const kvtransfer::TransportOffer offer{
      {KvTransport::kCudaIpc, KvTransport::kNccl, KvTransport::kTcp}, "boot-1234", "inst-1"};
  core::KvTarget target = FullTarget();
  target.kv_transports = {"stale"};
  SetTransportOffer(offer, &target);
  EXPECT_THAT(target.kv_transports, ElementsAre("cuda_ipc", "nccl", "tcp"));
  EXPECT_EQ(target.kv_host_id, "boot-1234");
  EXPECT_EQ(target.kv_instance_id, "inst-1");
  absl::StatusOr<kvtransfer::TransportOffer> back =
      TransportOfferFromTarget(target, {KvTransport::kTcp});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->transports, offer.transports);
  EXPECT_EQ(back->host_id, offer.host_id);
  EXPECT_EQ(back->instance_id, offer.instance_id);

  // A D that offers nothing (tcp): an empty offer, no error.
  core::KvTarget none;
  none.endpoint = "10.0.0.8:7001";
  back = TransportOfferFromTarget(none, {KvTransport::kTcp});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->transports.empty());
  EXPECT_EQ(back->host_id, "");
  EXPECT_EQ(back->instance_id, "");
}

}  // namespace
}  // namespace tandem
