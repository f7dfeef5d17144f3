// Vector loads of ggml's quantized blocks (internal to engine/model): the
// BlockLoads sources of weight_loads.h's contract for Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (layouts: quant_blocks.h), and
// WithWeightLoads, which picks the source of a matrix's type.
// Every lane is the scalar reference's operations (ggml's
// dequantize_row_*), so the tiles and ConvertToF32 give its bits.
#ifndef TANDEM_ENGINE_MODEL_QUANT_LOADS_H_
#define TANDEM_ENGINE_MODEL_QUANT_LOADS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "engine/gguf/gguf_file.h"
#include "engine/model/quant_blocks.h"
#include "engine/model/weight_loads.h"

namespace tandem::model::internal {

#ifdef TANDEM_WEIGHT_LOADS_X86
// A quantized type's rows: `Block(c, i)` is the block holding weight i of
// row o + c. A kind (below, one per type of quant_blocks.h) widens one
// block's weights, each lane the scalar reference's operations:
//   Kind::Prepare8(block)         the block's scales as floats (scalar).
//   Kind::Group8(block, e, ctx, out)  weights [e, e + 32) as 4 vectors of
//                                 8 (AVX2), e % 32 == 0, ctx = Prepare8.
//   Kind::Prepare(block)          the block's scales, widened once (AVX-512F).
//   Kind::Group16(block, e, ctx, out)  weights [e, e + kGroup) as
//                                 kGroup / 16 vectors (AVX-512F), e % kGroup
//                                 == 0, ctx = Prepare(block).
// Where a group's values are at most 32 affine levels of one scale (the
// 4- and 5-bit types), Group16 computes the 16 or 32 possible weights of a
// scale once (the reference's own operations on q = 0, 1, ...) and picks
// each lane's with a permute: the same values, fewer operations a weight.
template <typename Kind>
struct BlockLoads {
  const uint8_t* w;  // row o
  size_t row_bytes;
  size_t ahead;
  static constexpr size_t kGroup = Kind::kGroup, kBlock = Kind::kBlock;
  const uint8_t* Block(int c, size_t i) const {
    return w + static_cast<size_t>(c) * row_bytes + i / Kind::kBlock * Kind::kBytes;
  }
  float At(int c, size_t i) const {
    return DequantizeOne(Kind::kType, Block(c, i), i % Kind::kBlock);
  }
  // AVX2: the block's scales as floats (Kind::Prepare8), then weights
  // [i, i + 32) as 4 vectors of 8, i a multiple of 32.
  using Context8 = typename Kind::Context8;
  Context8 Prepare8(int c, size_t i) const { return Kind::Prepare8(Block(c, i)); }
  TANDEM_AVX2 void LoadGroup8(int c, size_t i, const Context8& ctx, __m256 (&out)[4]) const {
    const uint8_t* b = Block(c, i);
    const size_t e = i % Kind::kBlock;
    PrefetchAhead(b + Kind::kBytes * e / Kind::kBlock, ahead);
    Kind::Group8(b, e, ctx, out);
  }
  // The block of weight i's scales as the kind widens them (once a block
  // and column), for LoadGroup16 over that block.
  using Context = typename Kind::Context;
  TANDEM_AVX512 Context Prepare(int c, size_t i) const { return Kind::Prepare(Block(c, i)); }
  // Weights [i, i + kGroup), i a multiple of kGroup, with ctx =
  // Prepare(c, i): the same values as LoadGroup8 over them. Prefetches the part
  // of the block `ahead` bytes on that matches this group's place in it.
  TANDEM_AVX512 void LoadGroup16(int c, size_t i, const Context& ctx,
                                 __m512 (&out)[kGroup / 16]) const {
    const uint8_t* b = Block(c, i);
    const size_t e = i % Kind::kBlock;
    PrefetchAhead(b + Kind::kBytes * e / Kind::kBlock, ahead);
    Kind::Group16(b, e, ctx, out);
  }
};

// *p in every lane, read by a broadcast load (the load ports) rather than
// a shuffle (the asm keeps the compiler from forwarding a just-stored
// vector through vpermps, which would compete with the tables' picks).
TANDEM_AVX512 __m512 BroadcastLoad(const float* p) {
  __m512 v;
  asm("vbroadcastss %1, %0" : "=v"(v) : "m"(*p));
  return v;
}

// 0, 1, ..., 15 and 16, ..., 31 as floats: q for a table of weights.
TANDEM_AVX512 __m512 Iota16(float first) {
  return _mm512_add_ps(_mm512_set1_ps(first),
                       _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

// Lane l = table[idx[l] & 15] (vpermps reads the low 4 bits), or with a
// 32-entry table {lo, hi}, table[idx[l] & 31].
TANDEM_AVX512 __m512 Pick16(__m512i idx, __m512 table) {
  return _mm512_maskz_permutexvar_ps(0xffff, idx, table);  // maskz: see Bytes16
}
TANDEM_AVX512 __m512 Pick32(__m512i idx, __m512 lo, __m512 hi) {
  return _mm512_permutex2var_ps(lo, idx, hi);
}

// idx + 16 in the lanes of `bits` (a fifth quant bit).
TANDEM_AVX512 __m512i AddFifthBit(__m512i idx, __mmask16 bits) {
  return _mm512_mask_or_epi32(idx, bits, idx, _mm512_set1_epi32(16));
}

// Q8_0: float(q) * d.
struct Q8_0Kind {
  static constexpr gguf::TensorType kType = gguf::TensorType::kQ8_0;
  static constexpr size_t kBlock = 32, kBytes = 34, kGroup = 32;
  struct Context8 {
    float d;
  };
  static Context8 Prepare8(const uint8_t* b) { return {LoadF16(b)}; }
  TANDEM_AVX2 static void Group8(const uint8_t* b, size_t /*e*/, const Context8& ctx,
                                 __m256 (&out)[4]) {
    for (int k = 0; k < 4; ++k) {
      int64_t q8;
      std::memcpy(&q8, b + 2 + 8 * k, sizeof q8);
      const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(q8)));
      out[k] = _mm256_mul_ps(q, _mm256_set1_ps(ctx.d));
    }
  }
  using Context = __m512;  // d in every lane
  TANDEM_AVX512 static Context Prepare(const uint8_t* b) { return _mm512_set1_ps(F16Scale(b)); }
  TANDEM_AVX512 static void Group16(const uint8_t* b, size_t /*e*/, const Context& d,
                                    __m512 (&out)[2]) {
    for (int k = 0; k < 2; ++k) {
      const __m128i q8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * k));
      const __m512 q = _mm512_maskz_cvtepi32_ps(0xffff, _mm512_maskz_cvtepi8_epi32(0xffff, q8));
      out[k] = _mm512_mul_ps(q, d);
    }
  }
};

