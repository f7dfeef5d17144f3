// Wire format: byte layouts written out by hand from the table in
// kvtransfer/wire.h, round trips, and DATA_LOSS on every truncation.
#include "kvtransfer/wire.h"

#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer::wire {
namespace {

using ::tandem::kvtransfer::testing::TestLayout;

// Little-endian bytes of a u32, spelled out for reference strings.
std::string U32(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

std::string Payload(const std::string& message) {
  return message.substr(kHeaderBytes);
}

TEST(KvWireTest, AcceptIsTypeTwoWithEmptyPayload) {
  EXPECT_EQ(EncodeAccept(), std::string("\x02\0\0\0\0\0\0\0", 8));
  EXPECT_TRUE(DecodeAccept("").ok());
  EXPECT_EQ(DecodeAccept("x").code(), absl::StatusCode::kDataLoss);
}

TEST(KvWireTest, FinalByteLayout) {
  TransferResult r;
  r.first_token = -2;          // ff ff ff fe
  r.first_logprob = -0.5f;     // 0xbf000000
  r.finish_reason = 3;
  r.frames = 0x0102030405060708ull;
  r.kv_bytes = 400640;         // 0x61d00
  const std::string want =
      U32(5) + U32(28) + std::string("\xfe\xff\xff\xff", 4) +
      std::string("\x00\x00\x00\xbf", 4) + U32(3) +
      std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8) +
      std::string("\x00\x1d\x06\x00\x00\x00\x00\x00", 8);
  EXPECT_EQ(EncodeFinal(r), want);
  absl::StatusOr<TransferResult> back = DecodeFinal(Payload(want));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->first_token, -2);
  EXPECT_EQ(back->first_logprob, -0.5f);
  EXPECT_EQ(back->finish_reason, 3u);
  EXPECT_EQ(back->frames, 0x0102030405060708ull);
  EXPECT_EQ(back->kv_bytes, 400640u);
}

TEST(KvWireTest, FrameByteLayoutAndRoundTrip) {
  FrameHeader h{"ab", 7, 2, 300, 1};
  const float k[2] = {1.0f, -2.0f};  // 0x3f800000, 0xc0000000
  const float v[2] = {0.0f, 0.5f};   // 0, 0x3f000000
  absl::StatusOr<std::string> msg = EncodeFrame(h, k, v, 2);
  ASSERT_TRUE(msg.ok()) << msg.status();
  const std::string want =
      U32(4) + U32(6 + 16 + 16) + U32(2) + "ab" + U32(7) + U32(2) + U32(300) +
      U32(1) + std::string("\0\0\x80\x3f\0\0\0\xc0", 8) +
      std::string("\0\0\0\0\0\0\0\x3f", 8);
  EXPECT_EQ(*msg, want);
  const std::string payload = Payload(want);  // FrameView points into it
  absl::StatusOr<FrameView> f = DecodeFrame(payload);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->header.request_id, "ab");
  EXPECT_EQ(f->header.attempt, 7u);
  EXPECT_EQ(f->header.layer, 2u);
  EXPECT_EQ(f->header.token_start, 300u);
  EXPECT_EQ(f->header.token_count, 1u);
  EXPECT_EQ(f->kv, want.substr(8 + 22));
}

TEST(KvWireTest, HelloRoundTrip) {
  Hello h;
  h.request_id = "0123456789abcdef0123456789abcdef";
  h.attempt = 3;
  h.layout = TestLayout(5, 4, 8);
  h.layout.rope_freq_base = 500000.0f;
  h.layout.rope_type = "neox";
  const std::string msg = EncodeHello(h);
  uint32_t type = 0, len = 0;
  GetHeader(msg.data(), &type, &len);
  EXPECT_EQ(type, 1u);
  EXPECT_EQ(len, msg.size() - kHeaderBytes);
  absl::StatusOr<Hello> back = DecodeHello(Payload(msg));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->request_id, h.request_id);
  EXPECT_EQ(back->attempt, 3u);
  EXPECT_TRUE(CheckCompatible(h.layout, back->layout).ok());
  EXPECT_EQ(back->layout.rope_type, "neox");
  EXPECT_EQ(back->layout.rope_freq_base, 500000.0f);
}

