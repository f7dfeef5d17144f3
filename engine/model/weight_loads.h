// Vector loads of weight rows in their storage type (internal to
// engine/model): the sources MatMul's micro-kernels read (cpu_kernels.cc)
// and ConvertToF32's AVX2 / AVX-512 paths (weight_matrix.cc).
//
// A source covers the rows o, o + 1, ... of one matrix starting at `w`
// (row o); column c of a tile is row o + c. Every source yields exactly
// the matrix's F32 values (weight_matrix.h, quant_blocks.h): a vector
// lane is the same rounded operations as the scalar reference, so a
// tile's bits never depend on which source feeds it.
//   At(c, i)      weight i of row o + c, scalar (tails).
//   Load8(c, i)   weights [i, i + 8) (AVX2), i a multiple of 8.
//   Load16(c, i)  weights [i, i + 16) (AVX-512F), i a multiple of 16.
// Every vector load also prefetches `ahead` bytes further (PrefetchAhead).
#ifndef TANDEM_ENGINE_MODEL_WEIGHT_LOADS_H_
#define TANDEM_ENGINE_MODEL_WEIGHT_LOADS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "engine/gguf/gguf_file.h"
#include "engine/model/quant_blocks.h"
#include "engine/model/weight_matrix.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_WEIGHT_LOADS_X86 1
#endif

namespace tandem::model::internal {

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

#ifdef TANDEM_WEIGHT_LOADS_X86
#define TANDEM_AVX2 __attribute__((target("avx2,fma,f16c"), always_inline)) inline
#define TANDEM_AVX512 __attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) inline

// At decode's single row a tile is too short for the hardware prefetcher
// to run ahead of it, so each load asks for the bytes one column block on,
// where the next tile will read; 0 for a panel (already in L1). Prefetches
// never fault, so the last block's run past the matrix is harmless.
TANDEM_AVX2 void PrefetchAhead(const void* p, size_t ahead) {
  _mm_prefetch(static_cast<const char*>(p) + ahead, _MM_HINT_T0);
}

TANDEM_AVX2 float F16Scale(const uint8_t* p) { return _cvtsh_ss(LoadU16(p)); }

// The 8 (16) bytes at p widened to unsigned 32-bit lanes.
TANDEM_AVX2 __m256i Bytes8(const uint8_t* p) {
  int64_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v));
}
// maskz forms with a full mask are the plain instructions (GCC 12's
// unmasked 512-bit widening intrinsics warn: -Wmaybe-uninitialized on their
// undefined pass-through operand).
TANDEM_AVX512 __m512i Bytes16(const uint8_t* p) {
  return _mm512_maskz_cvtepu8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Low (high = false) or high nibbles of the 8 (16) bytes at p.
TANDEM_AVX2 __m256i Nibbles8(const uint8_t* p, bool high) {
  const __m256i b = Bytes8(p);
  return high ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(0xF));
}
TANDEM_AVX512 __m512i Nibbles16(const uint8_t* p, bool high) {
  const __m512i b = Bytes16(p);
  return high ? _mm512_maskz_srli_epi32(0xffff, b, 4) : _mm512_and_si512(b, _mm512_set1_epi32(0xF));
}

// ((bits >> (shift + lane)) & 1) << 4 for lanes 0..7 (0..15): a Q5 high bit.
TANDEM_AVX2 __m256i HighBits8(uint32_t bits, int shift) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i s = _mm256_add_epi32(lane, _mm256_set1_epi32(shift));
  const __m256i b = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(bits)), s);
  return _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(1)), 4);
}
TANDEM_AVX512 __m512i HighBits16(uint32_t bits, int shift) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i s = _mm512_add_epi32(lane, _mm512_set1_epi32(shift));
  const __m512i b = _mm512_maskz_srlv_epi32(0xffff, _mm512_set1_epi32(static_cast<int>(bits)), s);
  return _mm512_maskz_slli_epi32(0xffff, _mm512_and_si512(b, _mm512_set1_epi32(1)), 4);
}

// ((bytes[l] >> shift) & mask) << up, per lane, of the 8 (16) bytes at p.
TANDEM_AVX2 __m256i Field8(const uint8_t* p, int shift, int mask, int up) {
  const __m256i v = _mm256_srl_epi32(Bytes8(p), _mm_cvtsi32_si128(shift));
  return _mm256_sll_epi32(_mm256_and_si256(v, _mm256_set1_epi32(mask)), _mm_cvtsi32_si128(up));
}
TANDEM_AVX512 __m512i Field16(const uint8_t* p, int shift, int mask, int up) {
  const __m512i v = _mm512_maskz_srl_epi32(0xffff, Bytes16(p), _mm_cvtsi32_si128(shift));
  return _mm512_maskz_sll_epi32(0xffff, _mm512_and_si512(v, _mm512_set1_epi32(mask)), _mm_cvtsi32_si128(up));
}