// Q4_0 / Q4_1 / Q5_0 / Q5_1: weight e's nibble is qs[e mod 16]'s low
// (e < 16) or high half; Q5's fifth bit is bit e of qh. q is offset by
// -8 / -16 (kOffset, the _0 types) and the weight is float(q) * d, or
// float(q) * d + m (kHasMin, the _1 types).
template <gguf::TensorType kT, size_t kBytesPerBlock, bool kHasMin, bool kHasQh, int kOffset>
struct LegacyKind {
  static constexpr gguf::TensorType kType = kT;
  static constexpr size_t kBlock = 32, kBytes = kBytesPerBlock, kGroup = 32;
  static constexpr size_t kQh = kHasMin ? 4 : 2;         // qh offset (Q5)
  static constexpr size_t kQs = kQh + (kHasQh ? 4 : 0);  // qs offset
  static uint32_t Qh(const uint8_t* b) {
    uint32_t v = 0;
    if constexpr (kHasQh) std::memcpy(&v, b + kQh, sizeof v);
    return v;
  }
  struct Context8 {
    float d, m;
  };
  static Context8 Prepare8(const uint8_t* b) {
    return {LoadF16(b), kHasMin ? LoadF16(b + 2) : 0.0f};
  }
  // The block's 32 weights: 8 at a time, weight e from nibble e mod 16.
  TANDEM_AVX2 static void Group8(const uint8_t* b, size_t /*e*/, const Context8& ctx,
                                 __m256 (&out)[4]) {
    const uint32_t qh = Qh(b);
    for (int k = 0; k < 4; ++k) {
      __m256i q = Nibbles8(b + kQs + 8 * (k % 2), k >= 2);
      if constexpr (kHasQh) q = _mm256_or_si256(q, HighBits8(qh, 8 * k));
      if constexpr (kOffset != 0) q = _mm256_sub_epi32(q, _mm256_set1_epi32(kOffset));
      out[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(ctx.d));
      if constexpr (kHasMin) out[k] = _mm256_add_ps(out[k], _mm256_set1_ps(ctx.m));
    }
  }
  // The block's weight for q = first, first + 1, ... (16 of them).
  TANDEM_AVX512 static __m512 Table(const uint8_t* b, float first) {
    const __m512 y = _mm512_mul_ps(Iota16(first - kOffset), _mm512_set1_ps(F16Scale(b)));
    if constexpr (kHasMin) return _mm512_add_ps(y, _mm512_set1_ps(F16Scale(b + 2)));
    return y;
  }
  // The block's weights for q = 0..15 and (Q5) 16..31.
  struct Context {
    __m512 lo, hi;
  };
  TANDEM_AVX512 static Context Prepare(const uint8_t* b) {
    Context t{Table(b, 0), _mm512_setzero_ps()};
    if constexpr (kHasQh) t.hi = Table(b, 16);
    return t;
  }
  // One block: the low nibbles (weights 0..15), then the high ones.
  TANDEM_AVX512 static void Group16(const uint8_t* b, size_t /*e*/, const Context& t,
                                    __m512 (&out)[2]) {
    const __m512i bytes = Bytes16(b + kQs);
    const __m512i nibbles[2] = {bytes, _mm512_maskz_srli_epi32(0xffff, bytes, 4)};
    if constexpr (kHasQh) {
      const uint32_t qh = Qh(b);
      for (int k = 0; k < 2; ++k) {
        const __m512i q = _mm512_and_si512(nibbles[k], _mm512_set1_epi32(0xF));
        out[k] = Pick32(AddFifthBit(q, static_cast<__mmask16>(qh >> (16 * k))), t.lo, t.hi);
      }
    } else {
      for (int k = 0; k < 2; ++k) out[k] = Pick16(nibbles[k], t.lo);
    }
  }
};
using Q4_0Kind = LegacyKind<gguf::TensorType::kQ4_0, 18, false, false, 8>;
using Q4_1Kind = LegacyKind<gguf::TensorType::kQ4_1, 20, true, false, 0>;
using Q5_0Kind = LegacyKind<gguf::TensorType::kQ5_0, 22, false, true, 16>;
using Q5_1Kind = LegacyKind<gguf::TensorType::kQ5_1, 24, true, true, 0>;

