// The CUDA backend's own kernels (everything but the GEMMs, which go
// through cuBLASLt or, in batch-invariant mode where cuBLASLt's bits vary
// with M, FixedTileGemm): host-side launchers, implemented in *.cu.
//
// Data conventions (DESIGN.md, GPU workers; the graph is llama_model.h's):
//   - The residual stream x is F32 [n_tokens][n_embd] (row-major).
//   - "act" buffers feed a GEMM and have the weights' dtype (Dtype: F32,
//     F16 or BF16; kv::KvDtype's values are reused for all three).
//   - GEMM outputs are F32: the fused QKV rows [n_tokens][q_dim + 2*kv_dim]
//     (q, then k, then v), the fused gate/up rows [n_tokens][2*n_ff] (gate,
//     then up), the logits [n_rows][vocab].
//   - The paged KV cache (PagedKv): one K pool and one V pool, element
//     (layer, block, slot, j) at ((layer * num_blocks + block) * block_size
//     + slot) * kv_dim + j; token t of a sequence lives in block
//     block_table[t / block_size], slot t % block_size (kv_storage.h).
//   - BatchMeta: per token its sequence and absolute position, per sequence
//     its block table row; all device pointers.
// Every reduction (RMSNorm, attention, sampling statistics) has a fixed
// order that depends only on the row's own length and absolute positions,
// never on the batch, so results are bit-identical across batch
// composition (batch-invariant numerics; Thinking Machines, "Defeating
// Nondeterminism in LLM Inference", 2025).
// Every launcher returns cudaGetLastError() after its launches; none
// synchronizes. Shapes a kernel cannot run (negative sizes, the limits
// stated below) return cudaErrorInvalidValue before any launch; empty work
// (no tokens, no rows) launches nothing and returns cudaSuccess.
#ifndef TANDEM_ENGINE_BACKEND_CUDA_CUDA_KERNELS_H_
#define TANDEM_ENGINE_BACKEND_CUDA_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/kv/kv_dtype.h"
#include "engine/model/model_arch.h"