// F32 rows: plain loads; with kPrefetch (decode's few rows) each also
// prefetches the next column block. Without it (many rows, or a panel in
// L1) the tile keeps every address in a register.
template <bool kPrefetch>
struct F32Loads {
  const float* w;  // row o
  size_t in;
  size_t ahead;
  float At(int c, size_t i) const { return w[static_cast<size_t>(c) * in + i]; }
  TANDEM_AVX2 __m256 Load8(int c, size_t i) const {
    const float* p = w + static_cast<size_t>(c) * in + i;
    if constexpr (kPrefetch) PrefetchAhead(p, ahead);
    return _mm256_loadu_ps(p);
  }
  TANDEM_AVX512 __m512 Load16(int c, size_t i) const {
    const float* p = w + static_cast<size_t>(c) * in + i;
    if constexpr (kPrefetch) PrefetchAhead(p, ahead);
    return _mm512_loadu_ps(p);
  }
};

// F16: widened by F16C / AVX-512F's vcvtph2ps (exact).
struct F16Loads {
  const uint8_t* w;  // row o
  size_t row_bytes;
  size_t ahead;
  const uint8_t* P(int c, size_t i) const {
    return w + static_cast<size_t>(c) * row_bytes + 2 * i;
  }
  float At(int c, size_t i) const { return HalfToFloat(LoadU16(P(c, i))); }
  TANDEM_AVX2 __m256 Load8(int c, size_t i) const {
    PrefetchAhead(P(c, i), ahead);
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(P(c, i))));
  }
  TANDEM_AVX512 __m512 Load16(int c, size_t i) const {
    PrefetchAhead(P(c, i), ahead);
    return _mm512_maskz_cvtph_ps(
        0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(P(c, i))));
  }
};

// A quantized type's rows: `Block(c, i)` is the block holding weight i of
// row o + c; `Kind::Load8/16(block, e)` widen weights [e, e + 8/16) of one
// block (e = i mod block size). The kinds below are the types of
// quant_blocks.h, each lane the scalar reference's operations.
template <typename Kind>
struct BlockLoads {
  const uint8_t* w;  // row o
  size_t row_bytes;
  size_t ahead;
  const uint8_t* Block(int c, size_t i) const {
    return w + static_cast<size_t>(c) * row_bytes + i / Kind::kBlock * Kind::kBytes;
  }
  float At(int c, size_t i) const { return DequantizeOne(Kind::kType, Block(c, i), i % Kind::kBlock); }
  TANDEM_AVX2 __m256 Load8(int c, size_t i) const {
    const uint8_t* b = Block(c, i);
    PrefetchAhead(b, ahead);
    return Kind::Load8(b, i % Kind::kBlock);
  }
  TANDEM_AVX512 __m512 Load16(int c, size_t i) const {
    const uint8_t* b = Block(c, i);
    PrefetchAhead(b, ahead);
    return Kind::Load16(b, i % Kind::kBlock);
  }
};

// Q8_0: float(q) * d.
struct Q8_0Kind {
  static constexpr gguf::TensorType kType = gguf::TensorType::kQ8_0;
  static constexpr size_t kBlock = 32, kBytes = 34;
  TANDEM_AVX2 static __m256 Load8(const uint8_t* b, size_t e) {
    int64_t q8;
    std::memcpy(&q8, b + 2 + e, sizeof q8);
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(q8)));
    return _mm256_mul_ps(q, _mm256_set1_ps(F16Scale(b)));
  }
  TANDEM_AVX512 static __m512 Load16(const uint8_t* b, size_t e) {
    const __m128i q8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + e));
    const __m512 q = _mm512_maskz_cvtepi32_ps(0xffff, _mm512_maskz_cvtepi8_epi32(0xffff, q8));
    return _mm512_mul_ps(q, _mm512_set1_ps(F16Scale(b)));
  }
};

