// KV write and paged attention of cuda_kernels.h.
//
// Attention is split by absolute key position so that a token's result
// never depends on the batch (batch-invariant numerics). For token t at
// position pos, query head h and chunk c (keys [c * kAttentionChunk,
// min((c + 1) * kAttentionChunk, pos + 1))), ChunkKernel computes
//   s_j   = (q . k_j) * scale       q . k_j: one FMA chain over d
//                                    ascending (a thread per key)
//   m_c   = max_j s_j
//   e_j   = expf(s_j - m_c)
//   l_c   = sum_j e_j               lane l of a warp sums j = l, l + 32,
//                                    ..., then a xor butterfly over lanes
//   acc_c = sum_j e_j * v_j[d]      j ascending (FMAs) within each of
//                                    ValueSplits(head_dim) fixed sub-ranges
//                                    of the chunk, their sums added in order
// A token whose keys fit in one chunk (pos < kAttentionChunk) writes
// acc_0 / l_0 directly. Otherwise the partials go to the workspace and
// CombineKernel merges the token's chunks in chunk order:
//   M = max_c m_c, w_c = expf(m_c - M), L = sum_c l_c w_c,
//   out[d] = (sum_c acc_c[d] w_c) / L.
// Every order above depends on pos and the chunk bounds alone. K and V are
// read in place through the block table, each element once per block for
// up to kMaxGroup query heads of its GQA group; chunks past a token's
// position exit at once (a CUDA graph sizes the grid for the whole
// context).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/kernel_util.cuh"

