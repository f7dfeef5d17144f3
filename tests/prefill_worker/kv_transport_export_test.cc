// The prefill worker's transport choice (issue #16): SenderKvExport picks
// from D's offer with kvtransfer::ChooseTransport over the worker's
// KvDataPlanes, fails Open with FAILED_PRECONDITION naming both lists when
// there is no common transport, and on a device transport drives the
// transport's KvDataSender (a recording fake, fake_data_plane.h; the KV connection is
// the real KvSendQueue). No engine, no model.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/tcp.h"
#include "prefill_worker/kv_export.h"
#include "prefill_worker/prefill_call.h"
#include "tests/decode_worker/fake_data_plane.h"

namespace tandem::prefill {
namespace {

using kvtransfer::KvTransport;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A port nothing listens on: the queue's connect fails later, never Open.
// (A refused connect can end the transfer before the test's first send:
// tests that send use a SilentListener.)
constexpr char kEndpoint[] = "127.0.0.1:9";

// A listening socket that never accepts: the queue's connection waits in
// the backlog for an ACCEPT that never comes, so sends are queued. Reset()
// closes it, which resets the pending connection (UNAVAILABLE).
class SilentListener {
 public:
  SilentListener() {
    absl::StatusOr<kvtransfer::tcp::ScopedFd> fd = kvtransfer::tcp::Listen("127.0.0.1", 0, &port_);
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (fd.ok()) fd_ = *std::move(fd);
  }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }
  void Reset() { fd_.Reset(); }

