// See unicode.h. The byte map follows GPT-2's bytes_to_unicode, as
// llama.cpp's unicode.cpp builds it.
#include "engine/tokenizer/unicode.h"

#include <array>
#include <cstdio>

namespace tandem::tokenizer::internal {
namespace {

void AppendUtf8(uint32_t cpt, std::string* out) {
  if (cpt < 0x80) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {  // the map only needs code points below U+0200
    out->push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

bool StandsForItself(int byte) {
  return (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

struct ByteMap {
  std::array<std::string, 256> to_unicode;  // byte -> UTF-8 of its stand-in
  std::array<int16_t, 0x200> to_byte;       // stand-in code point -> byte, -1
};

const ByteMap& Map() {
  static const ByteMap* const map = [] {
    auto* m = new ByteMap();
    m->to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cpt = StandsForItself(b) ? b : 256 + next++;
      AppendUtf8(cpt, &m->to_unicode[b]);
      m->to_byte[cpt] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return *map;
}

// Decodes the code point at text[*pos] and advances *pos; -1 (advancing one
// byte) when the sequence is malformed or cut short.
int32_t NextCodePoint(std::string_view text, size_t* pos) {
  const auto at = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = at(*pos);
  const size_t len = Utf8Len(lead);
  if (len == 1) {
    ++*pos;
    return lead < 0x80 ? lead : -1;
  }
  if (*pos + len > text.size()) {
    ++*pos;
    return -1;
  }
  uint32_t cpt = lead & (0x7F >> len);
  for (size_t i = 1; i < len; ++i) {
    if ((at(*pos + i) & 0xC0) != 0x80) {
      ++*pos;
      return -1;
    }
    cpt = (cpt << 6) | (at(*pos + i) & 0x3F);
  }
  *pos += len;
  return static_cast<int32_t>(cpt);
}

}  // namespace

size_t Utf8Len(uint8_t lead) {
  static constexpr size_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

std::string_view ByteToUnicode(uint8_t byte) { return Map().to_unicode[byte]; }

void AppendByteEncoded(std::string_view bytes, std::string* out) {
  const ByteMap& m = Map();
  for (char c : bytes) out->append(m.to_unicode[static_cast<uint8_t>(c)]);
}

std::string DecodeByteLevel(std::string_view text) {
  const ByteMap& m = Map();
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    const int32_t cpt = NextCodePoint(text, &pos);
    if (cpt >= 0 && cpt < static_cast<int32_t>(m.to_byte.size()) && m.to_byte[cpt] >= 0) {
      out.push_back(static_cast<char>(m.to_byte[cpt]));
      continue;
    }
    out += "[UNK_BYTE_0x";
    for (size_t i = start; i < pos; ++i) {
      char hex[3];
      std::snprintf(hex, sizeof(hex), "%02x", static_cast<uint8_t>(text[i]));
      out += hex;
    }
    out.append(text.data(), text.size());
    out += "]";
  }
  return out;
}

}  // namespace tandem::tokenizer::internal