namespace tandem::backend::cuda {
namespace {

using internal::DispatchDtype;
using internal::FromF32;
using internal::ToF32;

constexpr int32_t kMaxHeadDim = 256;
constexpr int32_t kMaxGroup = 8;  // query heads of one KV head per block
constexpr int32_t kWarps = 4;
constexpr int32_t kThreads = kWarps * 32;
constexpr unsigned kKvWriteThreads = 256;

template <typename T>
__global__ void KvWriteKernel(const float* qkv, int32_t width, int32_t q_dim,
                              const int32_t* token_seq, const int32_t* token_pos,
                              const int32_t* block_tables, int32_t max_blocks_per_seq, T* k_pool,
                              T* v_pool, int32_t layer, int32_t num_blocks, int32_t block_size,
                              int32_t kv_dim) {
  const size_t t = blockIdx.x;
  const int32_t pos = token_pos[t];
  const int32_t block =
      block_tables[static_cast<size_t>(token_seq[t]) * max_blocks_per_seq + pos / block_size];
  const size_t dst =
      ((static_cast<size_t>(layer) * num_blocks + block) * block_size + pos % block_size) *
      static_cast<size_t>(kv_dim);
  const float* src = qkv + t * static_cast<size_t>(width) + q_dim;
  for (int32_t j = threadIdx.x; j < kv_dim; j += blockDim.x) {
    k_pool[dst + j] = FromF32<T>(src[j]);
    v_pool[dst + j] = FromF32<T>(src[kv_dim + j]);
  }
}

// The values pass splits a chunk's keys into this many fixed sub-ranges
// (kAttentionChunk / splits positions each), so that narrow heads still
// give every thread work; it depends on head_dim alone. When above 1,
// splits * head_dim < kMaxHeadDim (the partial sums' room).
__device__ __forceinline__ int32_t ValueSplits(int32_t head_dim) {
  return head_dim >= 128 ? 1 : head_dim >= 64 ? 2 : 4;
}

struct AttentionArgs {
  const float* qkv;
  int32_t width;  // q_dim + 2 * kv_dim
  const int32_t* token_seq;
  const int32_t* token_pos;
  const int32_t* block_tables;
  int32_t max_blocks_per_seq;
  int32_t layer, num_blocks, block_size, kv_dim;
  int32_t n_head, group, head_dim;  // group = n_head / n_head_kv
  int32_t n_slices;                 // blocks per KV head: ceil(group / kMaxGroup)
  float scale;
  int32_t n_chunks;  // gridDim.z of ChunkKernel
  float* ws_acc;     // [n_tokens][n_head][n_chunks][head_dim]
  float* ws_ml;      // [n_tokens][n_head][n_chunks][2]: (m_c, l_c)
};

// Grid (n_tokens, n_head_kv * n_slices, n_chunks), kThreads threads. The
// query heads that read one KV head (its GQA group) are taken up to
// kMaxGroup at a time (a slice), so each key and value element is loaded
// once for all of them; every (token, head) still runs the arithmetic of
// the top of the file on its own, whichever slice holds it.
template <typename T, typename O>
__global__ void __launch_bounds__(kThreads)
    ChunkKernel(AttentionArgs a, const T* k_pool, const T* v_pool, O* out) {
  __shared__ __align__(16) float q[kMaxGroup][kMaxHeadDim];
  __shared__ __align__(16) float scores[kAttentionChunk][kMaxGroup];  // s_j, then e_j
  __shared__ size_t row[kAttentionChunk];            // element offset of key j's head in the pools
  __shared__ float stats[2][kMaxGroup];              // m_c and l_c per head
  __shared__ float partial[kMaxGroup][kMaxHeadDim];  // [g][split * hd + d]
  const size_t t = blockIdx.x;
  const int32_t kv_head = blockIdx.y / a.n_slices;
  const int32_t h0 = kv_head * a.group + (blockIdx.y % a.n_slices) * kMaxGroup;
  const int32_t n_group = min(kMaxGroup, (kv_head + 1) * a.group - h0);  // heads h0 ..
  const int32_t c = blockIdx.z;
  const int32_t pos = a.token_pos[t];
  const int32_t first = c * kAttentionChunk;
  const bool direct = pos < kAttentionChunk;
  // Whole-block exits, so no barrier is skipped: chunks past the token's
  // position, and (a caller's error: pos >= max_context) a partial with
  // nowhere to go.
  if (first > pos || (!direct && a.ws_acc == nullptr)) return;
  const int32_t n_keys = min(kAttentionChunk, pos + 1 - first);
  const int32_t hd = a.head_dim;
  const int32_t* table =
      a.block_tables + static_cast<size_t>(a.token_seq[t]) * a.max_blocks_per_seq;
  const size_t head_offset = static_cast<size_t>(kv_head) * hd;

  const float* q_row = a.qkv + t * static_cast<size_t>(a.width) + static_cast<size_t>(h0) * hd;
  for (int32_t e = threadIdx.x; e < n_group * hd; e += kThreads) q[e / hd][e % hd] = q_row[e];
  for (int32_t j = threadIdx.x; j < n_keys; j += kThreads) {
    const int32_t p = first + j;
    const size_t block = static_cast<size_t>(table[p / a.block_size]);
    row[j] =
        ((static_cast<size_t>(a.layer) * a.num_blocks + block) * a.block_size + p % a.block_size) *
            static_cast<size_t>(a.kv_dim) +
        head_offset;
  }
  __syncthreads();

  // Scores: thread i takes keys i, i + kThreads, ...; each dot one FMA
  // chain over d ascending, k[d] loaded once for every head of the slice
  // (16-byte loads where the rows are aligned: the same chain).
  constexpr int32_t kVec = 16 / sizeof(T);
  const bool vector_loads = hd % kVec == 0 && reinterpret_cast<uintptr_t>(k_pool) % 16 == 0;
  for (int32_t j = threadIdx.x; j < n_keys; j += kThreads) {
    const T* key = k_pool + row[j];
    float dot[kMaxGroup];
#pragma unroll
    for (int32_t g = 0; g < kMaxGroup; ++g) dot[g] = 0.0f;
    if (vector_loads) {
      for (int32_t d0 = 0; d0 < hd; d0 += kVec) {
        const uint4 raw = *reinterpret_cast<const uint4*>(key + d0);
        T elems[kVec];
        memcpy(elems, &raw, sizeof raw);
        float k[kVec];
#pragma unroll
        for (int32_t i = 0; i < kVec; ++i) k[i] = ToF32(elems[i]);
#pragma unroll
        for (int32_t g = 0; g < kMaxGroup; ++g) {
          if (g < n_group) {
#pragma unroll
            for (int32_t i = 0; i < kVec; i += 4) {
              const float4 qv = *reinterpret_cast<const float4*>(&q[g][d0 + i]);
              dot[g] = __fmaf_rn(qv.x, k[i], dot[g]);
              dot[g] = __fmaf_rn(qv.y, k[i + 1], dot[g]);
              dot[g] = __fmaf_rn(qv.z, k[i + 2], dot[g]);
              dot[g] = __fmaf_rn(qv.w, k[i + 3], dot[g]);
            }
          }
        }
      }
    } else {
      for (int32_t d = 0; d < hd; ++d) {
        const float k = ToF32(key[d]);
#pragma unroll
        for (int32_t g = 0; g < kMaxGroup; ++g) {
          if (g < n_group) dot[g] = __fmaf_rn(q[g][d], k, dot[g]);
        }
      }
    }
#pragma unroll
    for (int32_t g = 0; g < kMaxGroup; ++g) {
      scores[j][g] = g < n_group ? __fmul_rn(dot[g], a.scale) : 0.0f;
    }
  }
  __syncthreads();

  // Softmax statistics: warp w takes heads w, w + kWarps, ...; lane l
  // scans j = l, l + 32, ... (max, then e_j and their sum), and a xor
  // butterfly combines the lanes (every lane gets the same value).
  const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int32_t g = warp; g < n_group; g += kWarps) {
    float m = -INFINITY;
    for (int32_t j = lane; j < n_keys; j += 32) m = fmaxf(m, scores[j][g]);
    for (int offset = 16; offset > 0; offset >>= 1) {
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    }
    float l = 0.0f;
    for (int32_t j = lane; j < n_keys; j += 32) {
      const float e = expf(__fsub_rn(scores[j][g], m));
      scores[j][g] = e;
      l = __fadd_rn(l, e);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, offset));
    }
    if (lane == 0) {
      stats[0][g] = m;
      stats[1][g] = l;
    }
  }
  __syncthreads();

  // The chunk's result for head h0 + g, dimension d.
  auto finish = [&](int32_t g, int32_t d, float acc) {
    const size_t h = static_cast<size_t>(h0 + g);
    if (direct) {
      out[(t * a.n_head + h) * hd + d] = FromF32<O>(__fdiv_rn(acc, stats[1][g]));
    } else {
      a.ws_acc[((t * a.n_head + h) * a.n_chunks + c) * hd + d] = acc;
    }
  };
  // Values: thread e takes dimension d = e % hd of every head over split
  // s = e / hd of the chunk (keys [s * span, (s + 1) * span)), one FMA
  // chain over j ascending; the splits' sums are then added in split order.
  const int32_t splits = ValueSplits(hd);
  const int32_t span = kAttentionChunk / splits;
  for (int32_t e = threadIdx.x; e < hd * splits; e += kThreads) {
    const int32_t d = e % hd, split = e / hd;
    const int32_t j_end = min((split + 1) * span, n_keys);
    float acc[kMaxGroup];
#pragma unroll
    for (int32_t g = 0; g < kMaxGroup; ++g) acc[g] = 0.0f;
    for (int32_t j = split * span; j < j_end; ++j) {
      const float v = ToF32(v_pool[row[j] + d]);
      const float4 e_lo = *reinterpret_cast<const float4*>(&scores[j][0]);
      acc[0] = __fmaf_rn(e_lo.x, v, acc[0]);
      acc[1] = __fmaf_rn(e_lo.y, v, acc[1]);
      acc[2] = __fmaf_rn(e_lo.z, v, acc[2]);
      acc[3] = __fmaf_rn(e_lo.w, v, acc[3]);
      if (n_group > 4) {
        const float4 e_hi = *reinterpret_cast<const float4*>(&scores[j][4]);
        acc[4] = __fmaf_rn(e_hi.x, v, acc[4]);
        acc[5] = __fmaf_rn(e_hi.y, v, acc[5]);
        acc[6] = __fmaf_rn(e_hi.z, v, acc[6]);
        acc[7] = __fmaf_rn(e_hi.w, v, acc[7]);
      }
    }
#pragma unroll
    for (int32_t g = 0; g < kMaxGroup; ++g) {
      if (g < n_group) {
        if (splits == 1) {
          finish(g, d, acc[g]);
        } else {
          partial[g][split * hd + d] = acc[g];
        }
      }
    }
  }
  if (splits > 1) {  // uniform over the block
    __syncthreads();
    for (int32_t e = threadIdx.x; e < n_group * hd; e += kThreads) {
      const int32_t g = e / hd, d = e % hd;
      float acc = partial[g][d];
      for (int32_t split = 1; split < splits; ++split) {
        acc = __fadd_rn(acc, partial[g][split * hd + d]);
      }
      finish(g, d, acc);
    }
  }
  if (!direct && threadIdx.x == 0) {
    for (int32_t g = 0; g < n_group; ++g) {
      const size_t p = (t * a.n_head + h0 + g) * static_cast<size_t>(a.n_chunks) + c;
      a.ws_ml[p * 2] = stats[0][g];
      a.ws_ml[p * 2 + 1] = stats[1][g];
    }
  }
}

