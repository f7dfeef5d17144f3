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
// (F32 and F16. The quantized types give a block's scales once and then
// whole groups instead: Prepare8 / LoadGroup8, Prepare / LoadGroup16 of
// BlockLoads below.)
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

// Low (high = false) or high nibbles of the 8 bytes at p.
TANDEM_AVX2 __m256i Nibbles8(const uint8_t* p, bool high) {
  const __m256i b = Bytes8(p);
  return high ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(0xF));
}

// ((bits >> (shift + lane)) & 1) << 4 for lanes 0..7: a Q5 high bit.
TANDEM_AVX2 __m256i HighBits8(uint32_t bits, int shift) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i s = _mm256_add_epi32(lane, _mm256_set1_epi32(shift));
  const __m256i b = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(bits)), s);
  return _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(1)), 4);
}

// ((bytes[l] >> shift) & mask) << up, per lane, of the 8 bytes at p.
TANDEM_AVX2 __m256i Field8(const uint8_t* p, int shift, int mask, int up) {
  const __m256i v = _mm256_srl_epi32(Bytes8(p), _mm_cvtsi32_si128(shift));
  return _mm256_sll_epi32(_mm256_and_si256(v, _mm256_set1_epi32(mask)), _mm_cvtsi32_si128(up));
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
  const uint8_t* P(int c, size_t i) const { return w + static_cast<size_t>(c) * row_bytes + 2 * i; }
  float At(int c, size_t i) const { return HalfToFloat(LoadU16(P(c, i))); }
  TANDEM_AVX2 __m256 Load8(int c, size_t i) const {
    PrefetchAhead(P(c, i), ahead);
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(P(c, i))));
  }
  TANDEM_AVX512 __m512 Load16(int c, size_t i) const {
    PrefetchAhead(P(c, i), ahead);
    return _mm512_maskz_cvtph_ps(0xffff,
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(P(c, i))));
  }
};

#endif  // TANDEM_WEIGHT_LOADS_X86

}  // namespace tandem::model::internal

#endif  // TANDEM_ENGINE_MODEL_WEIGHT_LOADS_H_
