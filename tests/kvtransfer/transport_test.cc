// Transport names, settings, the offer/choice rule (transport.h) and the
// v3 wire messages (HELLO's transport fields, FRAME_DESC, ACK; wire.h).
#include "kvtransfer/transport.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/hello_auth.h"
#include "kvtransfer/wire.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

using testing::TestLayout;
using T = KvTransport;

constexpr T kTcp = T::kTcp;
constexpr T kNccl = T::kNccl;
constexpr T kIpc = T::kCudaIpc;

TEST(KvTransportNegotiationTest, NamesRoundTrip) {
  EXPECT_EQ(KvTransportName(kTcp), "tcp");
  EXPECT_EQ(KvTransportName(kNccl), "nccl");
  EXPECT_EQ(KvTransportName(kIpc), "cuda_ipc");
  for (T t : {kTcp, kNccl, kIpc}) {
    absl::StatusOr<T> back = ParseKvTransport(KvTransportName(t));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, t);
  }
  for (const char* bad : {"", "TCP", "auto", "cuda-ipc", "rdma"}) {
    absl::StatusOr<T> t = ParseKvTransport(bad);
    EXPECT_EQ(t.status(), absl::InvalidArgumentError(absl::StrCat(
                              "unknown KV transport '", bad,
                              "' (expected tcp, nccl or cuda_ipc)")));
  }
  EXPECT_EQ(KvTransportListName({}), "");
  EXPECT_EQ(KvTransportListName({kIpc, kNccl, kTcp}), "cuda_ipc,nccl,tcp");
}

TEST(KvTransportNegotiationTest, ParsesSetting) {
  absl::StatusOr<KvTransportSetting> a = ParseKvTransportSetting("auto");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->automatic);
  for (T t : {kTcp, kNccl, kIpc}) {
    absl::StatusOr<KvTransportSetting> s = ParseKvTransportSetting(KvTransportName(t));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_FALSE(s->automatic);
    EXPECT_EQ(s->fixed, t);
  }
  EXPECT_EQ(ParseKvTransportSetting("gloo").status(),
            absl::InvalidArgumentError("kv.transport: unknown value 'gloo' (expected auto, "
                                       "tcp, nccl or cuda_ipc)"));
}

TEST(KvTransportNegotiationTest, SupportedTransportsInPreferenceOrder) {
  const KvTransportSetting automatic;
  const TransportCapabilities cpu;
  const TransportCapabilities gpu{true, true, true};
  const TransportCapabilities gpu_no_nccl{true, false, true};
  auto supported = [](const KvTransportSetting& s, const TransportCapabilities& c) {
    absl::StatusOr<std::vector<T>> out = SupportedTransports(s, c, "test");
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : std::vector<T>{};
  };
  EXPECT_EQ(supported(automatic, cpu), (std::vector<T>{kTcp}));
  EXPECT_EQ(supported(automatic, gpu), (std::vector<T>{kIpc, kNccl, kTcp}));
  EXPECT_EQ(supported(automatic, gpu_no_nccl), (std::vector<T>{kIpc, kTcp}));
  EXPECT_EQ(supported({false, kTcp}, cpu), (std::vector<T>{kTcp}));
  EXPECT_EQ(supported({false, kNccl}, gpu), (std::vector<T>{kNccl}));
  EXPECT_EQ(supported({false, kIpc}, gpu), (std::vector<T>{kIpc}));
  EXPECT_EQ(SupportedTransports({false, kNccl}, cpu, "cpu").status(),
            absl::FailedPreconditionError(
                "kv.transport nccl needs a CUDA worker built with NCCL (this worker: cpu)"));
  absl::Status ipc = SupportedTransports({false, kIpc}, cpu, "cpu").status();
  EXPECT_EQ(ipc.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ipc.message().find("kv.transport cuda_ipc"), std::string::npos) << ipc;
  EXPECT_NE(ipc.message().find("(this worker: cpu)"), std::string::npos) << ipc;
}

