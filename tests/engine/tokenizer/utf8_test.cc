// tokenizer::FindInvalidUtf8 / WellFormedUtf8Length against a reference
// written from RFC 3629's definition (decode the code point from the lead
// byte's length bits, then refuse overlong forms, surrogates and anything
// above U+10FFFF), over every string of up to three bytes, every code
// point, and the boundary cases by hand.
#include "engine/tokenizer/utf8.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::tokenizer {
namespace {

// RFC 3629 section 3: the UTF-8 bytes of code point `cp` (any value below
// 2^21, surrogates included: the encoder does not judge).
std::string Encode(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

// Reference: the length of the well-formed sequence at bytes[i], or 0.
// Decodes by the generic bit pattern and then applies RFC 3629's limits.
size_t ReferenceLength(const std::string& bytes, size_t i) {
  const uint8_t lead = static_cast<uint8_t>(bytes[i]);
  size_t len;
  uint32_t cp;
  if ((lead & 0x80) == 0) return 1;
  if ((lead & 0xE0) == 0xC0) {
    len = 2;
    cp = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    len = 3;
    cp = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    len = 4;
    cp = lead & 0x07;
  } else {
    return 0;  // continuation byte or 0xF8..0xFF
  }
  if (i + len > bytes.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const uint8_t c = static_cast<uint8_t>(bytes[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len]) return 0;                // overlong
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;  // surrogate
  if (cp > 0x10FFFF) return 0;                 // beyond Unicode
  return len;
}

std::optional<size_t> ReferenceFirstError(const std::string& bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const size_t len = ReferenceLength(bytes, i);
    if (len == 0) return i;
    i += len;
  }
  return std::nullopt;
}

// Whether FindInvalidUtf8 agrees with the reference on `bytes` (a failure
// naming the bytes otherwise).
bool MatchesReference(const std::string& bytes) {
  const std::optional<size_t> want = ReferenceFirstError(bytes);
  const std::optional<Utf8Error> got = FindInvalidUtf8(bytes);
  const bool same = got.has_value() == want.has_value() &&
                    (!want.has_value() ||
                     (got->offset == *want && got->byte == static_cast<uint8_t>(bytes[*want])));
  if (!same) {
    ADD_FAILURE() << testing::PrintToString(bytes) << ": reference "
                  << (want.has_value() ? std::to_string(*want) : "valid") << ", got "
                  << (got.has_value() ? std::to_string(got->offset) : "valid");
  }
  return same;
}

TEST(Utf8Test, EveryStringOfUpToThreeBytesMatchesTheReference) {
  ASSERT_TRUE(MatchesReference(""));
  std::string s;
  for (int a = 0; a < 256; ++a) {
    s.assign(1, static_cast<char>(a));
    ASSERT_TRUE(MatchesReference(s));
    for (int b = 0; b < 256; ++b) {
      s.assign({static_cast<char>(a), static_cast<char>(b)});
      ASSERT_TRUE(MatchesReference(s));
      for (int c = 0; c < 256; ++c) {
        s.assign({static_cast<char>(a), static_cast<char>(b), static_cast<char>(c)});
        ASSERT_TRUE(MatchesReference(s));
      }
    }
  }
}

TEST(Utf8Test, FourByteLeadsWithEdgeContinuationsMatchTheReference) {
  // Every lead 0xF0..0xFF against the byte values where the ranges of
  // Table 3-7 change.
  const std::vector<uint8_t> edges = {0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF};
  for (int lead = 0xF0; lead <= 0xFF; ++lead) {
    for (uint8_t b : edges) {
      for (uint8_t c : edges) {
        for (uint8_t d : edges) {
          const std::string s = {static_cast<char>(lead), static_cast<char>(b),
                                 static_cast<char>(c), static_cast<char>(d)};
          ASSERT_TRUE(MatchesReference(s));
        }
      }
    }
  }
}

TEST(Utf8Test, EveryCodePointIsWellFormedExceptSurrogates) {
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    const std::string bytes = Encode(cp);
    const std::optional<Utf8Error> error = FindInvalidUtf8(bytes);
    if (cp >= 0xD800 && cp <= 0xDFFF) {
      ASSERT_TRUE(error.has_value()) << std::hex << cp;
      ASSERT_EQ(error->offset, 0u);
      ASSERT_EQ(error->byte, 0xED);
    } else {
      ASSERT_FALSE(error.has_value()) << std::hex << cp;
      ASSERT_EQ(WellFormedUtf8Length(bytes, 0), bytes.size()) << std::hex << cp;
    }
  }
}

TEST(Utf8Test, BoundaryCodePoints) {
  struct Case {
    const char* bytes;
    bool valid;
  };
  const Case cases[] = {
      {"\x7F", true},               // U+007F
      {"\xC2\x80", true},           // U+0080
      {"\xDF\xBF", true},           // U+07FF
      {"\xE0\xA0\x80", true},       // U+0800
      {"\xED\x9F\xBF", true},       // U+D7FF
      {"\xED\xA0\x80", false},      // U+D800, first surrogate
      {"\xED\xBF\xBF", false},      // U+DFFF, last surrogate
      {"\xEE\x80\x80", true},       // U+E000
      {"\xEF\xBF\xBF", true},       // U+FFFF
      {"\xF0\x90\x80\x80", true},   // U+10000
      {"\xF4\x8F\xBF\xBF", true},   // U+10FFFF
      {"\xF4\x90\x80\x80", false},  // U+110000
      {"\xC0\x80", false},          // U+0000 overlong
      {"\xC1\xBF", false},          // U+007F overlong
      {"\xE0\x9F\xBF", false},      // U+07FF overlong
      {"\xF0\x8F\xBF\xBF", false},  // U+FFFF overlong
  };
  for (const Case& c : cases) {
    const std::string bytes = c.bytes;
    const std::optional<Utf8Error> error = FindInvalidUtf8(bytes);
    EXPECT_EQ(!error.has_value(), c.valid) << testing::PrintToString(bytes);
    if (error.has_value()) {
      EXPECT_EQ(error->offset, 0u);
      EXPECT_EQ(error->byte, static_cast<uint8_t>(bytes[0]));
    }
  }
  EXPECT_EQ(Encode(0x7F), "\x7F");
  EXPECT_EQ(Encode(0x10FFFF), "\xF4\x8F\xBF\xBF");
}

TEST(Utf8Test, EveryTwoByteLead) {
  // C0 and C1 only start overlong forms; C2..DF take one continuation.
  for (int lead = 0xC0; lead <= 0xDF; ++lead) {
    const std::string s = {static_cast<char>(lead), '\x80'};
    EXPECT_EQ(WellFormedUtf8Length(s, 0), lead >= 0xC2 ? 2u : 0u) << std::hex << lead;
    const std::string alone(1, static_cast<char>(lead));
    EXPECT_EQ(WellFormedUtf8Length(alone, 0), 0u) << std::hex << lead;
  }
}

TEST(Utf8Test, TruncatedSequencesFailAtTheirLead) {
  for (const std::string full : {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x9A\x80"}) {
    for (size_t keep = 1; keep < full.size(); ++keep) {
      const std::string s = "ab" + full.substr(0, keep);
      const std::optional<Utf8Error> error = FindInvalidUtf8(s);
      ASSERT_TRUE(error.has_value()) << testing::PrintToString(s);
      EXPECT_EQ(error->offset, 2u);
      EXPECT_EQ(error->byte, static_cast<uint8_t>(full[0]));
      // Followed by ASCII, the cut is still there.
      EXPECT_EQ(FindInvalidUtf8(s + "cd")->offset, 2u);
    }
  }
}

TEST(Utf8Test, OffsetsPastLongAsciiRuns) {
  // The ASCII fast path reads eight bytes at a time: a bad byte at every
  // position of a 40-byte text, and a stray continuation after a 2-byte
  // character.
  for (size_t pos = 0; pos < 40; ++pos) {
    std::string s(40, 'a');
    s[pos] = '\xFF';
    const std::optional<Utf8Error> error = FindInvalidUtf8(s);
    ASSERT_TRUE(error.has_value());
    EXPECT_EQ(error->offset, pos);
    EXPECT_EQ(error->byte, 0xFF);
  }
  const std::string s = std::string(17, 'x') + "\xC3\xA9" + std::string(9, 'y') + "\x80";
  EXPECT_EQ(FindInvalidUtf8(s)->offset, 28u);
  EXPECT_EQ(FindInvalidUtf8(s)->byte, 0x80);
  EXPECT_FALSE(FindInvalidUtf8(std::string(1000, 'z') + "\xE2\x82\xAC").has_value());
}

}  // namespace
}  // namespace tandem::tokenizer