// Q4_K / Q5_K: weight e of sub-block s = e / 32 is (d * sc[s]) * q -
// dmin * m[s], q the nibble of qs[32 (e / 64) + e mod 32] (high for odd s)
// plus, for Q5_K, 16 * bit s of qh[e mod 32].
template <gguf::TensorType kT, bool kFiveBit>
struct KQuant45Kind {
  static constexpr gguf::TensorType kType = kT;
  static constexpr size_t kBlock = 256, kBytes = kFiveBit ? 176 : 144;
  static constexpr size_t kQs = kFiveBit ? 48 : 16;
  // v[s] = d1 = d * sc[s] of sub-block s, v[8 + s] = m1 = dmin * m[s].
  struct Context8 {
    float v[16];
  };
  static Context8 Prepare8(const uint8_t* b) {
    uint32_t words[4];
    ScaleMinWordsK4(b + 4, words);
    uint8_t scale_min[16];
    std::memcpy(scale_min, words, sizeof scale_min);
    const float d = LoadF16(b), dmin = LoadF16(b + 2);
    Context8 ctx;
    for (int j = 0; j < 16; ++j) ctx.v[j] = (j < 8 ? d : dmin) * static_cast<float>(scale_min[j]);
    return ctx;
  }
  // Sub-block s = e / 32: (d1 * q) - m1, 8 weights at a time.
  TANDEM_AVX2 static void Group8(const uint8_t* b, size_t e, const Context8& ctx,
                                 __m256 (&out)[4]) {
    const int s = static_cast<int>(e / 32);
    const __m256 d1 = _mm256_set1_ps(ctx.v[s]), m1 = _mm256_set1_ps(ctx.v[8 + s]);
    const uint8_t* qs = b + kQs + 32 * (e / 64);
    for (int k = 0; k < 4; ++k) {
      __m256i q = Nibbles8(qs + 8 * k, (s & 1) != 0);
      if constexpr (kFiveBit) q = _mm256_or_si256(q, Field8(b + 16 + 8 * k, s, 1, 4));
      out[k] = _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(q)), m1);
    }
  }
  // As Context8, aligned: each value is broadcast by a load (BroadcastLoad)
  // rather than a shuffle.
  struct Context {
    alignas(64) float v[16];
  };
  TANDEM_AVX512 static Context Prepare(const uint8_t* b) {
    // The scales and mins as 16 bytes, built in registers (a vector load
    // of just-stored bytes would stall on store forwarding).
    uint32_t words[4];
    ScaleMinWordsK4(b + 4, words);
    const __m128i v = _mm_setr_epi32(static_cast<int>(words[0]), static_cast<int>(words[1]),
                                     static_cast<int>(words[2]), static_cast<int>(words[3]));
    const __m512 f = _mm512_maskz_cvtepi32_ps(0xffff, _mm512_maskz_cvtepu8_epi32(0xffff, v));
    const __m512 dd =
        _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(F16Scale(b)), _mm512_set1_ps(F16Scale(b + 2)));
    Context ctx;
    _mm512_store_ps(ctx.v, _mm512_mul_ps(dd, f));
    return ctx;
  }
  // One 64-weight chunk: its 32 qs bytes hold sub-block s0 = e / 32 in the
  // low nibbles and s0 + 1 in the high ones; each sub-block's table is
  // d1 * q - m1 for q = 0..15 (Q5_K: 0..31).
  static constexpr size_t kGroup = 64;
  TANDEM_AVX512 static void Group16(const uint8_t* b, size_t e, const Context& scales,
                                    __m512 (&out)[4]) {
    const int s0 = static_cast<int>(e / 32);
    const uint8_t* qs = b + kQs + 32 * (e / 64);
    const __m512i bytes[2] = {Bytes16(qs), Bytes16(qs + 16)};
    __m512i qh[2];
    if constexpr (kFiveBit) qh[0] = Bytes16(b + 16), qh[1] = Bytes16(b + 32);
    for (int half = 0; half < 2; ++half) {  // sub-block s0 + half
      const int s = s0 + half;
      const __m512 vd1 = BroadcastLoad(&scales.v[s]);
      const __m512 vm1 = BroadcastLoad(&scales.v[8 + s]);
      const __m512 lo = _mm512_sub_ps(_mm512_mul_ps(vd1, Iota16(0)), vm1);
      __m512 hi = lo;
      if constexpr (kFiveBit) hi = _mm512_sub_ps(_mm512_mul_ps(vd1, Iota16(16)), vm1);
      for (int k = 0; k < 2; ++k) {
        const __m512i nibble = half == 0 ? bytes[k] : _mm512_maskz_srli_epi32(0xffff, bytes[k], 4);
        if constexpr (kFiveBit) {
          const __mmask16 bit = _mm512_test_epi32_mask(qh[k], _mm512_set1_epi32(1 << s));
          const __m512i q = _mm512_and_si512(nibble, _mm512_set1_epi32(0xF));
          out[2 * half + k] = Pick32(AddFifthBit(q, bit), lo, hi);
        } else {
          out[2 * half + k] = Pick16(nibble, lo);
        }
      }
    }
  }
};
using Q4_KKind = KQuant45Kind<gguf::TensorType::kQ4_K, false>;
using Q5_KKind = KQuant45Kind<gguf::TensorType::kQ5_K, true>;