TEST(KvWireTest, RejectRoundTripAndUnknownCode) {
  const std::string msg =
      EncodeReject(absl::FailedPreconditionError("head_dim differs"));
  EXPECT_EQ(msg.substr(0, 12), U32(3) + U32(4 + 4 + 16) + U32(9));
  absl::StatusOr<Reject> back = DecodeReject(Payload(msg));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToStatus(), absl::FailedPreconditionError("head_dim differs"));
  // Code 0 (OK) and codes above 16 must not turn into success or garbage.
  for (uint32_t code : {0u, 17u, 0xffffffffu}) {
    absl::StatusOr<Reject> odd = DecodeReject(U32(code) + U32(1) + "x");
    ASSERT_TRUE(odd.ok()) << odd.status();
    EXPECT_EQ(odd->code, absl::StatusCode::kUnknown) << code;
  }
}

// Every strict prefix of a valid payload is DATA_LOSS, never a crash or a
// read past the end; so is one trailing byte.
TEST(KvWireTest, TruncatedAndTrailingBytesAreDataLoss) {
  const std::string hello =
      Payload(EncodeHello({"req", 1, TestLayout(2, 2, 4)}));
  const std::string final_msg = Payload(EncodeFinal(TransferResult{}));
  const std::string reject = Payload(EncodeReject(absl::AbortedError("old")));
  for (size_t n = 0; n < hello.size(); ++n) {
    EXPECT_EQ(DecodeHello(hello.substr(0, n)).status().code(),
              absl::StatusCode::kDataLoss) << n;
  }
  for (size_t n = 0; n < final_msg.size(); ++n) {
    EXPECT_EQ(DecodeFinal(final_msg.substr(0, n)).status().code(),
              absl::StatusCode::kDataLoss) << n;
  }
  for (size_t n = 0; n < reject.size(); ++n) {
    EXPECT_EQ(DecodeReject(reject.substr(0, n)).status().code(),
              absl::StatusCode::kDataLoss) << n;
  }
  // FRAME: anything shorter than its fixed fields is DATA_LOSS.
  const std::string frame = U32(3) + "req" + U32(1) + U32(0) + U32(0) + U32(1);
  for (size_t n = 0; n < frame.size(); ++n) {
    EXPECT_EQ(DecodeFrame(frame.substr(0, n)).status().code(),
              absl::StatusCode::kDataLoss) << n;
  }
  EXPECT_EQ(DecodeHello(hello + "x").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeFinal(final_msg + "x").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(KvWireTest, HugeStringLengthIsDataLossNamingField) {
  absl::StatusOr<Hello> h = DecodeHello(U32(0xfffffff0u) + "abc");
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(h.status().message().find("request_id"), std::string::npos)
      << h.status();
}

TEST(KvLayoutTest, FrameBytesMatchesReferenceCount) {
  // 313 tokens x 2 (K, V) x 4 heads x 8 dims x 4 bytes = 80,128 per layer;
  // x 5 layers = 400,640.
  KvLayout l = TestLayout(5, 4, 8);
  EXPECT_EQ(l.kv_dim(), 32u);
  EXPECT_EQ(l.FrameBytes(313), 80128u);
  EXPECT_EQ(l.FrameBytes(1), 256u);
}

TEST(KvLayoutTest, MismatchNamesFieldAndBothValues) {
  const KvLayout a = TestLayout(5, 4, 8);
  EXPECT_TRUE(CheckCompatible(a, a).ok());
  KvLayout b = a;
  b.head_dim = 16;
  absl::Status s = CheckCompatible(a, b);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "KV layout mismatch in field 'head_dim': local 8, remote 16");
  b = a;
  b.numerics_id = "other";
  s = CheckCompatible(a, b);
  EXPECT_EQ(s.message(),
            "KV layout mismatch in field 'numerics_id': local "
            "\"test-build/x86_64/f32\", remote \"other\"");
  b = a;
  b.rope_freq_base = 1e6f;
  EXPECT_NE(CheckCompatible(a, b).message().find("rope_freq_base"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::kvtransfer::wire