TEST(KvTransportNegotiationTest, ChoosesFirstLocalTransportTheOfferHas) {
  const std::vector<T> gpu = {kIpc, kNccl, kTcp};
  const TransportOffer same_host{{kIpc, kNccl, kTcp}, "host-a", "d1"};
  const TransportOffer other_host{{kIpc, kNccl, kTcp}, "host-b", "d1"};
  auto choose = [](const std::vector<T>& local, const TransportOffer& o, const char* host) {
    absl::StatusOr<T> t = ChooseTransport(local, o, host);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : T::kTcp;
  };
  EXPECT_EQ(choose(gpu, same_host, "host-a"), kIpc);
  // cuda_ipc only on one host: another host, or an unknown host id.
  EXPECT_EQ(choose(gpu, other_host, "host-a"), kNccl);
  EXPECT_EQ(choose(gpu, same_host, ""), kNccl);
  EXPECT_EQ(choose(gpu, TransportOffer{{kIpc, kNccl, kTcp}, "", "d1"}, ""), kNccl);
  // P's order decides, not D's.
  EXPECT_EQ(choose({kNccl, kIpc, kTcp}, same_host, "host-a"), kNccl);
  EXPECT_EQ(choose(gpu, TransportOffer{{kTcp}, "host-a", "d1"}, "host-a"), kTcp);
  // An empty offer (a D from before issue #16) is {tcp}.
  EXPECT_EQ(choose(gpu, TransportOffer{}, "host-a"), kTcp);
}

TEST(KvTransportNegotiationTest, NoCommonTransportNamesBothLists) {
  EXPECT_EQ(ChooseTransport({kNccl}, TransportOffer{{kTcp}, "h", "d"}, "h").status(),
            absl::FailedPreconditionError("no common KV transport: this prefill worker "
                                          "supports nccl, the decode worker offers tcp"));
  EXPECT_EQ(ChooseTransport({kNccl}, TransportOffer{}, "h").status(),
            absl::FailedPreconditionError("no common KV transport: this prefill worker "
                                          "supports nccl, the decode worker offers tcp"));
  absl::Status s =
      ChooseTransport({kIpc}, TransportOffer{{kIpc, kTcp}, "host-b", "d"}, "host-a").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message().substr(0, 88),
            "no common KV transport: this prefill worker supports cuda_ipc, the decode "
            "worker offers ");
  EXPECT_NE(s.message().find("cuda_ipc,tcp"), std::string::npos) << s;
  EXPECT_NE(s.message().find("another host"), std::string::npos) << s;
}

TEST(KvTransportNegotiationTest, CheckTransportAccepted) {
  EXPECT_TRUE(CheckTransportAccepted(kTcp, {kNccl, kTcp}).ok());
  EXPECT_TRUE(CheckTransportAccepted(kNccl, {kNccl, kTcp}).ok());
  EXPECT_EQ(CheckTransportAccepted(kNccl, {kTcp}),
            absl::FailedPreconditionError("KV transport mismatch: the prefill worker chose "
                                          "nccl, this decode worker offers tcp"));
  EXPECT_EQ(CheckTransportAccepted(kIpc, {kNccl, kTcp}),
            absl::FailedPreconditionError("KV transport mismatch: the prefill worker chose "
                                          "cuda_ipc, this decode worker offers nccl,tcp"));
}

TEST(KvTransportNegotiationTest, HostAndInstanceIds) {
  const std::string host = LocalHostId();
  EXPECT_FALSE(host.empty());
  EXPECT_EQ(LocalHostId(), host);  // stable within a boot
  const std::string a = NewInstanceId();
  const std::string b = NewInstanceId();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

// ---- wire v3 --------------------------------------------------------------

std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string Str(const std::string& s) { return U32(static_cast<uint32_t>(s.size())) + s; }
std::string Payload(const std::string& msg) { return msg.substr(wire::kHeaderBytes); }

TEST(KvTransportWireTest, FrameDescByteLayoutAndRoundTrip) {
  FrameDescriptor f{"r1", 2, 3, 40, 16, 0x0102030405060708ull, std::string("\x01\0\0\0", 4)};
  const std::string msg = wire::EncodeFrameDesc(f);
  // "r1" 6 + 4 x 4 + comm_seq 8 + locator 8 = 38.
  EXPECT_EQ(msg, U32(6) + U32(38) + Str("r1") + U32(2) + U32(3) + U32(40) + U32(16) +
                     U64(0x0102030405060708ull) + Str(f.locator));
  absl::StatusOr<FrameDescriptor> back = wire::DecodeFrameDesc(Payload(msg));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->request_id, "r1");
  EXPECT_EQ(back->attempt, 2u);
  EXPECT_EQ(back->layer, 3u);
  EXPECT_EQ(back->token_start, 40u);
  EXPECT_EQ(back->token_count, 16u);
  EXPECT_EQ(back->comm_seq, 0x0102030405060708ull);
  EXPECT_EQ(back->locator, f.locator);
  EXPECT_EQ(wire::MessageTypeName(6), "FRAME_DESC");
  EXPECT_EQ(wire::MessageTypeName(7), "ACK");
  EXPECT_EQ(wire::MessageTypeName(9), "type 9");
}

