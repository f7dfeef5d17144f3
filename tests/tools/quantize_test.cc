// tools/quantize.h: hand-built blocks whose bytes follow from ggml's
// layouts (ggml-common.h) and rules (ggml-quants.c) by hand; round trips
// through engine/model's dequantizer within one quantization step; the
// Q4_K_M / Q5_K_M type choice and the bytes themselves against
// llama-quantize's files ../shared/models/kq-tiny-*.gguf (whose F32 source
// was `tandem synth-model` seed 977, see ../shared/models/README.md).
#include "tools/quantize.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/model/weight_matrix.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tools/synth_model.h"

namespace tandem::cli {
namespace {

using gguf::TensorType;
using ::tandem::testing::SharedPath;

uint16_t U16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Levels as ggml-common.h lays them out (the readers' formulas, written
// here independently of the quantizers).
int Q4_0Level(const uint8_t* block, int j) {  // qs at 2
  return j < 16 ? block[2 + j] & 0xF : block[2 + j - 16] >> 4;
}
int Q4_KLevel(const uint8_t* qs, int e) {  // element e < 256
  const int c = e / 64, r = e % 64;
  return r < 32 ? qs[32 * c + r] & 0xF : qs[32 * c + r - 32] >> 4;
}
int Q5_KLevel(const uint8_t* block, int e) {  // qh at 16, qs at 48
  const int c = e / 64, r = e % 64;
  const int bit = (block[16 + r % 32] >> (2 * c + (r < 32 ? 0 : 1))) & 1;
  return Q4_KLevel(block + 48, e) | bit << 4;
}
int Q6_KLevel(const uint8_t* block, int e) {  // ql at 0, qh at 128
  const int h = e / 128, g = e % 128 / 32, l = e % 32;
  const uint8_t ql = block[64 * h + l + 32 * (g & 1)];
  const int low = g >> 1 ? ql >> 4 : ql & 0xF;
  return low | ((block[128 + 32 * h + l] >> (2 * g)) & 3) << 4;
}
// get_scale_min_k4 of the 12 scale bytes.
void ScaleMin(const uint8_t* q, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4;
    *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
  }
}

TEST(QuantizeTest, Q4_0HandBuiltBlocks) {
  // Block 0: x[j] = j - 16. The largest magnitude is x[0] = -16, so
  // d = -16 / -8 = 2 (f16 0x4000), id = 0.5 and q = trunc(j / 2 + 0.5) =
  // (j + 1) / 2, capped at 15. Block 1: all zero: d = 0 / -8 = -0 (f16
  // 0x8000), id = 0, q = trunc(8.5) = 8.
  std::vector<float> x(64, 0.0f);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  uint8_t out[36];
  QuantizeRowQ4_0(x.data(), 64, out);
  EXPECT_EQ(U16(out), 0x4000);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(Q4_0Level(out, j), std::min(15, (j + 1) / 2)) << j;
  EXPECT_EQ(out[2], 0x80);       // q[0] = 0, q[16] = 8
  EXPECT_EQ(out[2 + 15], 0xF8);  // q[15] = 8, q[31] = min(15, 16)
  EXPECT_EQ(U16(out + 18), 0x8000);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(out[20 + j], 0x88);
}

// Sub-block s of 32 (Q4_K / Q5_K) with scale a * 2^-(s % 4) and levels q
// covering 0..nmax: x = a_s * (q - (nmax + 1) / 2). make_qkx2_quants fits
// it exactly (scale a_s, min (nmax + 1) / 2 * a_s); the 6-bit scales and
// mins are round(63 * 2^-k) = 63, 32, 16, 8 (31.5 rounds to even).
std::vector<float> AffineSuperBlock(float a, int nmax, std::vector<int>* q) {
  std::vector<float> x(256);
  q->resize(256);
  for (int s = 0; s < 8; ++s) {
    const float a_s = std::ldexp(a, -(s % 4));
    for (int e = 0; e < 32; ++e) {
      const int level = (e + 3 * s) % (nmax + 1);
      (*q)[32 * s + e] = level;
      x[32 * s + e] = a_s * static_cast<float>(level - (nmax + 1) / 2);
    }
  }
  return x;
}

// ls = lm = {63, 32, 16, 8, 63, 32, 16, 8} packed: bytes 0..3 ls[j] with
// ls[j + 4]'s top 2 bits at 6; 4..7 the same for lm; 8..11 the low
// nibbles of ls[j + 4] | lm[j + 4] << 4.
constexpr uint8_t kPackedScales[12] = {0xFF, 0xA0, 0x50, 0x08, 0xFF, 0xA0,
                                       0x50, 0x08, 0xFF, 0x00, 0x00, 0x88};

TEST(QuantizeTest, Q4_KHandBuiltSuperBlock) {
  std::vector<int> q;
  const std::vector<float> x = AffineSuperBlock(1.0f / 16, 15, &q);
  uint8_t out[144];
  QuantizeRowQ4_K(x.data(), 256, out);
  EXPECT_EQ(U16(out), 0x1410);      // d = (1/16) / 63 = 2^-10 * 1.0159 -> mantissa 16
  EXPECT_EQ(U16(out + 2), 0x2010);  // dmin = 8 * (1/16) / 63 = 2^-7 * 1.0159
  for (int i = 0; i < 12; ++i) EXPECT_EQ(out[4 + i], kPackedScales[i]) << i;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    ScaleMin(out + 4, j, &sc, &m);
    const int want[4] = {63, 32, 16, 8};
    EXPECT_EQ(sc, want[j % 4]) << j;
    EXPECT_EQ(m, want[j % 4]) << j;
  }
  for (int e = 0; e < 256; ++e) EXPECT_EQ(Q4_KLevel(out + 16, e), q[e]) << e;
}

TEST(QuantizeTest, Q5_KHandBuiltSuperBlock) {
  std::vector<int> q;
  const std::vector<float> x = AffineSuperBlock(1.0f / 32, 31, &q);
  uint8_t out[176];
  QuantizeRowQ5_K(x.data(), 256, out);
  EXPECT_EQ(U16(out), 0x1010);      // d = (1/32) / 63 = 2^-11 * 1.0159
  EXPECT_EQ(U16(out + 2), 0x2010);  // dmin = 16 * (1/32) / 63
  for (int i = 0; i < 12; ++i) EXPECT_EQ(out[4 + i], kPackedScales[i]) << i;
  for (int e = 0; e < 256; ++e) EXPECT_EQ(Q5_KLevel(out, e), q[e]) << e;
}

TEST(QuantizeTest, Q6_KHandBuiltSuperBlock) {
  // Sub-block b of 16: scale a_b = 2^-5 * 2^-(b % 4), x = a_b * (q - 32)
  // with q = 0 first (the largest magnitude, -32 a_b, so make_qx_quants'
  // iscale is 1 / a_b exactly). iscale = -128 / 2^-5: d = -2^-12 (f16
  // 0x8C00) and scales[b] = -128 * 2^-(b % 4), so d * scales[b] = a_b.
  std::vector<float> x(256);
  std::vector<int> q(256);
  for (int b = 0; b < 16; ++b) {
    const float a_b = std::ldexp(1.0f, -5 - b % 4);
    for (int k = 0; k < 16; ++k) {
      q[16 * b + k] = k == 0 ? 0 : (7 * k + 3 * b) % 64;
      x[16 * b + k] = a_b * static_cast<float>(q[16 * b + k] - 32);
    }
  }
  uint8_t out[210];
  QuantizeRowQ6_K(x.data(), 256, out);
  EXPECT_EQ(U16(out + 208), 0x8C00);
  for (int b = 0; b < 16; ++b) {
    EXPECT_EQ(static_cast<int8_t>(out[192 + b]), -(128 >> (b % 4))) << b;
  }
  for (int e = 0; e < 256; ++e) EXPECT_EQ(Q6_KLevel(out, e), q[e]) << e;
}

// Normal(0, 0.02) weights plus edge blocks: all zero, constant, and one
// outlier among small values.
std::vector<float> TestRow() {
  std::vector<float> x(256 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = SynthWeight(11, 2, i);
  for (int i = 0; i < 256; ++i) {
    x[256 + i] = 0.0f;
    x[512 + i] = 0.03f;
    x[768 + i] = i == 77 ? -0.5f : 1e-3f * static_cast<float>(i % 7);
  }
  return x;
}

// The levels of one block around a weight: level q decodes as
// zero + step * q, q in [qmin, qmax].
struct Grid {
  float zero, step;
  int qmin, qmax;
};

// Quantizes TestRow() as `type` and dequantizes it with engine/model's
// ConvertToF32 (ggml's dequantize_row_*). With t = (x - zero) / step the
// position of weight x on its block's grid (grid(block bytes, element)):
// a weight inside the grid (t within [qmin - 0.5, qmax + 0.5]) is rounded
// to the nearest level, so it comes back within half a step (Q4_0: of the
// unrounded d, 2^-11 relative to the f16 one, times |q - 8| <= 8: 1%
// slack); one outside (the grid's ends may fall short of the data: Q4_0
// caps at level 15, the K-quants' fitted scale and min may clip) within
// 1.5 steps.
template <typename GridOf>
void CheckRoundTrip(TensorType type, GridOf grid_of) {
  const std::vector<float> x = TestRow();
  const uint64_t block = gguf::TensorBlockSize(type);
  const uint64_t block_bytes = gguf::TensorBlockBytes(type);
  std::vector<uint8_t> q(x.size() / block * block_bytes);
  ConvertFromF32(type, x.data(), x.size(), q.data());
  std::vector<float> y(x.size());
  model::internal::ConvertToF32(type, q.data(), x.size(), y.data());
  double worst_inside = 0, worst_outside = 0;
  int outside = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const Grid g = grid_of(q.data() + i / block * block_bytes, static_cast<int>(i % block));
    const float step = std::fabs(g.step);
    const float err = std::fabs(x[i] - y[i]);
    const double t = g.step != 0 ? (x[i] - g.zero) / g.step : 0.0;
    const bool inside = t >= g.qmin - 0.5 && t <= g.qmax + 0.5;
    const float bound = inside ? 0.505f * step : 1.5f * step;
    ASSERT_LE(err, bound + 1e-9f) << gguf::TensorTypeName(type) << " weight " << i << ": "
                                  << x[i] << " -> " << y[i] << ", step " << step;
    if (step == 0) continue;
    outside += !inside;
    (inside ? worst_inside : worst_outside) =
        std::max(inside ? worst_inside : worst_outside, static_cast<double>(err / step));
  }
  std::printf("%s: max |x - deq| / step %.3f inside the grid, %.3f for the %d outside\n",
              std::string(gguf::TensorTypeName(type)).c_str(), worst_inside, worst_outside,
              outside);
}

TEST(QuantizeTest, RoundTripsWithinTheStep) {
  using model::internal::HalfToFloat;
  CheckRoundTrip(TensorType::kQ4_0, [](const uint8_t* b, int) {
    const float d = HalfToFloat(U16(b));
    return Grid{-8 * d, d, 0, 15};
  });
  for (TensorType type : {TensorType::kQ4_K, TensorType::kQ5_K}) {
    const int qmax = type == TensorType::kQ4_K ? 15 : 31;
    CheckRoundTrip(type, [qmax](const uint8_t* b, int e) {
      int sc, m;
      ScaleMin(b + 4, e / 32, &sc, &m);
      return Grid{-HalfToFloat(U16(b + 2)) * static_cast<float>(m),
                  HalfToFloat(U16(b)) * static_cast<float>(sc), 0, qmax};
    });
  }
  CheckRoundTrip(TensorType::kQ6_K, [](const uint8_t* b, int e) {
    const float step =
        HalfToFloat(U16(b + 208)) * static_cast<float>(static_cast<int8_t>(b[192 + e / 16]));
    return Grid{-32 * step, step, 0, 63};
  });
}

TEST(QuantizeTest, ConvertFromF32CopiesF32AndRoundsF16) {
  const float x[2] = {0.1f, -3.0f};
  uint8_t f32[8], f16[4];
  ConvertFromF32(TensorType::kF32, x, 2, f32);
  EXPECT_EQ(std::memcmp(f32, x, 8), 0);
  ConvertFromF32(TensorType::kF16, x, 2, f16);
  EXPECT_EQ(U16(f16), FloatToHalf(0.1f));
  EXPECT_EQ(U16(f16 + 2), 0xC200);  // -3 = -1.5 * 2^1
}

TEST(QuantizeMixTest, UseMoreBitsAndTiedOutput) {
  // n_layer 4: 4 / 8 = 0, 7 * 4 / 8 = 3: layers 2 ((2 - 0) % 3 == 2) and 3.
  EXPECT_FALSE(UseMoreBits(0, 4));
  EXPECT_FALSE(UseMoreBits(1, 4));
  EXPECT_TRUE(UseMoreBits(2, 4));
  EXPECT_TRUE(UseMoreBits(3, 4));
  const QuantMix m = QuantMix::kKQuantM;
  EXPECT_EQ(MixTensorType(TensorType::kQ4_K, m, "token_embd.weight", 4, true), TensorType::kQ4_K);
  EXPECT_EQ(MixTensorType(TensorType::kQ4_K, m, "token_embd.weight", 4, false), TensorType::kQ6_K);
  EXPECT_EQ(MixTensorType(TensorType::kQ5_K, m, "blk.3.ffn_down.weight", 4, true),
            TensorType::kQ6_K);
  EXPECT_EQ(MixTensorType(TensorType::kQ5_K, m, "blk.3.ffn_up.weight", 4, true),
            TensorType::kQ5_K);
  EXPECT_EQ(MixTensorType(TensorType::kQ4_K, m, "blk.x.attn_v.weight", 4, true),
            TensorType::kQ4_K);
  EXPECT_EQ(MixTensorType(TensorType::kQ4_K, QuantMix::kPure, "output.weight", 4, true),
            TensorType::kQ4_K);
}

// llama-quantize's files: every 2-D tensor's type is MixTensorType's, and
// general.file_type is LlamaFileType's.
TEST(QuantizeMixTest, MatchesLlamaQuantizeTypes) {
  struct Case {
    const char* file;
    TensorType base;
    QuantMix mix;
  };
  for (const Case& c : {Case{"q4_k_m", TensorType::kQ4_K, QuantMix::kKQuantM},
                        Case{"q5_k_m", TensorType::kQ5_K, QuantMix::kKQuantM}}) {
    SCOPED_TRACE(c.file);
    absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f =
        gguf::GgufFile::Open(SharedPath(std::string("models/kq-tiny-") + c.file + ".gguf"));
    ASSERT_TRUE(f.ok()) << f.status();
    absl::StatusOr<uint64_t> n_layer = (*f)->GetUint("llama.block_count");
    ASSERT_TRUE(n_layer.ok());
    const bool has_output = (*f)->FindTensor("output.weight") != nullptr;
    int base = 0, q6 = 0;
    for (const gguf::TensorInfo& t : (*f)->tensors()) {
      if (t.dims.size() != 2) continue;
      EXPECT_EQ(MixTensorType(c.base, c.mix, t.name, static_cast<int32_t>(*n_layer), has_output),
                t.type)
          << t.name;
      base += t.type == c.base;
      q6 += t.type == TensorType::kQ6_K;
    }
    EXPECT_EQ(base, 25);  // as the README says
    EXPECT_EQ(q6, 5);
    EXPECT_EQ((*f)->GetUint("general.file_type").value_or(999), LlamaFileType(c.base, c.mix));
  }
}

// `tandem synth-model` on kq-tiny's shape and seed writes llama-quantize's
// bytes: every 2-D tensor of the same type is byte-identical (Q4_K, Q5_K,
// Q6_K, Q4_0; kq-tiny-q4_0 keeps output in Q6_K where --type q4_0 is
// pure). output_norm differs (the reference scaled it by 12).
TEST(QuantizeMixTest, SynthModelWritesLlamaQuantizeBytes) {
  for (const char* type : {"q4_k_m", "q5_k_m", "q4_0"}) {
    SCOPED_TRACE(type);
    const std::string out = (std::filesystem::temp_directory_path() /
                             ("kq_tiny_" + std::string(type) + "." +
                              std::to_string(::getpid()) + ".gguf"))
                                .string();
    absl::StatusOr<SynthModelOptions> o = ParseSynthModelArgs(
        {"--out", out, "--vocab-from", SharedPath("models/ggml-vocab-llama-spm.gguf"), "--dim",
         "256", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--ff", "768", "--context",
         "2048", "--seed", "977", "--type", type});
    ASSERT_TRUE(o.ok()) << o.status();
    ASSERT_TRUE(WriteSynthModel(*o).ok());
    absl::StatusOr<std::unique_ptr<gguf::GgufFile>> ours = gguf::GgufFile::Open(out);
    absl::StatusOr<std::unique_ptr<gguf::GgufFile>> ref =
        gguf::GgufFile::Open(SharedPath(std::string("models/kq-tiny-") + type + ".gguf"));
    ASSERT_TRUE(ours.ok() && ref.ok());
    EXPECT_EQ((*ours)->GetUint("general.file_type").value_or(0),
              (*ref)->GetUint("general.file_type").value_or(1));
    int same = 0, other_type = 0;
    for (const gguf::TensorInfo& r : (*ref)->tensors()) {
      if (r.dims.size() != 2) continue;
      const gguf::TensorInfo* t = (*ours)->FindTensor(r.name);
      ASSERT_NE(t, nullptr) << r.name;
      ASSERT_EQ(t->dims, r.dims) << r.name;
      if (t->type != r.type) {
        ++other_type;
        continue;
      }
      ASSERT_EQ(t->n_bytes, r.n_bytes) << r.name;
      EXPECT_EQ(std::memcmp(t->data, r.data, r.n_bytes), 0) << r.name;
      ++same;
    }
    EXPECT_EQ(same, std::string(type) == "q4_0" ? 29 : 30);
    EXPECT_EQ(other_type, std::string(type) == "q4_0" ? 1 : 0);
    std::filesystem::remove(out);
  }
}

}  // namespace
}  // namespace tandem::cli