// Grid (n_tokens, n_head), kThreads threads: merges the chunks of tokens
// at pos >= kAttentionChunk, in chunk order (see the top of the file).
template <typename O>
__global__ void __launch_bounds__(kThreads) CombineKernel(AttentionArgs a, O* out) {
  const size_t t = blockIdx.x;
  const int32_t h = blockIdx.y;
  const int32_t pos = a.token_pos[t];
  if (pos < kAttentionChunk) return;  // ChunkKernel wrote it
  // Positions past max_context (a caller's error) are cut at the grid.
  const int32_t n = min(pos / kAttentionChunk + 1, a.n_chunks);
  const size_t first = (t * a.n_head + h) * static_cast<size_t>(a.n_chunks);
  const float* ml = a.ws_ml + first * 2;
  float m = -INFINITY;
  for (int32_t c = 0; c < n; ++c) m = fmaxf(m, ml[2 * c]);
  float l = 0.0f;
  for (int32_t c = 0; c < n; ++c) {
    l = __fadd_rn(l, __fmul_rn(ml[2 * c + 1], expf(__fsub_rn(ml[2 * c], m))));
  }
  const int32_t hd = a.head_dim;
  for (int32_t d = threadIdx.x; d < hd; d += kThreads) {
    float acc = 0.0f;
    for (int32_t c = 0; c < n; ++c) {
      const float w = expf(__fsub_rn(ml[2 * c], m));
      acc = __fmaf_rn(a.ws_acc[(first + c) * hd + d], w, acc);
    }
    out[t * static_cast<size_t>(a.n_head) * hd + static_cast<size_t>(h) * hd + d] =
        FromF32<O>(__fdiv_rn(acc, l));
  }
}