 private:
  int port_ = 0;
  kvtransfer::tcp::ScopedFd fd_;
};

kvtransfer::KvLayout Layout() { return worker_testing::SmallLayout(); }

using worker_testing::FakeSender;
using worker_testing::NoDeviceKv;

// KvSendOptions with a started queue and, unless `transports` is empty,
// planes of `transports` whose non-tcp entries are the given fakes.
KvSendOptions Options(std::vector<KvTransport> transports,
                      std::vector<kvtransfer::KvDataSender*> senders = {},
                      std::string host_id = "host-p") {
  KvSendOptions o;
  o.layout = Layout();
  o.bit_exact_class = "test";
  o.transfer_timeout_ms = 5000;
  o.host_id = std::move(host_id);
  if (!transports.empty()) {
    auto planes = std::make_shared<KvDataPlanes>();
    planes->transports = std::move(transports);
    planes->senders = std::move(senders);
    o.planes = std::move(planes);
  }
  EXPECT_TRUE(StartKvSendQueue(&o).ok());
  return o;
}

kvtransfer::TransportOffer Offer(std::vector<KvTransport> transports,
                                 std::string host_id = "host-d") {
  return {std::move(transports), std::move(host_id), "instance-d"};
}

TEST(KvTransportExportTest, TcpOnBothSidesSendsFramesCountedUnderTcp) {
  KvSendOptions o = Options({});
  EXPECT_EQ(o.transports(), std::vector<KvTransport>{KvTransport::kTcp});
  EXPECT_EQ(o.host_id, "host-p");
  // An empty offer is a D from before the offer: tcp.
  SilentListener d;
  SenderKvExport e(o, d.endpoint(), "r1", 1, 0, {});
  ASSERT_TRUE(e.Open(nullptr, [] {}).ok());
  EXPECT_EQ(e.transport(), KvTransport::kTcp);
  EXPECT_FALSE(e.sends_device_rows());
  const std::vector<char> rows(3 * 16);
  ASSERT_TRUE(e.SendLayer(1, 0, 3, rows.data(), rows.data()).ok());
  EXPECT_EQ(e.bytes_sent(), 96u);
  NoDeviceKv kv;
  const std::vector<int32_t> table = {0};
  EXPECT_EQ(e.SendDeviceRows(kv, table, 0, 0, 1).code(), absl::StatusCode::kFailedPrecondition);
  // Counted per transport when the export ends (as the engine's total).
  EXPECT_EQ(o.bytes_by_transport->Get(KvTransport::kTcp), 0u);
  e.Close();
  e.Close();  // once
  EXPECT_EQ(o.bytes_by_transport->Get(KvTransport::kTcp), 96u);
  EXPECT_EQ(o.bytes_by_transport->Get(KvTransport::kNccl), 0u);
}

TEST(KvTransportExportTest, NoCommonTransportFailsOpenNamingBoth) {
  FakeSender nccl(KvTransport::kNccl);
  KvSendOptions o = Options({KvTransport::kNccl}, {&nccl});
  SenderKvExport e(o, kEndpoint, "r2", 1, 0, Offer({KvTransport::kTcp}));
  const absl::Status open = e.Open(nullptr, [] {});
  EXPECT_EQ(open.code(), absl::StatusCode::kFailedPrecondition) << open;
  EXPECT_THAT(std::string(open.message()), StartsWith("KV transport for 127.0.0.1:9: "));
  EXPECT_THAT(std::string(open.message()),
              HasSubstr("this prefill worker supports nccl, the decode worker offers tcp"));
  EXPECT_TRUE(nccl.opened.empty());  // nothing prepared, nothing queued
  EXPECT_EQ(o.queue->queued_bytes(kEndpoint), 0u);
}

TEST(KvTransportExportTest, CudaIpcOnlyBetweenWorkersOfOneHost) {
  FakeSender ipc(KvTransport::kCudaIpc);
  // Another host: cuda_ipc is skipped and tcp, common to both, taken.
  KvSendOptions both = Options({KvTransport::kCudaIpc, KvTransport::kTcp}, {&ipc});
  SenderKvExport e(both, kEndpoint, "r3", 1, 0,
                   Offer({KvTransport::kCudaIpc, KvTransport::kTcp}, "host-d"));
  ASSERT_TRUE(e.Open(nullptr, [] {}).ok());
  EXPECT_EQ(e.transport(), KvTransport::kTcp);
  EXPECT_FALSE(e.sends_device_rows());
  EXPECT_TRUE(ipc.opened.empty());
  // Only cuda_ipc on this side: no transport to another host.
  KvSendOptions only = Options({KvTransport::kCudaIpc}, {&ipc});
  SenderKvExport f(only, kEndpoint, "r4", 1, 0, Offer({KvTransport::kCudaIpc}, "host-d"));
  const absl::Status open = f.Open(nullptr, [] {});
  EXPECT_EQ(open.code(), absl::StatusCode::kFailedPrecondition) << open;
  EXPECT_THAT(std::string(open.message()),
              HasSubstr("this prefill worker supports cuda_ipc, the decode worker offers "
                        "cuda_ipc"));
}

TEST(KvTransportExportTest, OfferNamesThisBuildDoesNotKnowAreSkipped) {
  KvSendOptions o = Options({});
  core::KvTarget request;
  request.kv_transports = {"rdma", "tcp"};
  request.kv_host_id = "h";
  request.kv_instance_id = "i";
  absl::StatusOr<kvtransfer::TransportOffer> offer =
      TransportOfferFromTarget(request, o.transports());
  ASSERT_TRUE(offer.ok()) << offer.status();
  EXPECT_EQ(offer->transports, std::vector<KvTransport>{KvTransport::kTcp});
  EXPECT_EQ(offer->host_id, "h");
  EXPECT_EQ(offer->instance_id, "i");
  request.kv_transports = {"rdma"};
  offer = TransportOfferFromTarget(request, o.transports());
  EXPECT_EQ(offer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(offer.status().message(),
            "no common KV transport: this prefill worker supports tcp, the decode worker "
            "offers rdma");
  request.kv_transports.clear();  // no offer: tcp
  offer = TransportOfferFromTarget(request, o.transports());
  ASSERT_TRUE(offer.ok());
  EXPECT_TRUE(offer->transports.empty());
}

TEST(KvTransportExportTest, DeviceTransportAnnouncesDescriptorsAndWaitsForTheDataPath) {
  FakeSender nccl(KvTransport::kNccl);
  KvSendOptions o = Options({KvTransport::kNccl, KvTransport::kTcp}, {&nccl});
  SilentListener d;
  SenderKvExport e(o, d.endpoint(), "r5", 2, 0,
                   Offer({KvTransport::kCudaIpc, KvTransport::kNccl, KvTransport::kTcp}));
  const absl::Status open = e.Open(nullptr, [] {});
  ASSERT_TRUE(open.ok()) << open;
  EXPECT_EQ(e.transport(), KvTransport::kNccl);
  EXPECT_TRUE(e.sends_device_rows());
  ASSERT_EQ(nccl.opened.size(), 1u);
  EXPECT_EQ(nccl.opened[0], (kvtransfer::TransferKey{"r5", 2}));
  ASSERT_EQ(nccl.peers.size(), 1u);
  EXPECT_EQ(nccl.peers[0].kv_endpoint, d.endpoint());
  EXPECT_EQ(nccl.peers[0].host_id, "host-d");
  EXPECT_EQ(nccl.peers[0].instance_id, "instance-d");

  NoDeviceKv kv;
  const std::vector<int32_t> table = {4, 2};
  ASSERT_TRUE(e.SendDeviceRows(kv, table, 0, 0, 5).ok());
  ASSERT_TRUE(e.SendDeviceRows(kv, table, 1, 0, 5).ok());
  EXPECT_EQ(nccl.tables, (std::vector<std::vector<int32_t>>{{4, 2}, {4, 2}}));
  EXPECT_EQ(e.bytes_sent(), 2u * 160u);
  const std::vector<char> rows(16);
  EXPECT_EQ(e.SendLayer(0, 0, 1, rows.data(), rows.data()).code(),
            absl::StatusCode::kFailedPrecondition);

  // D goes away: the KV connection fails (UNAVAILABLE). While the data
  // path still reads the blocks (Poll nullopt) there is no result.
  d.Reset();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (nccl.polled_with.empty() && absl::Now() < deadline) {
    EXPECT_EQ(e.Result(), std::nullopt);
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_FALSE(nccl.polled_with.empty()) << "the KV connection never ended";
  EXPECT_EQ(nccl.polled_with.back().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(e.Result(), std::nullopt);
  // The data path is done: the control's error is the result, and stays.
  nccl.poll_answer = absl::OkStatus();
  std::optional<absl::Status> result = e.Result();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->code(), absl::StatusCode::kUnavailable) << *result;
  nccl.poll_answer = absl::DataLossError("changed its mind");
  EXPECT_EQ(e.Result(), result);
  e.Close();
  EXPECT_EQ(nccl.closed, (std::vector<kvtransfer::TransferKey>{{"r5", 2}}));
  EXPECT_EQ(o.bytes_by_transport->Get(KvTransport::kNccl), 320u);
  EXPECT_EQ(o.bytes_by_transport->Get(KvTransport::kTcp), 0u);
  e.Close();  // once only
  EXPECT_EQ(nccl.closed.size(), 1u);
}

// The data path's own error wins over the KV connection's.
TEST(KvTransportExportTest, DataPathErrorIsTheResult) {
  FakeSender nccl(KvTransport::kNccl);
  KvSendOptions o = Options({KvTransport::kNccl}, {&nccl});
  SenderKvExport e(o, kEndpoint, "r6", 1, 0, Offer({KvTransport::kNccl}));
  const absl::Status open = e.Open(nullptr, [] {});
  ASSERT_TRUE(open.ok()) << open;
  nccl.poll_answer = absl::UnavailableError("communicator aborted");
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::optional<absl::Status> result;
  while (!(result = e.Result()).has_value() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->message(), "communicator aborted");
}

}  // namespace
}  // namespace tandem::prefill
