// Sampling reductions of cuda_kernels.h: RowStats and RowTopK, one thread
// block per row of logits. Both use the candidate order of
// sampling_view.h: key = the logit with NaN as -inf, larger key first,
// equal keys by lower id.
//
// RowTopK selects by radix on a 64-bit composite that is unique per
// element and larger exactly when the element comes earlier in the
// candidate order:
//   composite = (ordered_bits(key) << 32) | ~id
// (ordered_bits maps a float to a u32 with the same order, -0 taken as +0
// so that it ties with +0 as the float comparison does). Radix select,
// most significant byte first: a 256-bin histogram of the next byte over
// the elements that still match the chosen prefix, then the byte b whose
// bin holds the `need`-th largest; `need` drops by the counts above b. It
// stops when b's bin holds exactly `need` elements (at the latest after 8
// bytes, when the bin is one element): the top k are then exactly the
// elements whose masked composite is >= the prefix. Those k (<=
// kMaxDeviceTopK) are gathered into shared memory and bitonic-sorted,
// descending. Ties never depend on the gather's (atomic) order, since
// composites are unique. A row is read once per byte (usually 4: the
// logit bytes; ties in the logit add id bytes) plus once for the gather.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "engine/backend/cuda/cuda_kernels.h"

namespace tandem::backend::cuda {
namespace {

constexpr unsigned kThreads = 1024;  // a power of two (the trees)

// The candidate-order key of a logit: NaN as -inf.
__device__ __forceinline__ float Key(float logit) { return isnan(logit) ? -INFINITY : logit; }

// True when (key_a, id_a) comes before (key_b, id_b) in the candidate order.
__device__ __forceinline__ bool Before(float key_a, int32_t id_a, float key_b, int32_t id_b) {
  return key_a > key_b || (key_a == key_b && id_a < id_b);
}

// Thread j scans ids j, j + kThreads, ... for the first in candidate order
// and sums exp(double(l) - max) in that order; both are combined in a
// fixed binary tree (thread i + s into i, s = kThreads / 2, ..., 1).
__global__ void __launch_bounds__(kThreads)
    RowStatsKernel(const float* logits, int32_t vocab, RowStats* out) {
  __shared__ float best_key[kThreads];
  __shared__ int32_t best_id[kThreads];
  __shared__ double sum[kThreads];
  const float* row = logits + static_cast<size_t>(blockIdx.x) * vocab;
  const unsigned tid = threadIdx.x;
  float key = -INFINITY;
  int32_t id = INT_MAX;  // loses every tie with a real id
  for (int32_t i = tid; i < vocab; i += kThreads) {
    const float k = Key(row[i]);
    if (Before(k, i, key, id)) {
      key = k;
      id = i;
    }
  }
  best_key[tid] = key;
  best_id[tid] = id;
  __syncthreads();
  for (unsigned s = kThreads / 2; s > 0; s >>= 1) {
    if (tid < s && Before(best_key[tid + s], best_id[tid + s], best_key[tid], best_id[tid])) {
      best_key[tid] = best_key[tid + s];
      best_id[tid] = best_id[tid + s];
    }
    __syncthreads();
  }
  const int32_t argmax = best_id[0];
  const float top = row[argmax];
  const double top_d = top;
  double local = 0.0;
  for (int32_t i = tid; i < vocab; i += kThreads) {
    local = __dadd_rn(local, exp(__dsub_rn(static_cast<double>(row[i]), top_d)));
  }
  sum[tid] = local;
  __syncthreads();
  for (unsigned s = kThreads / 2; s > 0; s >>= 1) {
    if (tid < s) sum[tid] = __dadd_rn(sum[tid], sum[tid + s]);
    __syncthreads();
  }
  if (tid == 0) {
    RowStats& stats = out[blockIdx.x];
    stats.argmax = argmax;
    stats.max = top;
    stats.log_sum = log(sum[0]);
  }
}

// The composite described at the top of the file.
__device__ __forceinline__ uint64_t Composite(float logit, int32_t id) {
  float key = Key(logit);
  if (key == 0.0f) key = 0.0f;  // -0 ties with +0
  uint32_t bits = __float_as_uint(key);
  bits = (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
  return (static_cast<uint64_t>(bits) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}

__global__ void __launch_bounds__(kThreads)
    RowTopKKernel(const float* logits, int32_t vocab, int32_t k, int32_t* ids, float* values) {
  __shared__ unsigned hist[256];
  __shared__ uint64_t shared_prefix, shared_mask;
  __shared__ int32_t shared_need;
  __shared__ bool shared_done;
  __shared__ unsigned count;
  __shared__ uint64_t cand[kMaxDeviceTopK];
  const float* row = logits + static_cast<size_t>(blockIdx.x) * vocab;
  const unsigned tid = threadIdx.x;

  uint64_t prefix = 0, mask = 0;
  int32_t need = k;
  for (int shift = 56; shift >= 0; shift -= 8) {
    if (tid < 256) hist[tid] = 0;
    __syncthreads();
    // Warp-uniform trips, so that every lane takes part in the match:
    // lanes with the same bin add once, through their lowest lane (logits
    // crowd into a few bins, where one atomic per element would queue).
    for (int32_t base = 0; base < vocab; base += kThreads) {
      const int32_t i = base + static_cast<int32_t>(tid);
      unsigned bin = 256;  // no bin: past the row or off the prefix
      if (i < vocab) {
        const uint64_t c = Composite(row[i], i);
        if ((c & mask) == prefix) bin = static_cast<unsigned>(c >> shift) & 0xffu;
      }
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (bin < 256 && static_cast<int>(tid % 32) == __ffs(peers) - 1) {
        atomicAdd(&hist[bin], static_cast<unsigned>(__popc(peers)));
      }
    }
    __syncthreads();
    if (tid == 0) {
      // The byte whose bin holds the need-th largest: bins above it hold
      // fewer than `need` together, and with it at least `need`.
      int32_t above = 0;
      int b = 255;
      for (; b > 0; --b) {
        if (above + static_cast<int32_t>(hist[b]) >= need) break;
        above += static_cast<int32_t>(hist[b]);
      }
      shared_prefix = prefix | (static_cast<uint64_t>(b) << shift);
      shared_mask = mask | (uint64_t{0xff} << shift);
      shared_need = need - above;
      shared_done = static_cast<int32_t>(hist[b]) == need - above;
      count = 0;
    }
    __syncthreads();
    prefix = shared_prefix;
    mask = shared_mask;
    need = shared_need;
    if (shared_done) break;  // uniform: every thread read the same flag
  }

  // Exactly k elements have (composite & mask) >= prefix.
  for (int32_t i = tid; i < vocab; i += kThreads) {
    const uint64_t c = Composite(row[i], i);
    if ((c & mask) >= prefix) {
      const unsigned slot = atomicAdd(&count, 1u);
      if (slot < static_cast<unsigned>(kMaxDeviceTopK)) cand[slot] = c;
    }
  }
  unsigned size = 1;
  while (size < static_cast<unsigned>(k)) size <<= 1;
  for (unsigned i = k + tid; i < size; i += kThreads) cand[i] = 0;  // below every element
  __syncthreads();
  // Bitonic sort of cand[0, size), descending.
  for (unsigned len = 2; len <= size; len <<= 1) {
    for (unsigned stride = len / 2; stride > 0; stride >>= 1) {
      for (unsigned i = tid; i < size; i += kThreads) {
        const unsigned j = i ^ stride;
        if (j > i) {
          const uint64_t x = cand[i], y = cand[j];
          const bool descending = (i & len) == 0;
          if (descending ? x < y : x > y) {
            cand[i] = y;
            cand[j] = x;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int32_t i = tid; i < k; i += kThreads) {
    const int32_t id = static_cast<int32_t>(~static_cast<uint32_t>(cand[i]));
    ids[static_cast<size_t>(blockIdx.x) * k + i] = id;
    values[static_cast<size_t>(blockIdx.x) * k + i] = row[id];
  }
}

}  // namespace

cudaError_t LaunchRowStats(const float* logits, int32_t rows, int32_t vocab, RowStats* out,
                           cudaStream_t stream) {
  if (rows < 0 || vocab <= 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  RowStatsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, out);
  return cudaGetLastError();
}

size_t RowTopKWorkspaceBytes(int32_t rows, int32_t vocab) {
  return 0;  // each row's block works in its own shared memory
}

cudaError_t LaunchRowTopK(const float* logits, int32_t rows, int32_t vocab, int32_t k,
                          void* workspace, int32_t* ids, float* values, cudaStream_t stream) {
  if (rows < 0 || vocab <= 0 || k <= 0 || k > kMaxDeviceTopK || k > vocab) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  RowTopKKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, k, ids,
                                                                      values);
  return cudaGetLastError();
}

}  // namespace tandem::backend::cuda