int32_t ChunksFor(int32_t max_context) {
  return (max_context + kAttentionChunk - 1) / kAttentionChunk;
}

}  // namespace

cudaError_t LaunchKvWrite(const float* qkv, int32_t q_dim, const BatchMeta& batch,
                          const PagedKv& kv, int32_t layer, cudaStream_t stream) {
  if (batch.n_tokens < 0 || q_dim < 0 || kv.kv_dim <= 0 || kv.block_size <= 0 || layer < 0 ||
      layer >= kv.n_layers) {
    return cudaErrorInvalidValue;
  }
  if (batch.n_tokens == 0) return cudaSuccess;
  return DispatchDtype(kv.dtype, [&](auto tag) {
    using T = decltype(tag);
    KvWriteKernel<T><<<static_cast<unsigned>(batch.n_tokens), kKvWriteThreads, 0, stream>>>(
        qkv, q_dim + 2 * kv.kv_dim, q_dim, batch.token_seq, batch.token_pos, batch.block_tables,
        batch.max_blocks_per_seq, static_cast<T*>(kv.k), static_cast<T*>(kv.v), layer,
        kv.num_blocks, kv.block_size, kv.kv_dim);
    return cudaGetLastError();
  });
}

size_t PagedAttentionWorkspaceBytes(int32_t max_tokens, int32_t n_head, int32_t head_dim,
                                    int32_t max_context) {
  if (max_tokens <= 0 || n_head <= 0 || head_dim <= 0 || max_context <= 0) return 0;
  const int32_t n_chunks = ChunksFor(max_context);
  if (n_chunks <= 1) return 0;  // every token fits in one chunk: written directly
  return static_cast<size_t>(max_tokens) * static_cast<size_t>(n_head) *
         static_cast<size_t>(n_chunks) * (static_cast<size_t>(head_dim) + 2) * sizeof(float);
}

