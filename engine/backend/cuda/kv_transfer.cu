// The KV transfer kernels of cuda_kernels.h (issue #16): one kernel moves
// K then V rows of a token range between a paged pool and a contiguous
// frame (gather, scatter) or between two paged pools (a peer's, mapped
// into this process, and this one's). Pure byte moves in the widest word
// the row size and the pointers allow: the bits are the pool's.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/kernel_util.cuh"

namespace tandem::backend::cuda {
namespace {

using internal::GridStrideBlocks;

constexpr unsigned kThreads = 256;

// One side of a row copy: a paged pool (k, v bases; the span addresses the
// tokens) or flat rows (k: the K rows, v: the V rows, [count][row] words
// each).
struct KvSide {
  char* k = nullptr;
  char* v = nullptr;
  int32_t layer_blocks = 0;
  int32_t block_size = 1;
  int32_t layer = 0;
  bool paged = false;
};

template <typename W>
__device__ __forceinline__ W* RowWords(const KvSide& s, const KvBlockSpan& span, int kv, int32_t t,
                                       int64_t i, int64_t count, int64_t row_words) {
  if (!s.paged) return reinterpret_cast<W*>(kv == 0 ? s.k : s.v) + i * row_words;
  const int32_t block = span.ids[(t - span.first_token) / s.block_size];
  const int64_t row =
      (static_cast<int64_t>(s.layer) * s.layer_blocks + block) * s.block_size + t % s.block_size;
  return reinterpret_cast<W*>(kv == 0 ? s.k : s.v) + row * row_words;
}

// Element e of [2][count][row_words]: kv, token i, word j.
template <typename W>
__global__ void KvRowsKernel(const KvSide src, const __grid_constant__ KvBlockSpan src_span,
                             const KvSide dst, const __grid_constant__ KvBlockSpan dst_span,
                             int32_t token_start, int64_t count, int64_t row_words) {
  const int64_t per_kv = count * row_words;
  const int64_t n = 2 * per_kv;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int kv = e >= per_kv ? 1 : 0;
    const int64_t rem = e - kv * per_kv;
    const int64_t i = rem / row_words, j = rem % row_words;
    const int32_t t = token_start + static_cast<int32_t>(i);
    RowWords<W>(dst, dst_span, kv, t, i, count, row_words)[j] =
        RowWords<W>(src, src_span, kv, t, i, count, row_words)[j];
  }
}

template <typename W>
cudaError_t LaunchWords(const KvSide& src, const KvBlockSpan& src_span, const KvSide& dst,
                        const KvBlockSpan& dst_span, int32_t token_start, int32_t count,
                        size_t row_bytes, cudaStream_t stream) {
  const int64_t row_words = static_cast<int64_t>(row_bytes / sizeof(W));
  const size_t n = 2 * static_cast<size_t>(count) * static_cast<size_t>(row_words);
  KvRowsKernel<W><<<GridStrideBlocks(n, kThreads), kThreads, 0, stream>>>(
      src, src_span, dst, dst_span, token_start, count, row_words);
  return cudaGetLastError();
}

bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// A paged side's span must hold every token of the range.
bool Covers(const KvBlockSpan& span, int32_t block_size, int32_t token_start, int32_t count) {
  if (span.n_blocks < 0 || span.n_blocks > kKvSpanBlocks || block_size <= 0 ||
      span.first_token % block_size != 0) {
    return false;
  }
  return span.first_token <= token_start &&
         int64_t{token_start} + count <=
             int64_t{span.first_token} + int64_t{span.n_blocks} * block_size;
}

cudaError_t LaunchKvRows(const KvSide& src, const KvBlockSpan& src_span, const KvSide& dst,
                         const KvBlockSpan& dst_span, int32_t token_start, int32_t count,
                         size_t row_bytes, cudaStream_t stream) {
  if (count < 0 || token_start < 0 || row_bytes == 0) return cudaErrorInvalidValue;
  for (const auto* side : {&src, &dst}) {
    const KvBlockSpan& span = side == &src ? src_span : dst_span;
    if (side->k == nullptr || side->v == nullptr) return cudaErrorInvalidValue;
    if (side->paged && !Covers(span, side->block_size, token_start, count)) {
      return cudaErrorInvalidValue;
    }
  }
  if (count == 0) return cudaSuccess;
  // The widest word that divides the row and every base (rows start at
  // multiples of row_bytes from a base).
  auto fits = [&](size_t a) {
    return row_bytes % a == 0 && Aligned(src.k, a) && Aligned(dst.k, a) && Aligned(src.v, a) &&
           Aligned(dst.v, a);
  };
  auto launch = [&](auto word) {
    return LaunchWords<decltype(word)>(src, src_span, dst, dst_span, token_start, count, row_bytes,
                                       stream);
  };
  if (fits(16)) return launch(uint4{});
  if (fits(8)) return launch(uint2{});
  if (fits(4)) return launch(uint32_t{});
  if (fits(2)) return launch(uint16_t{});
  return launch(uint8_t{});
}

size_t RowBytes(const PagedKv& kv) {
  return static_cast<size_t>(kv.kv_dim) * kv::KvDtypeBytes(kv.dtype);
}

KvSide Paged(const PagedKv& kv, int32_t layer) {
  KvSide s;
  s.k = static_cast<char*>(kv.k);
  s.v = static_cast<char*>(kv.v);
  s.layer_blocks = kv.num_blocks;
  s.block_size = kv.block_size;
  s.layer = layer;
  s.paged = true;
  return s;
}

KvSide Flat(const void* k, const void* v) {
  KvSide s;
  s.k = static_cast<char*>(const_cast<void*>(k));
  s.v = static_cast<char*>(const_cast<void*>(v));
  return s;
}

bool LayerOk(const PagedKv& kv, int32_t layer) {
  return layer >= 0 && layer < kv.n_layers && kv.kv_dim > 0 && kv.num_blocks > 0;
}

}  // namespace

cudaError_t LaunchKvGather(const PagedKv& kv, int32_t layer, const KvBlockSpan& span,
                           int32_t token_start, int32_t count, void* k_dst, void* v_dst,
                           cudaStream_t stream) {
  if (!LayerOk(kv, layer)) return cudaErrorInvalidValue;
  return LaunchKvRows(Paged(kv, layer), span, Flat(k_dst, v_dst), KvBlockSpan{}, token_start, count,
                      RowBytes(kv), stream);
}

cudaError_t LaunchKvScatter(const PagedKv& kv, int32_t layer, const KvBlockSpan& span,
                            int32_t token_start, int32_t count, const void* k_src,
                            const void* v_src, cudaStream_t stream) {
  if (!LayerOk(kv, layer)) return cudaErrorInvalidValue;
  return LaunchKvRows(Flat(k_src, v_src), KvBlockSpan{}, Paged(kv, layer), span, token_start, count,
                      RowBytes(kv), stream);
}

cudaError_t LaunchKvCopyPeer(const PagedKv& src, const KvBlockSpan& src_span, const PagedKv& dst,
                             const KvBlockSpan& dst_span, int32_t layer, int32_t token_start,
                             int32_t count, cudaStream_t stream) {
  if (!LayerOk(src, layer) || !LayerOk(dst, layer) || src.dtype != dst.dtype ||
      src.kv_dim != dst.kv_dim) {
    return cudaErrorInvalidValue;
  }
  return LaunchKvRows(Paged(src, layer), src_span, Paged(dst, layer), dst_span, token_start, count,
                      RowBytes(dst), stream);
}

}  // namespace tandem::backend::cuda
