// F32 -> F16 / BF16 rounding of the KV cache (kv_convert.h) against bits
// worked out by hand (ties to even, subnormals, overflow, infinities,
// NaNs), and F16 against the x86 instruction ggml uses (`_cvtss_sh(x, 0)`)
// over a sweep of every 509th float bit pattern when this CPU has F16C.
#include "engine/kv/kv_convert.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/gguf/half.h"
#include "gtest/gtest.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tandem::kv {
namespace {

float Bits(uint32_t u) { return std::bit_cast<float>(u); }

struct Case {
  uint32_t in;    // binary32 bits
  uint16_t want;  // result bits
  const char* why;
};

TEST(KvConvertTest, F16RoundsToNearestEvenAsCvtssSh) {
  const Case cases[] = {
      {0x3f800000u, 0x3c00, "1.0"},
      {0xc0000000u, 0xc000, "-2.0"},
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x3f801000u, 0x3c00, "1 + 2^-11: tie, to even 1.0"},
      {0x3f803000u, 0x3c02, "1 + 3*2^-11: tie, to even 1 + 2^-9"},
      {0x3f801001u, 0x3c01, "just above the tie: up"},
      {0x3f800fffu, 0x3c00, "just below the tie: down"},
      {0x477fe000u, 0x7bff, "65504, the largest half"},
      {0x477fefffu, 0x7bff, "just below 65520: largest half"},
      {0x477ff000u, 0x7c00, "65520: tie with 2^16, to even = inf"},
      {0x49742400u, 0x7c00, "1e6 overflows to inf"},
      {0xc9742400u, 0xfc00, "-1e6 overflows to -inf"},
      {0x7f800000u, 0x7c00, "+inf"},
      {0xff800000u, 0xfc00, "-inf"},
      {0x38800000u, 0x0400, "2^-14, smallest normal half"},
      {0x33800000u, 0x0001, "2^-24, smallest subnormal half"},
      {0xb3800000u, 0x8001, "-2^-24"},
      {0x33000000u, 0x0000, "2^-25: tie between 0 and 2^-24, to even 0"},
      {0x33400000u, 0x0001, "3*2^-26: above the tie, up"},
      {0x33c00000u, 0x0002, "3*2^-25: tie between 1 and 2 ulps, to even 2"},
      {0x387fe000u, 0x0400, "2^-14 - 2^-25: tie, to even (the smallest normal)"},
      {0x387fc000u, 0x03ff, "2^-14 - 2^-24: the largest subnormal half"},
      {0x00000001u, 0x0000, "float subnormal underflows to +0"},
      {0x7fc00000u, 0x7e00, "quiet NaN"},
      {0xffc00000u, 0xfe00, "negative quiet NaN keeps its sign"},
      {0x7f800001u, 0x7e00, "signalling NaN, low payload: quieted"},
      {0x7fbfe000u, 0x7fff, "NaN payload's top 9 bits kept"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FloatToF16(Bits(c.in)), c.want) << c.why;
  }
}

TEST(KvConvertTest, Bf16RoundsAsGgmlComputeFp32ToBf16) {
  const Case cases[] = {
      {0x3f800000u, 0x3f80, "1.0"},
      {0x80000000u, 0x8000, "-0"},
      {0x3f808000u, 0x3f80, "tie, low bit even: down"},
      {0x3f818000u, 0x3f82, "tie, low bit odd: up to even"},
      {0x3f808001u, 0x3f81, "above the tie: up"},
      {0x3f807fffu, 0x3f80, "below the tie: down"},
      {0x7f7fffffu, 0x7f80, "FLT_MAX rounds up to inf"},
      {0x7f7f7fffu, 0x7f7f, "the largest finite bf16 stays"},
      {0x7f800000u, 0x7f80, "+inf"},
      {0xff800000u, 0xff80, "-inf"},
      {0x00008000u, 0x0000, "subnormal tie, even: down (kept, not flushed)"},
      {0x00018000u, 0x0002, "subnormal tie, odd: up"},
      {0x00010000u, 0x0001, "smallest bf16 subnormal"},
      {0x7fc00000u, 0x7fc0, "quiet NaN"},
      {0x7f800001u, 0x7fc0, "signalling NaN: truncated, forced quiet"},
      {0xffc12345u, 0xffc1, "negative NaN keeps sign and top payload"},
      {0x7fa00000u, 0x7fe0, "sNaN payload 0x20 kept, quiet bit 0x40 set"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FloatToBf16(Bits(c.in)), c.want) << c.why;
  }
}