cudaError_t LaunchPagedAttention(const float* qkv, const BatchMeta& batch, const PagedKv& kv,
                                 int32_t layer, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                 float scale, int32_t max_context, void* workspace, void* out,
                                 Dtype out_dtype, cudaStream_t stream) {
  if (batch.n_tokens < 0 || n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0 ||
      head_dim <= 0 || head_dim > kMaxHeadDim || kv.kv_dim != n_head_kv * head_dim ||
      kv.block_size <= 0 || layer < 0 || layer >= kv.n_layers || max_context <= 0) {
    return cudaErrorInvalidValue;
  }
  const int32_t n_chunks = ChunksFor(max_context);
  if (n_chunks > 65535 || n_head > 65535 || (n_chunks > 1 && workspace == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (batch.n_tokens == 0) return cudaSuccess;
  AttentionArgs args;
  args.qkv = qkv;
  args.width = n_head * head_dim + 2 * kv.kv_dim;
  args.token_seq = batch.token_seq;
  args.token_pos = batch.token_pos;
  args.block_tables = batch.block_tables;
  args.max_blocks_per_seq = batch.max_blocks_per_seq;
  args.layer = layer;
  args.num_blocks = kv.num_blocks;
  args.block_size = kv.block_size;
  args.kv_dim = kv.kv_dim;
  args.n_head = n_head;
  args.group = n_head / n_head_kv;
  args.n_slices = (args.group + kMaxGroup - 1) / kMaxGroup;
  args.head_dim = head_dim;
  args.scale = scale;
  args.n_chunks = n_chunks;
  // One chunk needs no workspace (and must not write one sized 0).
  args.ws_acc = n_chunks > 1 ? static_cast<float*>(workspace) : nullptr;
  args.ws_ml = args.ws_acc == nullptr ? nullptr
                                      : args.ws_acc + static_cast<size_t>(batch.n_tokens) * n_head *
                                                          n_chunks * static_cast<size_t>(head_dim);
  const dim3 chunk_grid(static_cast<unsigned>(batch.n_tokens),
                        static_cast<unsigned>(n_head_kv * args.n_slices),
                        static_cast<unsigned>(n_chunks));
  const dim3 combine_grid(static_cast<unsigned>(batch.n_tokens), static_cast<unsigned>(n_head));
  return DispatchDtype(kv.dtype, [&](auto kv_tag) {
    using T = decltype(kv_tag);
    return DispatchDtype(out_dtype, [&](auto out_tag) {
      using O = decltype(out_tag);
      ChunkKernel<T, O><<<chunk_grid, kThreads, 0, stream>>>(
          args, static_cast<const T*>(kv.k), static_cast<const T*>(kv.v), static_cast<O*>(out));
      if (n_chunks > 1) {
        CombineKernel<O><<<combine_grid, kThreads, 0, stream>>>(args, static_cast<O*>(out));
      }
      return cudaGetLastError();
    });
  });
}

}  // namespace tandem::backend::cuda