// Q4_0 / Q4_1 / Q5_0 / Q5_1: weight e's nibble is qs[e mod 16]'s low
// (e < 16) or high half; Q5's fifth bit is bit e of qh. q is offset by
// -8 / -16 (kOffset, the _0 types) and the weight is q * d, or q * d + m
// (kHasMin, the _1 types).
template <gguf::TensorType kT, size_t kBytesPerBlock, bool kHasMin, bool kHasQh, int kOffset>
struct LegacyKind {
  static constexpr gguf::TensorType kType = kT;
  static constexpr size_t kBlock = 32, kBytes = kBytesPerBlock;
  static constexpr size_t kQh = kHasMin ? 4 : 2;           // qh offset (Q5)
  static constexpr size_t kQs = kQh + (kHasQh ? 4 : 0);    // qs offset
  static uint32_t Qh(const uint8_t* b) {
    uint32_t v = 0;
    if constexpr (kHasQh) std::memcpy(&v, b + kQh, sizeof v);
    return v;
  }
  TANDEM_AVX2 static __m256 Load8(const uint8_t* b, size_t e) {
    __m256i q = Nibbles8(b + kQs + e % 16, e >= 16);
    if constexpr (kHasQh) q = _mm256_or_si256(q, HighBits8(Qh(b), static_cast<int>(e)));
    if constexpr (kOffset != 0) q = _mm256_sub_epi32(q, _mm256_set1_epi32(kOffset));
    const __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(F16Scale(b)));
    if constexpr (kHasMin) return _mm256_add_ps(y, _mm256_set1_ps(F16Scale(b + 2)));
    return y;
  }
  TANDEM_AVX512 static __m512 Load16(const uint8_t* b, size_t e) {
    __m512i q = Nibbles16(b + kQs + e % 16, e >= 16);
    if constexpr (kHasQh) q = _mm512_or_si512(q, HighBits16(Qh(b), static_cast<int>(e)));
    if constexpr (kOffset != 0) q = _mm512_sub_epi32(q, _mm512_set1_epi32(kOffset));
    const __m512 y =
        _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xffff, q), _mm512_set1_ps(F16Scale(b)));
    if constexpr (kHasMin) return _mm512_add_ps(y, _mm512_set1_ps(F16Scale(b + 2)));
    return y;
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
  // Sub-block s's d1 = d * sc and m1 = dmin * m.
  static void Scales(const uint8_t* b, int s, float d, float dmin, float* d1, float* m1) {
    uint8_t sc, m;
    ScaleMinK4(s, b + 4, &sc, &m);
    *d1 = d * static_cast<float>(sc);
    *m1 = dmin * static_cast<float>(m);
  }
  TANDEM_AVX2 static __m256 Load8(const uint8_t* b, size_t e) {
    const int s = static_cast<int>(e / 32);
    const size_t l = e % 32;
    float d1, m1;
    Scales(b, s, F16Scale(b), F16Scale(b + 2), &d1, &m1);
    __m256i q = Nibbles8(b + kQs + 32 * (e / 64) + l, (s & 1) != 0);
    if constexpr (kFiveBit) q = _mm256_or_si256(q, Field8(b + 16 + l, s, 1, 4));
    const __m256 y = _mm256_mul_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(q));
    return _mm256_sub_ps(y, _mm256_set1_ps(m1));
  }
  TANDEM_AVX512 static __m512 Load16(const uint8_t* b, size_t e) {
    const int s = static_cast<int>(e / 32);
    const size_t l = e % 32;
    float d1, m1;
    Scales(b, s, F16Scale(b), F16Scale(b + 2), &d1, &m1);
    __m512i q = Nibbles16(b + kQs + 32 * (e / 64) + l, (s & 1) != 0);
    if constexpr (kFiveBit) q = _mm512_or_si512(q, Field16(b + 16 + l, s, 1, 4));
    const __m512 y = _mm512_mul_ps(_mm512_set1_ps(d1), _mm512_maskz_cvtepi32_ps(0xffff, q));
    return _mm512_sub_ps(y, _mm512_set1_ps(m1));
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
  struct Where {
    const uint8_t* ql;
    const uint8_t* qh;
    int ql_shift, qh_shift;
    float ds;  // d * scale
  };
  static Where Locate(const uint8_t* b, size_t e, float d) {
    const size_t h = e / 128, g = (e % 128) / 32, l = e % 32;
    const int8_t sc = static_cast<int8_t>(b[192 + 8 * h + 2 * g + l / 16]);
    return {b + 64 * h + l + 32 * (g & 1), b + 128 + 32 * h + l, static_cast<int>(4 * (g >> 1)),
            static_cast<int>(2 * g), d * static_cast<float>(sc)};
  }
  TANDEM_AVX2 static __m256 Load8(const uint8_t* b, size_t e) {
    const Where p = Locate(b, e, F16Scale(b + 208));
    const __m256i q = _mm256_or_si256(Field8(p.ql, p.ql_shift, 0xF, 0), Field8(p.qh, p.qh_shift, 3, 4));
    const __m256 qf = _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(32)));
    return _mm256_mul_ps(_mm256_set1_ps(p.ds), qf);
  }
  TANDEM_AVX512 static __m512 Load16(const uint8_t* b, size_t e) {
    const Where p = Locate(b, e, F16Scale(b + 208));
    const __m512i q =
        _mm512_or_si512(Field16(p.ql, p.ql_shift, 0xF, 0), Field16(p.qh, p.qh_shift, 3, 4));
    const __m512 qf = _mm512_maskz_cvtepi32_ps(0xffff, _mm512_sub_epi32(q, _mm512_set1_epi32(32)));
    return _mm512_mul_ps(_mm512_set1_ps(p.ds), qf);
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

#endif  // TANDEM_ENGINE_MODEL_WEIGHT_LOADS_H_