TEST(KvConvertTest, WideningIsExact) {
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(std::bit_cast<uint32_t>(Bf16ToFloat(0x8001)), 0x80010000u);
  // Every finite bf16 and half survives a round trip through F32.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const auto b = static_cast<uint16_t>(h);
    if ((h & 0x7f80u) != 0x7f80u) {
      EXPECT_EQ(FloatToBf16(Bf16ToFloat(b)), b) << h;
    }
    if ((h & 0x7c00u) != 0x7c00u) {
      EXPECT_EQ(FloatToF16(gguf::HalfToFloat(b)), b) << h;
    }
  }
}

TEST(KvConvertTest, RowsConvertElementwise) {
  const std::vector<float> x = {1.0f, Bits(0x3f803000u), -65520.0f, Bits(0x33000000u)};
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16}) {
    std::vector<char> bytes(x.size() * KvDtypeBytes(dtype));
    FloatsToKv(dtype, x.data(), x.size(), bytes.data());
    std::vector<float> back(x.size());
    KvToFloats(dtype, bytes.data(), x.size(), back.data());
    for (size_t i = 0; i < x.size(); ++i) {
      uint16_t h = 0;
      if (dtype != KvDtype::kF32) std::memcpy(&h, bytes.data() + 2 * i, 2);
      switch (dtype) {
        case KvDtype::kF32:
          EXPECT_EQ(back[i], x[i]);
          break;
        case KvDtype::kF16:
          EXPECT_EQ(h, FloatToF16(x[i]));
          EXPECT_EQ(back[i], gguf::HalfToFloat(h));
          break;
        case KvDtype::kBF16:
          EXPECT_EQ(h, FloatToBf16(x[i]));
          EXPECT_EQ(back[i], Bf16ToFloat(h));
          break;
      }
    }
  }
}

// Rows of every length to 40 (vector bodies and tails), over bit patterns
// spread across all floats (NaNs, infinities, subnormals included): each
// F16 element equals FloatToF16 of its float, whichever path the CPU runs.
TEST(KvConvertTest, F16RowsEqualFloatToF16OnEveryElement) {
  std::vector<float> x;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 1000003) x.push_back(Bits(static_cast<uint32_t>(u)));
  x.push_back(Bits(0x7fbfe000u));  // a NaN with payload
  x.push_back(Bits(0x477ff000u));  // 65520: rounds up to infinity
  for (size_t n = 0; n <= 40; ++n) {
    std::vector<size_t> firsts = {x.size() - n};  // the last rows: the two above
    for (size_t first = 0; first + n <= x.size(); first += 97) firsts.push_back(first);
    for (size_t first : firsts) {
      std::vector<char> bytes(2 * n + 2, 0x55);
      FloatsToKv(KvDtype::kF16, x.data() + first, n, bytes.data() + 1);  // unaligned
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes.data() + 1 + 2 * i, 2);
        ASSERT_EQ(h, FloatToF16(x[first + i])) << "n " << n << " element " << first + i;
      }
      ASSERT_EQ(bytes[2 * n + 1], 0x55) << "wrote past the row, n " << n;
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t CvtssSh(float x) { return _cvtss_sh(x, 0); }
__attribute__((target("f16c"))) float CvtshSs(uint16_t h) { return _cvtsh_ss(h); }

TEST(KvConvertTest, F16EqualsCvtssShOnEveryFloat509Apart) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "this CPU has no F16C";
  uint64_t checked = 0;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 509) {
    const float x = Bits(static_cast<uint32_t>(u));
    ASSERT_EQ(FloatToF16(x), CvtssSh(x)) << std::hex << u;
    ++checked;
  }
  EXPECT_GT(checked, 8000000u);
}

TEST(KvConvertTest, HalfToFloatEqualsCvtshSsExceptSignallingNaNs) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "this CPU has no F16C";
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float want = CvtshSs(static_cast<uint16_t>(h));
    const float got = gguf::HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;  // F16C sets the quiet bit
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << h;
    }
  }
}
#endif

}  // namespace
}  // namespace tandem::kv