// Q6_K: weight 128h + 32g + l is (d * scales[8h + 2g + l / 16]) * (q - 32),
// q = ((ql[64h + l + 32 (g & 1)] >> 4 (g >> 1)) & 0xF)
//     | ((qh[32h + l] >> 2g) & 3) << 4.
struct Q6_KKind {
  static constexpr gguf::TensorType kType = gguf::TensorType::kQ6_K;
  static constexpr size_t kBlock = 256, kBytes = 210;
  // v[k] = d * scales[k].
  struct Context8 {
    float v[16];
  };
  static Context8 Prepare8(const uint8_t* b) {
    Context8 ctx;
    const float d = LoadF16(b + 208);
    for (int k = 0; k < 16; ++k) ctx.v[k] = d * static_cast<float>(static_cast<int8_t>(b[192 + k]));
    return ctx;
  }
  // Group g of half h: weights 32g + 8k + j of the half, k < 4.
  TANDEM_AVX2 static void Group8(const uint8_t* b, size_t e, const Context8& ctx,
                                 __m256 (&out)[4]) {
    const size_t h = e / 128, g = (e % 128) / 32;
    const uint8_t* ql = b + 64 * h + 32 * (g & 1);
    const uint8_t* qh = b + 128 + 32 * h;
    const int ql_shift = static_cast<int>(4 * (g >> 1)), qh_shift = static_cast<int>(2 * g);
    for (int k = 0; k < 4; ++k) {
      const __m256i q =
          _mm256_or_si256(Field8(ql + 8 * k, ql_shift, 0xF, 0), Field8(qh + 8 * k, qh_shift, 3, 4));
      const __m256 qf = _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(32)));
      out[k] = _mm256_mul_ps(_mm256_set1_ps(ctx.v[8 * h + 2 * g + k / 2]), qf);
    }
  }
  // v[k] = d * scales[k] for the 16 scales (in memory: see KQuant45Kind).
  struct Context {
    alignas(64) float v[16];
  };
  TANDEM_AVX512 static Context Prepare(const uint8_t* b) {
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    const __m512 f = _mm512_maskz_cvtepi32_ps(0xffff, _mm512_maskz_cvtepi8_epi32(0xffff, sc));
    Context ctx;
    _mm512_store_ps(ctx.v, _mm512_mul_ps(_mm512_set1_ps(F16Scale(b + 208)), f));
    return ctx;
  }
  // Group g of half h (32 weights, scales 8h + 2g and 8h + 2g + 1): the 32
  // q - 32 built as bytes, then widened 16 at a time.
  static constexpr size_t kGroup = 32;
  TANDEM_AVX512 static void Group16(const uint8_t* b, size_t e, const Context& ds,
                                    __m512 (&out)[2]) {
    const size_t h = e / 128, g = (e % 128) / 32;
    const __m256i ql =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (g & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    // 16-bit shifts, masked per byte afterwards: no bit crosses a byte.
    const __m256i nibble = _mm256_and_si256(
        _mm256_srl_epi16(ql, _mm_cvtsi32_si128(static_cast<int>(4 * (g >> 1)))), low4);
    const __m256i two = _mm256_and_si256(
        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(static_cast<int>(2 * g))), _mm256_set1_epi8(3));
    const __m256i q =
        _mm256_sub_epi8(_mm256_or_si256(nibble, _mm256_slli_epi16(two, 4)), _mm256_set1_epi8(32));
    const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
    for (int k = 0; k < 2; ++k) {
      const __m512 qf =
          _mm512_maskz_cvtepi32_ps(0xffff, _mm512_maskz_cvtepi8_epi32(0xffff, halves[k]));
      const int scale = static_cast<int>(8 * h + 2 * g) + k;
      out[k] = _mm512_mul_ps(BroadcastLoad(&ds.v[scale]), qf);
    }
  }
};