namespace tandem::backend::cuda {

using Dtype = kv::KvDtype;  // F32, F16, BF16 element types

struct PagedKv {
  void* k = nullptr;  // K pool, `dtype`
  void* v = nullptr;  // V pool
  Dtype dtype = Dtype::kBF16;
  int32_t n_layers = 0;
  int32_t num_blocks = 0;
  int32_t block_size = 16;
  int32_t kv_dim = 0;  // n_head_kv * head_dim
};

struct BatchMeta {
  int32_t n_tokens = 0;
  int32_t n_seqs = 0;
  const int32_t* token_seq = nullptr;     // [n_tokens]: sequence of token t
  const int32_t* token_pos = nullptr;     // [n_tokens]: absolute position
  const int32_t* block_tables = nullptr;  // [n_seqs][max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
};

// x[t][:] = F32(table[ids[t]][:]), table [vocab][n_embd] of `table_dtype`.
cudaError_t LaunchEmbedding(const int32_t* ids, int32_t n_tokens, const void* table,
                            Dtype table_dtype, int32_t n_embd, float* x, cudaStream_t stream);

// For i < n_rows, r = rows ? rows[i] : i:
//   out[i][:] = (x[r][:] * 1/sqrt(mean(x[r][:]^2) + eps)) * weight[:]
// (ggml's rms_norm then mul), written as `out_dtype`. One thread block
// per row, a fixed-order tree reduction.
cudaError_t LaunchRmsNorm(const float* x, const int32_t* rows, int32_t n_rows, int32_t n,
                          const float* weight, float eps, void* out, Dtype out_dtype,
                          cudaStream_t stream);

// On the fused QKV rows qkv [n_tokens][q_dim + 2*kv_dim] (q_dim = n_head *
// head_dim, kv_dim = n_head_kv * head_dim): adds `bias` ([q_dim +
// 2*kv_dim], may be null) to the whole row, then rotates every q and k
// head at position positions[t] (llama_model.h's RoPE: pair i < rope_dim/2
// by pos * freq_base^(-2i/rope_dim) / freq_factors[i], freq_factors may be
// null; NORM pairs (2i, 2i+1), NEOX pairs (i, i + rope_dim/2)).
cudaError_t LaunchBiasRope(float* qkv, int32_t n_tokens, const int32_t* positions,
                           const float* bias, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                           int32_t rope_dim, model::RopeType rope_type, float freq_base,
                           const float* freq_factors, cudaStream_t stream);

// Writes each token's K (qkv[t][q_dim ..]) and V (qkv[t][q_dim + kv_dim ..])
// into layer `layer` of the paged cache at its position, as kv.dtype.
cudaError_t LaunchKvWrite(const float* qkv, int32_t q_dim, const BatchMeta& batch,
                          const PagedKv& kv, int32_t layer, cudaStream_t stream);

// Keys are split in chunks of this many absolute positions; a token's
// chunks are combined in chunk order (the batch-invariant split).
inline constexpr int32_t kAttentionChunk = 256;

// Bytes of the partial results LaunchPagedAttention needs for up to
// max_tokens tokens of at most max_context positions: 0 when max_context
// <= kAttentionChunk (one chunk is written straight to `out`), else
// max_tokens * n_head * ceil(max_context / kAttentionChunk) *
// (head_dim + 2) floats.
size_t PagedAttentionWorkspaceBytes(int32_t max_tokens, int32_t n_head, int32_t head_dim,
                                    int32_t max_context);

// Causal GQA attention of every token over its sequence's positions
// [0, token_pos[t]], reading K/V of `layer` in place through the block
// tables (no gather copy): out[t][h*head_dim + d] (`out_dtype`) =
// sum_j softmax_j(q_h . k_j * scale) v_j, query head h reading KV head
// h / (n_head / n_head_kv); q is qkv[t][h*head_dim ..] (already rotated).
// max_context bounds token_pos + 1 over the batch (grid sizing; a CUDA
// graph passes the model's context length); a token past it is the
// caller's error: its output is then unspecified, but no memory outside
// the given buffers is touched.
// Limits: head_dim <= 256, n_head a multiple of n_head_kv, kv.kv_dim ==
// n_head_kv * head_dim, ceil(max_context / kAttentionChunk) <= 65535;
// `workspace` (PagedAttentionWorkspaceBytes) may be null when that is 0.
cudaError_t LaunchPagedAttention(const float* qkv, const BatchMeta& batch, const PagedKv& kv,
                                 int32_t layer, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                 float scale, int32_t max_context, void* workspace, void* out,
                                 Dtype out_dtype, cudaStream_t stream);

// out[t][i] = silu(gate_up[t][i]) * gate_up[t][n_ff + i], as `out_dtype`;
// silu(g) = g / (1 + exp(-g)).
cudaError_t LaunchSwiGlu(const float* gate_up, int32_t n_tokens, int32_t n_ff, void* out,
                         Dtype out_dtype, cudaStream_t stream);

// x[i] += y[i] for i < n (the residual adds).
cudaError_t LaunchAdd(float* x, const float* y, size_t n, cudaStream_t stream);

// out[i] = `out_dtype`(in[i]) for i < n, round to nearest even (weight
// upload, F32 -> BF16/F16/F32).
cudaError_t LaunchConvertF32(const float* in, size_t n, void* out, Dtype out_dtype,
                             cudaStream_t stream);

// d[m][n] (F32) = sum_k a[m][k] * w[n][k] (+ d[m][n] when accumulate), a
// [m][k] and w [n][k] both `dtype`, F32 accumulation in a fixed k order
// that depends on neither m nor the tile a row falls in: the
// batch-invariant GEMM used where cuBLASLt's bits vary with m.
cudaError_t LaunchFixedTileGemm(const void* a, const void* w, Dtype dtype, int32_t m, int32_t n,
                                int32_t k, float* d, bool accumulate, cudaStream_t stream);

// Per-row statistics of logits [rows][vocab] (F32) for the sampling view
// (sampling_view.h): the first id of the candidate order (max logit, NaN
// as -inf, lowest id on ties), its logit, and log(sum_i exp(double(l_i) -
// max)) in double, summed in a fixed tree order.
struct RowStats {
  int32_t argmax = 0;
  float max = 0;
  double log_sum = 0;
};
cudaError_t LaunchRowStats(const float* logits, int32_t rows, int32_t vocab, RowStats* out,
                           cudaStream_t stream);

// The largest K a device top-K returns per row.
inline constexpr int32_t kMaxDeviceTopK = 1024;

// Bytes of scratch LaunchRowTopK needs: 0 (each row's block selects in
// its own shared memory), so `workspace` may be null; kept so that a
// multi-block select can ask for scratch without an interface change.
size_t RowTopKWorkspaceBytes(int32_t rows, int32_t vocab);

// The first k (<= kMaxDeviceTopK, <= vocab) ids of each row in the
// candidate order (logit descending, NaN as -inf, ties by lower id), with
// their logits: ids [rows][k], values [rows][k].
cudaError_t LaunchRowTopK(const float* logits, int32_t rows, int32_t vocab, int32_t k,
                          void* workspace, int32_t* ids, float* values, cudaStream_t stream);

// KV transfer (issue #16, kv_transfer.cu; kv::DeviceKvAccess uses them).
// A frame of `count` tokens of one layer is K rows then V rows, [2][count]
// [kv_dim] elements of the pool's dtype (device_kv.h). Byte copies: the
// bits are the pool's. One kernel per launch.
//
// Token addressing of one paged side, passed by value as a kernel argument
// (no table copy to the device): ids[i] holds tokens [first_token + i *
// block_size, first_token + (i + 1) * block_size) of the sequence, i <
// n_blocks. first_token is a multiple of the pool's block_size; a longer
// range is launched in pieces by the caller (CudaKvStorage).
inline constexpr int32_t kKvSpanBlocks = 384;
struct KvBlockSpan {
  int32_t first_token = 0;
  int32_t n_blocks = 0;  // <= kKvSpanBlocks
  int32_t ids[kKvSpanBlocks] = {};
};

// k_dst[i][:] = K row and v_dst[i][:] = V row of token token_start + i of
// `layer` (addressed by `span`), i < count: device memory of count *
// kv.kv_dim elements of kv.dtype each (a whole frame: v_dst = k_dst +
// count rows). cudaErrorInvalidValue (nothing launched) for a layer
// outside [0, kv.n_layers), a span that does not hold every token of the
// range, a negative start or count, a null buffer. The block ids are the
// caller's to check (kv_copy_runs.h).
cudaError_t LaunchKvGather(const PagedKv& kv, int32_t layer, const KvBlockSpan& span,
                           int32_t token_start, int32_t count, void* k_dst, void* v_dst,
                           cudaStream_t stream);

// The reverse of LaunchKvGather: rows k_src / v_src into the pools. Same
// limits.
cudaError_t LaunchKvScatter(const PagedKv& kv, int32_t layer, const KvBlockSpan& span,
                            int32_t token_start, int32_t count, const void* k_src,
                            const void* v_src, cudaStream_t stream);

// Rows of tokens [token_start, token_start + count) of `layer` from the
// pools `src` (a peer's, mapped into this process) addressed by
// `src_span` into `dst` addressed by `dst_span` (token addressing on both
// sides: the block sizes may differ). Same limits, plus dtype and kv_dim
// equal on both sides and `layer` inside both.
cudaError_t LaunchKvCopyPeer(const PagedKv& src, const KvBlockSpan& src_span, const PagedKv& dst,
                             const KvBlockSpan& dst_span, int32_t layer, int32_t token_start,
                             int32_t count, cudaStream_t stream);

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_CUDA_KERNELS_H_
