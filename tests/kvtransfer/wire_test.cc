// Wire format v2: byte layouts written out by hand from the table in
// kvtransfer/wire.h, round trips, DATA_LOSS on every truncation,
// FAILED_PRECONDITION for another protocol version or an unknown dtype, and
// the KvLayout helpers (sizes, layout id, mismatch messages).
#include "kvtransfer/wire.h"

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer::wire {
namespace {

using ::tandem::kvtransfer::testing::RandomSamples;
using ::tandem::kvtransfer::testing::SameSamples;
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

TEST(KvWireTest, KeepaliveIsTypeEightWithEmptyPayload) {
  EXPECT_EQ(EncodeKeepalive(), std::string("\x08\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(MessageTypeName(8), "KEEPALIVE");
  EXPECT_TRUE(DecodeKeepalive("").ok());
  const absl::Status extra = DecodeKeepalive("x");
  EXPECT_EQ(extra.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(extra.message().find("KEEPALIVE"), std::string::npos) << extra;
}

// Two samples: sample 0 with one top logprob, sample 1 with none.
TEST(KvWireTest, FinalByteLayout) {
  TransferResult r;
  r.samples.resize(2);
  r.samples[0].token = -2;          // fe ff ff ff
  r.samples[0].logprob = -0.5f;     // 0xbf000000
  r.samples[0].finish_reason = 3;
  r.samples[0].top_logprobs = {{7, -1.0f}};  // -1.0f = 0xbf800000
  r.samples[1].token = 5;
  r.samples[1].logprob = 0.25f;     // 0x3e800000
  r.samples[1].finish_reason = 0;
  r.frames = 0x0102030405060708ull;
  r.kv_bytes = 400640;              // 0x61d00
  r.peer_bit_exact_class = "not on the wire";
  // n_samples 4 + sample 0 (16 + 8) + sample 1 16 + totals 16 = 60.
  const std::string want =
      U32(5) + U32(60) + U32(2) +
      std::string("\xfe\xff\xff\xff", 4) + std::string("\x00\x00\x00\xbf", 4) +
      U32(3) + U32(1) + U32(7) + std::string("\x00\x00\x80\xbf", 4) +
      U32(5) + std::string("\x00\x00\x80\x3e", 4) + U32(0) + U32(0) +
      std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8) +
      std::string("\x00\x1d\x06\x00\x00\x00\x00\x00", 8);
  EXPECT_EQ(EncodeFinal(r), want);
  absl::StatusOr<TransferResult> back = DecodeFinal(Payload(want));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->samples.size(), 2u);
  EXPECT_EQ(back->samples[0].token, -2);
  EXPECT_EQ(back->samples[0].logprob, -0.5f);
  EXPECT_EQ(back->samples[0].finish_reason, 3u);
  ASSERT_EQ(back->samples[0].top_logprobs.size(), 1u);
  EXPECT_EQ(back->samples[0].top_logprobs[0].token_id, 7);
  EXPECT_EQ(back->samples[0].top_logprobs[0].logprob, -1.0f);
  EXPECT_EQ(back->samples[1].token, 5);
  EXPECT_EQ(back->samples[1].logprob, 0.25f);
  EXPECT_EQ(back->samples[1].finish_reason, 0u);
  EXPECT_TRUE(back->samples[1].top_logprobs.empty());
  EXPECT_EQ(back->frames, 0x0102030405060708ull);
  EXPECT_EQ(back->kv_bytes, 400640u);
  EXPECT_EQ(back->peer_bit_exact_class, "");
}

// Encodes `samples` with fixed totals, decodes, and expects every field back.
void ExpectFinalRoundTrip(const std::vector<FinalSample>& samples) {
  TransferResult r;
  r.samples = samples;
  r.frames = 9;
  r.kv_bytes = 6144;
  const std::string msg = EncodeFinal(r);
  // n_samples + per sample (16 + 8 x n_top) + frames + kv_bytes.
  size_t want_payload = 4 + 16;
  for (const FinalSample& s : samples) want_payload += 16 + 8 * s.top_logprobs.size();
  uint32_t type = 0, len = 0;
  GetHeader(msg.data(), &type, &len);
  EXPECT_EQ(type, 5u);
  EXPECT_EQ(len, want_payload);
  EXPECT_EQ(msg.size(), kHeaderBytes + want_payload);
  absl::StatusOr<TransferResult> back = DecodeFinal(Payload(msg));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameSamples(back->samples, samples));
  EXPECT_EQ(back->frames, 9u);
  EXPECT_EQ(back->kv_bytes, 6144u);
}

TEST(KvWireTest, FinalRoundTripOneAndThreeSamples) {
  for (uint32_t n_top : {0u, 1u, 20u}) {
    SCOPED_TRACE(absl::StrCat("1 sample, n_top ", n_top));
    ExpectFinalRoundTrip(RandomSamples({n_top}, 10 + n_top));
  }
  SCOPED_TRACE("3 samples, n_top 0, 1, 20");
  ExpectFinalRoundTrip(RandomSamples({0, 1, 20}, 3));
  // The same n_tops in another order, and special logprobs.
  std::vector<FinalSample> samples = RandomSamples({20, 0, 1}, 4);
  samples[0].logprob = -std::numeric_limits<float>::infinity();
  samples[1].logprob = -0.0f;
  samples[2].top_logprobs[0].logprob = std::numeric_limits<float>::denorm_min();
  ExpectFinalRoundTrip(samples);
}

TEST(KvWireTest, FinalAtTheLimitsRoundTripsAndFitsAControlMessage) {
  // 16 samples x 20 top logprobs: 4 + 16 x (16 + 20 x 8) + 16 = 2,836 bytes.
  EXPECT_EQ(kMaxFinalSamples, 16u);
  EXPECT_EQ(kMaxFinalTopLogprobs, 20u);
  EXPECT_EQ(kMaxFinalPayload, 2836u);
  EXPECT_LE(kMaxFinalPayload, kMaxControlPayload);
  const std::vector<FinalSample> samples =
      RandomSamples(std::vector<uint32_t>(16, 20), 16);
  TransferResult r;
  r.samples = samples;
  EXPECT_EQ(EncodeFinal(r).size(), kHeaderBytes + 2836);
  ExpectFinalRoundTrip(samples);
}

// Every strict prefix of FinalByteLayout's message is DATA_LOSS naming the
// field that the cut falls in; one trailing byte is DATA_LOSS too.
TEST(KvWireTest, FinalTruncatedAtEveryOffsetNamesTheField) {
  TransferResult r;
  r.samples.resize(2);
  r.samples[0].top_logprobs = {{7, -1.0f}};
  const std::string payload = Payload(EncodeFinal(r));
  ASSERT_EQ(payload.size(), 60u);
  // [begin, end) of each field, from the table in wire.h.
  const struct {
    size_t begin, end;
    const char* field;
  } fields[] = {
      {0, 4, "n_samples"},
      {4, 8, "samples[0].token"},
      {8, 12, "samples[0].logprob"},
      {12, 16, "samples[0].finish_reason"},
      {16, 20, "samples[0].n_top"},
      {20, 24, "samples[0].top_logprobs[0].token_id"},
      {24, 28, "samples[0].top_logprobs[0].logprob"},
      {28, 32, "samples[1].token"},
      {32, 36, "samples[1].logprob"},
      {36, 40, "samples[1].finish_reason"},
      {40, 44, "samples[1].n_top"},
      {44, 52, "frames"},
      {52, 60, "kv_bytes"},
  };
  for (const auto& f : fields) {
    for (size_t n = f.begin; n < f.end; ++n) {
      absl::StatusOr<TransferResult> t = DecodeFinal(payload.substr(0, n));
      EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss) << n;
      EXPECT_EQ(t.status().message(),
                absl::StrCat("malformed KV FINAL message: field '", f.field,
                             "' needs ", f.end - f.begin, " bytes, ",
                             n - f.begin, " left"))
          << n;
    }
  }
  EXPECT_EQ(DecodeFinal(payload + "x").status().message(),
            "malformed KV FINAL message: field 'end' 1 trailing bytes");
  // The same for a bigger FINAL, by code: 3 samples with 0, 1, 20 top
  // logprobs, and 16 x 20.
  for (const std::vector<uint32_t>& n_tops :
       {std::vector<uint32_t>{0, 1, 20}, std::vector<uint32_t>(16, 20)}) {
    r.samples = RandomSamples(n_tops, 5);
    const std::string big = Payload(EncodeFinal(r));
    for (size_t n = 0; n < big.size(); ++n) {
      EXPECT_EQ(DecodeFinal(big.substr(0, n)).status().code(),
                absl::StatusCode::kDataLoss) << n;
    }
    EXPECT_TRUE(DecodeFinal(big).ok());
    EXPECT_EQ(DecodeFinal(big + "x").status().code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(KvWireTest, FinalCountsOutOfRangeAreDataLossNamingTheField) {
  TransferResult r;  // no samples: n_samples 0
  EXPECT_EQ(DecodeFinal(Payload(EncodeFinal(r))).status(),
            absl::DataLossError("malformed KV FINAL message: field 'n_samples' "
                                "0 outside [1, 16]"));
  r.samples = RandomSamples(std::vector<uint32_t>(17, 0), 17);
  EXPECT_EQ(DecodeFinal(Payload(EncodeFinal(r))).status(),
            absl::DataLossError("malformed KV FINAL message: field 'n_samples' "
                                "17 outside [1, 16]"));
  // A huge count is refused before anything is allocated for it.
  EXPECT_EQ(DecodeFinal(U32(0xffffffffu)).status(),
            absl::DataLossError("malformed KV FINAL message: field 'n_samples' "
                                "4294967295 outside [1, 16]"));
  r.samples = RandomSamples({20, 21}, 21);
  EXPECT_EQ(DecodeFinal(Payload(EncodeFinal(r))).status(),
            absl::DataLossError("malformed KV FINAL message: field "
                                "'samples[1].n_top' 21 outside [0, 20]"));
  // sample 0: n_top 0xffffffff, nothing after it.
  EXPECT_EQ(DecodeFinal(U32(1) + U32(1) + U32(0) + U32(0) + U32(0xffffffffu))
                .status(),
            absl::DataLossError("malformed KV FINAL message: field "
                                "'samples[0].n_top' 4294967295 outside [0, 20]"));
}

// The single-token FINAL that v2 carried before per-sample FINALs
// (i32 first_token, f32 first_logprob, u32 finish_reason, u64 frames,
// u64 kv_bytes: 28 bytes) never decodes: n_samples out of range, or too
// few bytes for the samples it would announce.
TEST(KvWireTest, SingleTokenFinalIsDataLoss) {
  for (int32_t token : {-1, 0, 1, 2, 16, 17, 42}) {
    for (uint32_t frames_high : {0u, 1u, 20u, 21u}) {
      const std::string old = U32(static_cast<uint32_t>(token)) +
                              std::string("\x00\x00\x00\xbf", 4) + U32(2) +
                              U32(5) + U32(frames_high) + U32(640) + U32(0);
      ASSERT_EQ(old.size(), 28u);
      EXPECT_EQ(DecodeFinal(old).status().code(), absl::StatusCode::kDataLoss)
          << token << " " << frames_high;
    }
  }
}

TEST(KvWireTest, FrameByteLayoutAndRoundTrip) {
  FrameHeader h{"ab", 7, 2, 300, 1};
  const float k[2] = {1.0f, -2.0f};  // 0x3f800000, 0xc0000000
  const float v[2] = {0.0f, 0.5f};   // 0, 0x3f000000
  absl::StatusOr<std::string> msg = EncodeFrame(h, k, v, sizeof(k));
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

TEST(KvWireTest, HelloV4ByteLayout) {
  Hello h;
  h.request_id = "r1";
  h.attempt = 3;
  h.layout.model_fingerprint = "fp";
  h.layout.n_layers = 5;
  h.layout.n_kv_heads = 4;
  h.layout.head_dim = 8;
  h.layout.dtype = KvDtype::kF16;
  h.bit_exact_class = "c";
  EXPECT_EQ(h.protocol_version, 4u);  // the default
  EXPECT_EQ(h.transport, "tcp");      // the default
  // version 4 + "r1" 6 + attempt 4 + "fp" 6 + 3 x 4 + dtype 4 + "c" 5 +
  // "tcp" 7 + "" 4 = 52.
  const std::string want = U32(1) + U32(52) + U32(4) + U32(2) + "r1" + U32(3) +
                           U32(2) + "fp" + U32(5) + U32(4) + U32(8) + U32(1) +
                           U32(1) + "c" + U32(3) + "tcp" + U32(0);
  EXPECT_EQ(EncodeHello(h), want);
}

TEST(KvWireTest, HelloV4RoundTrip) {
  Hello h;
  h.request_id = "0123456789abcdef0123456789abcdef";
  h.attempt = 3;
  h.layout = TestLayout(5, 4, 8, KvDtype::kF16);
  h.layout.model_fingerprint = "sha256:0f1e2d";
  h.bit_exact_class = "tandem-cpu/avx512/v2";
  const std::string msg = EncodeHello(h);
  uint32_t type = 0, len = 0;
  GetHeader(msg.data(), &type, &len);
  EXPECT_EQ(type, 1u);
  EXPECT_EQ(len, msg.size() - kHeaderBytes);
  EXPECT_EQ(msg.substr(kHeaderBytes, 4), U32(4));  // version first
  absl::StatusOr<Hello> back = DecodeHello(Payload(msg));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->protocol_version, 4u);
  EXPECT_EQ(back->request_id, h.request_id);
  EXPECT_EQ(back->attempt, 3u);
  EXPECT_EQ(back->layout.model_fingerprint, "sha256:0f1e2d");
  EXPECT_EQ(back->layout.n_layers, 5u);
  EXPECT_EQ(back->layout.n_kv_heads, 4u);
  EXPECT_EQ(back->layout.head_dim, 8u);
  EXPECT_EQ(back->layout.dtype, KvDtype::kF16);
  EXPECT_EQ(back->bit_exact_class, "tandem-cpu/avx512/v2");
  EXPECT_TRUE(CheckCompatible(h.layout, back->layout).ok());
  // The optional out-parameter sees the same fields.
  Hello fields;
  ASSERT_TRUE(DecodeHello(Payload(msg), &fields).ok());
  EXPECT_EQ(fields.request_id, h.request_id);
  EXPECT_EQ(fields.bit_exact_class, h.bit_exact_class);
  EXPECT_EQ(fields.layout.LayoutId(), h.layout.LayoutId());
}

// The version is read first and nothing after it: a v1 or future HELLO is
// FAILED_PRECONDITION whatever follows, never DATA_LOSS.
TEST(KvWireTest, HelloWithOtherVersionIsFailedPrecondition) {
  const std::string v4 =
      Payload(EncodeHello({4, "req", 1, TestLayout(2, 2, 4), "c", {}, "tcp", ""}));
  for (uint32_t version : {1u, 2u, 3u, 7u}) {
    const std::string want =
        absl::StrCat("KV protocol version ", version,
                     " is not supported (this worker speaks 4)");
    for (const std::string& payload :
         {U32(version) + v4.substr(4), U32(version), U32(version) + "\xff"}) {
      Hello fields;
      absl::StatusOr<Hello> h = DecodeHello(payload, &fields);
      EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition)
          << h.status();
      EXPECT_EQ(h.status().message(), want);
      EXPECT_EQ(fields.protocol_version, version);
      EXPECT_EQ(fields.request_id, "");  // not read
    }
  }
  // The encoder writes whatever version it is given (tests use that).
  EXPECT_EQ(Payload(EncodeHello({7, "req", 1, TestLayout(2, 2, 4), "c", {}, "tcp", ""}))
                .substr(0, 4),
            U32(7));
}

TEST(KvWireTest, HelloWithUnknownDtypeIsFailedPreconditionNamingIt) {
  for (uint32_t dtype : {2u, 29u, 99u}) {  // 2 = ggml Q4_0: not a KV dtype
    KvLayout l = TestLayout(2, 2, 4);
    l.dtype = static_cast<KvDtype>(dtype);
    const std::string payload =
        Payload(EncodeHello({4, "req-dt", 4, l, "cls", {}, "tcp", ""}));
    Hello fields;
    absl::StatusOr<Hello> h = DecodeHello(payload, &fields);
    EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition)
        << h.status();
    EXPECT_EQ(h.status().message(), absl::StrCat("unknown KV dtype ", dtype));
    // Read in full, so the receiver knows which transfer it was for.
    EXPECT_EQ(fields.protocol_version, 4u);
    EXPECT_EQ(fields.request_id, "req-dt");
    EXPECT_EQ(fields.attempt, 4u);
    EXPECT_EQ(static_cast<uint32_t>(fields.layout.dtype), dtype);
    EXPECT_EQ(fields.bit_exact_class, "cls");
    // Framing errors still win: truncated or trailing bytes are DATA_LOSS.
    EXPECT_EQ(DecodeHello(payload.substr(0, payload.size() - 1)).status().code(),
              absl::StatusCode::kDataLoss);
    EXPECT_EQ(DecodeHello(payload + "x").status().code(),
              absl::StatusCode::kDataLoss);
  }
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
      Payload(EncodeHello({kKvProtocolVersion, "req", 1, TestLayout(2, 2, 4), "class", {},
                           "tcp", ""}));
  TransferResult one_sample;
  one_sample.samples = ::tandem::kvtransfer::testing::OneSample(3, -1.5f, 1);
  const std::string final_msg = Payload(EncodeFinal(one_sample));
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
  absl::StatusOr<Hello> h = DecodeHello(U32(kKvProtocolVersion) + U32(0xfffffff0u) + "abc");
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(h.status().message().find("request_id"), std::string::npos)
      << h.status();
  // A payload too short for the version names that field.
  h = DecodeHello(std::string("\x02\0", 2));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(h.status().message().find("protocol_version"), std::string::npos)
      << h.status();
}

TEST(KvLayoutTest, DtypesAreGgmlTypeNumbers) {
  // ggml.h, enum ggml_type: GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1,
  // GGML_TYPE_BF16 = 30.
  EXPECT_EQ(static_cast<uint32_t>(KvDtype::kF32), 0u);
  EXPECT_EQ(static_cast<uint32_t>(KvDtype::kF16), 1u);
  EXPECT_EQ(static_cast<uint32_t>(KvDtype::kBF16), 30u);
  EXPECT_STREQ(KvDtypeName(KvDtype::kF32), "f32");
  EXPECT_STREQ(KvDtypeName(KvDtype::kF16), "f16");
  EXPECT_STREQ(KvDtypeName(KvDtype::kBF16), "bf16");
  EXPECT_STREQ(KvDtypeName(static_cast<KvDtype>(99)), "unknown");
  EXPECT_EQ(KvDtypeBytes(KvDtype::kF32), 4u);
  EXPECT_EQ(KvDtypeBytes(KvDtype::kF16), 2u);
  EXPECT_EQ(KvDtypeBytes(KvDtype::kBF16), 2u);
  EXPECT_EQ(KvDtypeBytes(static_cast<KvDtype>(99)), 0u);
  for (uint32_t v : {0u, 1u, 30u}) EXPECT_TRUE(IsKnownKvDtype(v)) << v;
  for (uint32_t v : {2u, 3u, 29u, 31u, 99u, 0xffffffffu}) {
    EXPECT_FALSE(IsKnownKvDtype(v)) << v;
  }
}

TEST(KvLayoutTest, FrameBytesMatchesReferenceCount) {
  // f32: 313 tokens x 2 (K, V) x 4 heads x 8 dims x 4 bytes = 80,128 per
  // layer; x 5 layers = 400,640.
  KvLayout l = TestLayout(5, 4, 8);
  EXPECT_EQ(l.kv_dim(), 32u);
  EXPECT_EQ(l.RowBytes(), 128u);  // 32 x 4
  EXPECT_EQ(l.FrameBytes(313), 80128u);
  EXPECT_EQ(l.FrameBytes(1), 256u);
  // f16 (and bf16): half of that, 2 bytes an element.
  for (KvDtype d : {KvDtype::kF16, KvDtype::kBF16}) {
    l.dtype = d;
    EXPECT_EQ(l.kv_dim(), 32u);
    EXPECT_EQ(l.RowBytes(), 64u);  // 32 x 2
    EXPECT_EQ(l.FrameBytes(313), 40064u);  // 313 x 2 x 64
    EXPECT_EQ(l.FrameBytes(1), 128u);
  }
  // 64-bit arithmetic: 65536 x 65536 x 4 bytes does not wrap.
  KvLayout big = TestLayout(1, 65536, 65536);
  EXPECT_EQ(big.RowBytes(), 17179869184ull);
  EXPECT_EQ(big.FrameBytes(2), 68719476736ull);
}

TEST(KvLayoutTest, LayoutIdSpellsEveryField) {
  EXPECT_EQ(TestLayout(5, 4, 8).LayoutId(), "kv4/test-model-fp/L5.H4.D8/f32");
  EXPECT_EQ(TestLayout(1, 2, 64, KvDtype::kBF16).LayoutId(),
            "kv4/test-model-fp/L1.H2.D64/bf16");
}

// Two ends can exchange KV iff their layout ids are equal: every field
// changes the id, and CheckCompatible agrees with the id comparison.
TEST(KvLayoutTest, LayoutIdEqualIffLayoutsEqual) {
  const KvLayout a = TestLayout(5, 4, 8);
  std::vector<KvLayout> variants;
  KvLayout b = a;
  b.model_fingerprint = "other-fp";
  variants.push_back(b);
  b = a;
  b.n_layers = 6;
  variants.push_back(b);
  b = a;
  b.n_kv_heads = 2;
  variants.push_back(b);
  b = a;
  b.head_dim = 16;
  variants.push_back(b);
  b = a;
  b.dtype = KvDtype::kF16;
  variants.push_back(b);
  b = a;
  b.dtype = KvDtype::kBF16;
  variants.push_back(b);
  // Same kv_dim (4 x 8 = 8 x 4) is still another layout.
  variants.push_back(TestLayout(5, 8, 4));
  EXPECT_EQ(KvLayout(a).LayoutId(), a.LayoutId());
  EXPECT_TRUE(CheckCompatible(a, KvLayout(a)).ok());
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_NE(variants[i].LayoutId(), a.LayoutId()) << variants[i].LayoutId();
    EXPECT_FALSE(CheckCompatible(a, variants[i]).ok()) << i;
    for (size_t j = 0; j < variants.size(); ++j) {
      EXPECT_EQ(variants[i].LayoutId() == variants[j].LayoutId(), i == j)
          << variants[i].LayoutId() << " vs " << variants[j].LayoutId();
      EXPECT_EQ(CheckCompatible(variants[i], variants[j]).ok(), i == j);
    }
  }
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
  b.model_fingerprint = "other";
  s = CheckCompatible(a, b);
  EXPECT_EQ(s.message(),
            "KV layout mismatch in field 'model_fingerprint': local "
            "\"test-model-fp\", remote \"other\"");
  b = a;
  b.n_layers = 7;
  b.head_dim = 16;  // first difference in wire order wins
  EXPECT_EQ(CheckCompatible(a, b).message(),
            "KV layout mismatch in field 'n_layers': local 5, remote 7");
}

TEST(KvLayoutTest, DtypeMismatchNamesBothDtypes) {
  const KvLayout a = TestLayout(5, 4, 8);
  KvLayout b = a;
  b.dtype = KvDtype::kF16;
  absl::Status s = CheckCompatible(a, b);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "KV layout mismatch in field 'dtype': local f32, remote f16");
  s = CheckCompatible(b, TestLayout(5, 4, 8, KvDtype::kBF16));
  EXPECT_EQ(s.message(),
            "KV layout mismatch in field 'dtype': local f16, remote bf16");
}

}  // namespace
}  // namespace tandem::kvtransfer::wire