// Calls f(BlockLoads<Kind>{...}) for the quantized `type` (or
// f(F16Loads{...}) for F16) and returns true; false for F32 / BF16, which
// have no fused source.
template <typename F>
bool WithWeightLoads(gguf::TensorType type, const uint8_t* w, size_t row_bytes, size_t ahead,
                     F&& f) {
  switch (type) {
    case gguf::TensorType::kF16:
      f(F16Loads{w, row_bytes, ahead});
      return true;
    case gguf::TensorType::kQ8_0:
      f(BlockLoads<Q8_0Kind>{w, row_bytes, ahead});
      return true;
    case gguf::TensorType::kQ4_0:
      f(BlockLoads<Q4_0Kind>{w, row_bytes, ahead});
      return true;
    case gguf::TensorType::kQ4_1:
      f(BlockLoads<Q4_1Kind>{w, row_bytes, ahead});
      return true;
    case gguf::TensorType::kQ5_0:
      f(BlockLoads<Q5_0Kind>{w, row_bytes, ahead});
      return true;
    case gguf::TensorType::kQ5_1:
      f(BlockLoads<Q5_1Kind>{w, row_bytes, ahead});
      return true;
    case gguf::TensorType::kQ4_K:
      f(BlockLoads<Q4_KKind>{w, row_bytes, ahead});
      return true;
    case gguf::TensorType::kQ5_K:
      f(BlockLoads<Q5_KKind>{w, row_bytes, ahead});
      return true;
    case gguf::TensorType::kQ6_K:
      f(BlockLoads<Q6_KKind>{w, row_bytes, ahead});
      return true;
    default:
      return false;
  }
}
#endif  // TANDEM_WEIGHT_LOADS_X86

}  // namespace tandem::model::internal

#endif  // TANDEM_ENGINE_MODEL_QUANT_LOADS_H_