TEST(KvTransportWireTest, MalformedFrameDescIsDataLossNamingField) {
  const std::string p = Payload(wire::EncodeFrameDesc({"req", 1, 0, 0, 4, 9, "loc"}));
  const std::vector<std::pair<size_t, const char*>> cuts = {
      {0, "request_id"}, {7, "attempt"}, {11, "layer"}, {15, "token_start"},
      {19, "token_count"}, {23, "comm_seq"}, {31, "locator"}, {35, "locator"}};
  for (const auto& [n, field] : cuts) {
    absl::Status s = wire::DecodeFrameDesc(p.substr(0, n)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << n;
    EXPECT_NE(s.message().find(absl::StrCat("malformed KV FRAME_DESC message: field '", field,
                                            "'")),
              std::string::npos)
        << n << ": " << s;
  }
  EXPECT_EQ(wire::DecodeFrameDesc(p + "x").status(),
            absl::DataLossError("malformed KV FRAME_DESC message: field 'end' 1 trailing bytes"));
  // A locator over 64 KiB, whatever follows.
  const std::string big = Str("req") + U32(1) + U32(0) + U32(0) + U32(4) + U64(9) +
                          U32(wire::kMaxLocatorBytes + 1);
  EXPECT_EQ(wire::DecodeFrameDesc(big).status(),
            absl::DataLossError("malformed KV FRAME_DESC message: field 'locator' string "
                                "length 65537 exceeds the limit of 65536"));
}

TEST(KvTransportWireTest, AckIsEmpty) {
  EXPECT_EQ(wire::EncodeAck(), U32(7) + U32(0));
  EXPECT_TRUE(wire::DecodeAck("").ok());
  EXPECT_EQ(wire::DecodeAck("x"),
            absl::DataLossError("malformed KV ACK message: field 'end' 1 trailing bytes"));
}

TEST(KvTransportWireTest, HelloCarriesTransportAndSetup) {
  wire::Hello h;
  h.request_id = "req";
  h.attempt = 2;
  h.layout = TestLayout(2, 2, 4);
  h.bit_exact_class = "cls";
  h.transport = "nccl";
  h.transport_setup = std::string("\0\x01setup", 7);
  const std::string p = Payload(wire::EncodeHello(h));
  // The transport fields are the last ones without a credential.
  EXPECT_EQ(p.substr(p.size() - 19), Str("nccl") + Str(h.transport_setup));
  absl::StatusOr<wire::Hello> back = wire::DecodeHello(p);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->transport, "nccl");
  EXPECT_EQ(back->transport_setup, h.transport_setup);
  EXPECT_FALSE(back->auth.has_value());
  // Cut inside them: DATA_LOSS naming the field.
  for (const auto& [cut, field] : std::vector<std::pair<size_t, const char*>>{
           {19, "transport"}, {12, "transport"}, {5, "transport_setup"}}) {
    absl::Status s = wire::DecodeHello(p.substr(0, p.size() - cut)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << cut;
    EXPECT_NE(s.message().find(absl::StrCat("field '", field, "'")), std::string::npos)
        << cut << ": " << s;
  }
  // A setup over 16 KiB.
  h.transport_setup.assign(wire::kMaxTransportSetupBytes + 1, 's');
  EXPECT_EQ(wire::DecodeHello(Payload(wire::EncodeHello(h))).status(),
            absl::DataLossError("malformed KV HELLO message: field 'transport_setup' string "
                                "length 16385 exceeds the limit of 16384"));
}

TEST(KvTransportWireTest, CredentialSignsTransportFields) {
  auth::ClusterAuth::Options o;
  o.secret = std::string(40, 'k');
  auto auth = std::make_unique<auth::ClusterAuth>(std::move(o));
  wire::Hello h{kKvProtocolVersion, "req", 1, TestLayout(2, 2, 4), "cls", {}, "nccl", "s1"};
  SignHello(&*auth, &h);
  ASSERT_TRUE(h.auth.has_value());
  absl::StatusOr<wire::Hello> back = wire::DecodeHello(Payload(wire::EncodeHello(h)));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->auth.has_value());
  EXPECT_EQ(back->transport_setup, "s1");
  EXPECT_TRUE(VerifyHello(&*auth, *back).ok());
  for (auto change : {+[](wire::Hello& x) { x.transport = "tcp"; },
                      +[](wire::Hello& x) { x.transport_setup = "s2"; }}) {
    wire::Hello tampered = *back;
    change(tampered);
    EXPECT_EQ(VerifyHello(&*auth, tampered).code(), absl::StatusCode::kUnauthenticated);
  }
}

}  // namespace
}  // namespace tandem::kvtransfer
