// The CUDA backend's host side: start-up (weights, GEMM plans, activation
// arena, the warm-up forward that measures the activation peak, the memory
// plan, the KV pool), the forward over a flattened batch, decode steps as
// CUDA graphs, and the sampling reduction (only K values per sequence
// cross to the host). See cuda_backend.h for the contract.
#include "engine/backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/cuda_kv_storage.h"
#include "engine/backend/cuda/cuda_status.h"
#include "engine/backend/cuda/device_buffer.h"
#include "engine/backend/cuda/device_sampling.h"
#include "engine/backend/cuda/device_weights.h"
#include "engine/backend/cuda/gemm.h"

namespace tandem::backend::cuda {
namespace {

// Returns the status of `expr` when it is not OK.
#define TANDEM_CUDA_RETURN_IF_ERROR(expr)            \
  do {                                               \
    absl::Status tandem_status_ = (expr);            \
    if (!tandem_status_.ok()) return tandem_status_; \
  } while (0)

// Caller bugs (model_backend.h's preconditions) abort, as on the CPU: a bad
// block id or token id would make a kernel read outside its buffers.
void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "CudaBackend::Forward: precondition failed: %s\n", what);
    std::abort();
  }
}

// Page-locked host memory (cudaHostAlloc) for the asynchronous copies,
// allocated at start-up and freed at destruction only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  [[nodiscard]] absl::Status Allocate(size_t bytes, const char* what) {
    if (bytes == 0) return absl::OkStatus();
    return CudaStatus(cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault),
                      absl::StrCat("cudaHostAlloc of ", bytes, " bytes for ", what));
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

// Offsets (in int32 elements) of the step metadata in the device buffer:
// token ids, positions, token -> sequence, the rows wanting logits, the
// block tables [n_seqs][max_blocks_per_seq]. A pure function of the counts,
// so a CUDA graph captured for bucket B (n_tokens = n_rows = n_seqs = B)
// reads the same addresses at every replay.
struct MetaLayout {
  size_t tokens = 0, pos = 0, seq = 0, rows = 0, tables = 0, total = 0;
};
MetaLayout Layout(int32_t n_tokens, int32_t n_rows, int32_t n_seqs, int32_t max_blocks) {
  MetaLayout m;
  const size_t t = static_cast<size_t>(n_tokens);
  m.tokens = 0;
  m.pos = t;
  m.seq = 2 * t;
  m.rows = 3 * t;
  m.tables = 3 * t + static_cast<size_t>(n_rows);
  m.total = m.tables + static_cast<size_t>(n_seqs) * static_cast<size_t>(max_blocks);
  return m;
}

// Profiling categories (ForwardProfile). A CUDA graph holds no event
// marks: its replay counts in total_ms only.
enum Category : int { kGemm, kAttention, kOther, kGraph, kEnd };

}  // namespace

struct CudaBackend::Impl {
  const model::LlamaModel* model = nullptr;
  model::LlamaConfig config;
  BackendOptions options;
  int32_t device = 0;
  int32_t compute_capability = 0;
  std::string bit_exact_class;

  cudaStream_t stream = nullptr;
  DeviceWeights weights;
  std::unique_ptr<GemmRunner> gemm;

  // Dimensions.
  int32_t q_dim = 0, kv_dim = 0, qkv_dim = 0, act_dim = 0;
  int32_t max_tokens = 0;  // max_num_batched_tokens
  int32_t max_rows = 0;    // logit rows: min(max_num_seqs, max_tokens)
  int32_t max_seqs = 0;    // entries of one batch
  int32_t max_blocks_per_seq = 0;
  float attn_scale = 1.0f;

  // The activation arena.
  DeviceBuffer x, act, qkv, gate_up, logits, attn_ws, topk_ws, row_stats, topk_ids, topk_values,
      meta;
  uint64_t arena_bytes = 0;
  PinnedBuffer host_meta, host_stats, host_ids, host_values, host_logits;

  std::unique_ptr<CudaKvStorage> kv;
  GpuMemoryPlan plan;

  std::vector<cudaEvent_t> layer_events;
  cudaEvent_t done_event = nullptr;
  std::map<int32_t, cudaGraphExec_t> graphs;  // bucket -> executable graph
  bool use_graphs = true;

  bool lost = false;
  std::string lost_message;
  int64_t host_fallbacks = 0;
  int32_t last_rows = 0;

  // Per step, reused.
  std::vector<DeviceRowPlan> row_plans;
  std::vector<int32_t> sampled_entries;  // batch index of each sampled row
  std::vector<int32_t> retry;            // rows whose first fetch was too short
  std::vector<float> scratch;

  // Profiling: marks[i] starts an interval of category mark_cats[i].
  bool profiling = false;
  ForwardProfile prof;
  std::vector<cudaEvent_t> marks;
  std::vector<int> mark_cats;
  size_t n_marks = 0;

  ~Impl() {
    cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (auto& [bucket, exec] : graphs) cudaGraphExecDestroy(exec);
    for (cudaEvent_t e : layer_events) cudaEventDestroy(e);
    for (cudaEvent_t e : marks) cudaEventDestroy(e);
    if (done_event != nullptr) cudaEventDestroy(done_event);
    kv.reset();
    gemm.reset();
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // CUDA status of `error`; a sticky error marks the device lost.
  [[nodiscard]] absl::Status Check(cudaError_t error, std::string_view what) {
    if (error != cudaSuccess && IsStickyCudaError(error)) MarkLost(CudaStatus(error, what));
    return CudaStatus(error, what);
  }
  // A failed status from a component (GEMM, launches): asks the stream
  // whether the context is gone, so a sticky error behind a cuBLAS status
  // still marks the device lost.
  [[nodiscard]] absl::Status Fail(absl::Status status) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (IsStickyCudaError(e)) MarkLost(status);
    return status;
  }
  void MarkLost(const absl::Status& status) {
    if (!lost) lost_message = std::string(status.message());
    lost = true;
  }
  // INTERNAL "[sticky]" once the device was lost, else OK.
  [[nodiscard]] absl::Status LostError() const {
    if (!lost) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("the CUDA device was lost earlier: ", lost_message, " [sticky]"));
  }
  // Closes (and drops) a graph capture an error left open on `stream`.
  void EndOpenCapture() {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capturing) == cudaSuccess &&
        capturing != cudaStreamCaptureStatusNone) {
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(stream, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
  }
  [[nodiscard]] absl::Status Launch(cudaError_t error, const char* what) {
    return Check(error, what);
  }
  [[nodiscard]] absl::Status Gemm(const void* a, const DeviceMatrix& w, int32_t m, float* out,
                                  bool accumulate) {
    absl::Status s = gemm->Run(a, w.data, m, w.rows, w.cols, out, accumulate, stream);
    return s.ok() ? s : Fail(s);
  }

  [[nodiscard]] absl::Status Mark(int category) {
    if (!profiling) return absl::OkStatus();
    if (n_marks == marks.size()) {
      cudaEvent_t e = nullptr;
      TANDEM_CUDA_RETURN_IF_ERROR(Check(cudaEventCreate(&e), "cudaEventCreate (profiling)"));
      marks.push_back(e);
      mark_cats.push_back(kEnd);
    }
    mark_cats[n_marks] = category;
    TANDEM_CUDA_RETURN_IF_ERROR(
        Check(cudaEventRecord(marks[n_marks], stream), "cudaEventRecord (profiling)"));
    ++n_marks;
    return absl::OkStatus();
  }
  // After the step's events completed: adds the intervals to prof.
  [[nodiscard]] absl::Status CollectProfile() {
    if (!profiling || n_marks < 2) return absl::OkStatus();
    for (size_t i = 0; i + 1 < n_marks; ++i) {
      float ms = 0;
      TANDEM_CUDA_RETURN_IF_ERROR(
          Check(cudaEventElapsedTime(&ms, marks[i], marks[i + 1]), "cudaEventElapsedTime"));
      switch (mark_cats[i]) {
        case kGemm:
          prof.gemm_ms += ms;
          break;
        case kAttention:
          prof.attention_ms += ms;
          break;
        case kGraph:
          break;
        default:
          prof.other_ms += ms;
          break;
      }
    }
    float total = 0;
    TANDEM_CUDA_RETURN_IF_ERROR(
        Check(cudaEventElapsedTime(&total, marks[0], marks[n_marks - 1]), "cudaEventElapsedTime"));
    prof.total_ms += total;
    ++prof.forwards;
    return absl::OkStatus();
  }

  [[nodiscard]] absl::Status Allocate(DeviceBuffer* buffer, size_t bytes, const char* what) {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes, what);
    if (!b.ok()) return b.status();
    *buffer = *std::move(b);
    arena_bytes += bytes;
    return absl::OkStatus();
  }
  [[nodiscard]] absl::Status AllocateArena();

  // The step's packing into host_meta; returns the layout. `bucket` > 0:
  // a graph step padded to `bucket` rows.
  MetaLayout Pack(std::span<const ForwardEntry> batch, const CudaKvStorage& storage,
                  int32_t n_tokens, int32_t n_rows, int32_t bucket);
  BatchMeta MetaFor(const MetaLayout& m, int32_t n_tokens, int32_t n_seqs) const {
    const int32_t* base = meta.as<int32_t>();
    BatchMeta b;
    b.n_tokens = n_tokens;
    b.n_seqs = n_seqs;
    b.token_seq = base + m.seq;
    b.token_pos = base + m.pos;
    b.block_tables = base + m.tables;
    b.max_blocks_per_seq = max_blocks_per_seq;
    return b;
  }
  // Every layer, then the logits of the n_rows rows listed at m.rows.
  [[nodiscard]] absl::Status EnqueueForward(const MetaLayout& m, const BatchMeta& b, int32_t n_rows,
                                            const CudaKvStorage& storage, int32_t max_context,
                                            bool record_layer_events);
  // Captures and instantiates the graph of `bucket` unless it exists.
  [[nodiscard]] absl::Status CaptureGraph(int32_t bucket, const CudaKvStorage& storage);
  [[nodiscard]] absl::Status RunGraph(int32_t bucket, const MetaLayout& m,
                                      const CudaKvStorage& storage);

  [[nodiscard]] absl::Status Step(std::span<const ForwardEntry> batch, const LayerHook* hook,
                                  std::vector<sampling::SamplingView>* views,
                                  CudaKvStorage& storage);
  void PlanRows(std::span<const ForwardEntry> batch);
  // The sampling reduction of the step's sampled rows (row_plans): row
  // statistics and the first fetch_k ids of each row on the device, the
  // rows sampled on the host copied whole; FinishViews builds the views
  // once the step's event has completed.
  [[nodiscard]] absl::Status EnqueueReduction(int32_t fetch_k);
  [[nodiscard]] absl::Status EnqueueTopK(int32_t k);
  [[nodiscard]] absl::Status EnqueueRowCopy(int32_t r);
  [[nodiscard]] absl::Status FinishViews(std::span<const ForwardEntry> batch, int32_t fetch_k,
                                         std::vector<sampling::SamplingView>* views);
  bool BuildRow(std::span<const ForwardEntry> batch, int32_t r, int32_t fetched,
                sampling::SamplingView* view) const;
  void BuildRowOnHost(std::span<const ForwardEntry> batch, int32_t r, sampling::SamplingView* view);
  [[nodiscard]] absl::Status WarmUp(uint64_t* growth_bytes);
};

absl::Status CudaBackend::Impl::AllocateArena() {
  const size_t T = static_cast<size_t>(max_tokens);
  const size_t L = static_cast<size_t>(max_rows);
  const size_t elem = kv::KvDtypeBytes(weights.dtype);
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  TANDEM_CUDA_RETURN_IF_ERROR(
      Allocate(&x, T * static_cast<size_t>(config.n_embd) * sizeof(float), "residual x"));
  TANDEM_CUDA_RETURN_IF_ERROR(
      Allocate(&act, T * static_cast<size_t>(act_dim) * elem, "GEMM inputs"));
  TANDEM_CUDA_RETURN_IF_ERROR(
      Allocate(&qkv, T * static_cast<size_t>(qkv_dim) * sizeof(float), "QKV rows"));
  TANDEM_CUDA_RETURN_IF_ERROR(
      Allocate(&gate_up, T * 2 * static_cast<size_t>(config.n_ff) * sizeof(float), "gate/up rows"));
  TANDEM_CUDA_RETURN_IF_ERROR(Allocate(&logits, L * vocab * sizeof(float), "logits"));
  TANDEM_CUDA_RETURN_IF_ERROR(
      Allocate(&attn_ws,
               PagedAttentionWorkspaceBytes(max_tokens, config.n_head, config.head_dim,
                                            config.context_length),
               "attention workspace"));
  TANDEM_CUDA_RETURN_IF_ERROR(
      Allocate(&topk_ws, RowTopKWorkspaceBytes(max_rows, config.vocab_size), "top-K workspace"));
  TANDEM_CUDA_RETURN_IF_ERROR(Allocate(&row_stats, L * sizeof(RowStats), "row statistics"));
  const size_t topk = L * static_cast<size_t>(kMaxDeviceTopK);
  TANDEM_CUDA_RETURN_IF_ERROR(Allocate(&topk_ids, topk * sizeof(int32_t), "top-K ids"));
  TANDEM_CUDA_RETURN_IF_ERROR(Allocate(&topk_values, topk * sizeof(float), "top-K values"));
  const size_t meta_ints = Layout(max_tokens, max_rows, max_seqs, max_blocks_per_seq).total;
  TANDEM_CUDA_RETURN_IF_ERROR(Allocate(&meta, meta_ints * sizeof(int32_t), "step metadata"));

  TANDEM_CUDA_RETURN_IF_ERROR(host_meta.Allocate(meta_ints * sizeof(int32_t), "step metadata"));
  TANDEM_CUDA_RETURN_IF_ERROR(host_stats.Allocate(L * sizeof(RowStats), "row statistics"));
  TANDEM_CUDA_RETURN_IF_ERROR(host_ids.Allocate(topk * sizeof(int32_t), "top-K ids"));
  TANDEM_CUDA_RETURN_IF_ERROR(host_values.Allocate(topk * sizeof(float), "top-K values"));
  TANDEM_CUDA_RETURN_IF_ERROR(
      host_logits.Allocate(L * vocab * sizeof(float), "logit rows sampled on the host"));
  return absl::OkStatus();
}

MetaLayout CudaBackend::Impl::Pack(std::span<const ForwardEntry> batch,
                                   const CudaKvStorage& storage, int32_t n_tokens, int32_t n_rows,
                                   int32_t bucket) {
  const int32_t n_seqs = bucket > 0 ? bucket : static_cast<int32_t>(batch.size());
  const int32_t padded_tokens = bucket > 0 ? bucket : n_tokens;
  const int32_t padded_rows = bucket > 0 ? bucket : n_rows;
  const MetaLayout m = Layout(padded_tokens, padded_rows, n_seqs, max_blocks_per_seq);
  int32_t* h = host_meta.as<int32_t>();
  const int32_t scratch_block = storage.scratch_block();
  const int32_t mb = max_blocks_per_seq;
  int32_t t = 0, r = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const ForwardEntry& entry = batch[e];
    const int32_t n = static_cast<int32_t>(entry.tokens.size());
    for (int32_t i = 0; i < n; ++i, ++t) {
      h[m.tokens + t] = entry.tokens[static_cast<size_t>(i)];
      h[m.pos + t] = entry.start_pos + i;
      h[m.seq + t] = static_cast<int32_t>(e);
    }
    if (entry.sampling != nullptr) h[m.rows + r++] = t - 1;
    // The blocks covering positions [0, start_pos + n) (<= mb, as
    // start_pos + n <= context_length); the rest name the scratch block.
    int32_t* row = h + m.tables + e * static_cast<size_t>(mb);
    const std::vector<int32_t>& table = *entry.block_table;
    const int32_t used = kv::BlocksForTokens(entry.start_pos + n, storage.shape().block_size);
    std::copy(table.begin(), table.begin() + used, row);
    std::fill(row + used, row + mb, scratch_block);
  }
  // Graph padding: token 0 at position 0 of its own sequence, whose table
  // names only the scratch block; its logits row is computed, never read.
  for (; t < padded_tokens; ++t, ++r) {
    h[m.tokens + t] = 0;
    h[m.pos + t] = 0;
    h[m.seq + t] = t;
    h[m.rows + r] = t;
    std::fill(h + m.tables + static_cast<size_t>(t) * mb,
              h + m.tables + static_cast<size_t>(t + 1) * mb, scratch_block);
  }
  return m;
}

absl::Status CudaBackend::Impl::EnqueueForward(const MetaLayout& m, const BatchMeta& b,
                                               int32_t n_rows, const CudaKvStorage& storage,
                                               int32_t max_context, bool record_layer_events) {
  const model::LlamaConfig& c = config;
  const int32_t T = b.n_tokens;
  const int32_t* base = meta.as<int32_t>();
  const Dtype dt = weights.dtype;
  const PagedKv& paged = storage.paged();
  const float* freq_factors = c.rope_freq_factors ? weights.rope_freqs : nullptr;
  float* xf = x.as<float>();
  float* qkvf = qkv.as<float>();
  float* guf = gate_up.as<float>();

  TANDEM_CUDA_RETURN_IF_ERROR(Mark(kOther));
  TANDEM_CUDA_RETURN_IF_ERROR(
      Launch(LaunchEmbedding(base + m.tokens, T, weights.token_embd.data, dt, c.n_embd, xf, stream),
             "embedding"));
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const DeviceLayer& w = weights.layers[static_cast<size_t>(l)];
    TANDEM_CUDA_RETURN_IF_ERROR(Launch(
        LaunchRmsNorm(xf, nullptr, T, c.n_embd, w.attn_norm, c.rms_norm_eps, act.get(), dt, stream),
        "attention RMSNorm"));
    TANDEM_CUDA_RETURN_IF_ERROR(Mark(kGemm));
    TANDEM_CUDA_RETURN_IF_ERROR(Gemm(act.get(), w.wqkv, T, qkvf, false));
    TANDEM_CUDA_RETURN_IF_ERROR(Mark(kOther));
    TANDEM_CUDA_RETURN_IF_ERROR(
        Launch(LaunchBiasRope(qkvf, T, b.token_pos, w.bqkv, c.n_head, c.n_head_kv, c.head_dim,
                              c.rope_dim, c.rope_type, c.rope_freq_base, freq_factors, stream),
               "bias and RoPE"));
    TANDEM_CUDA_RETURN_IF_ERROR(
        Launch(LaunchKvWrite(qkvf, q_dim, b, paged, l, stream), "KV write"));
    if (record_layer_events) {
      TANDEM_CUDA_RETURN_IF_ERROR(
          Check(cudaEventRecord(layer_events[static_cast<size_t>(l)], stream),
                "cudaEventRecord (layer)"));
    }
    TANDEM_CUDA_RETURN_IF_ERROR(Mark(kAttention));
    TANDEM_CUDA_RETURN_IF_ERROR(
        Launch(LaunchPagedAttention(qkvf, b, paged, l, c.n_head, c.n_head_kv, c.head_dim,
                                    attn_scale, max_context, attn_ws.get(), act.get(), dt, stream),
               "paged attention"));
    TANDEM_CUDA_RETURN_IF_ERROR(Mark(kGemm));
    TANDEM_CUDA_RETURN_IF_ERROR(Gemm(act.get(), w.wo, T, xf, true));
    TANDEM_CUDA_RETURN_IF_ERROR(Mark(kOther));
    TANDEM_CUDA_RETURN_IF_ERROR(Launch(
        LaunchRmsNorm(xf, nullptr, T, c.n_embd, w.ffn_norm, c.rms_norm_eps, act.get(), dt, stream),
        "FFN RMSNorm"));
    TANDEM_CUDA_RETURN_IF_ERROR(Mark(kGemm));
    TANDEM_CUDA_RETURN_IF_ERROR(Gemm(act.get(), w.w_gate_up, T, guf, false));
    TANDEM_CUDA_RETURN_IF_ERROR(Mark(kOther));
    TANDEM_CUDA_RETURN_IF_ERROR(
        Launch(LaunchSwiGlu(guf, T, c.n_ff, act.get(), dt, stream), "SwiGLU"));
    TANDEM_CUDA_RETURN_IF_ERROR(Mark(kGemm));
    TANDEM_CUDA_RETURN_IF_ERROR(Gemm(act.get(), w.w_down, T, xf, true));
    TANDEM_CUDA_RETURN_IF_ERROR(Mark(kOther));
  }
  if (n_rows == 0) return absl::OkStatus();
  TANDEM_CUDA_RETURN_IF_ERROR(
      Launch(LaunchRmsNorm(xf, base + m.rows, n_rows, c.n_embd, weights.output_norm, c.rms_norm_eps,
                           act.get(), dt, stream),
             "output RMSNorm"));
  TANDEM_CUDA_RETURN_IF_ERROR(Mark(kGemm));
  TANDEM_CUDA_RETURN_IF_ERROR(Gemm(act.get(), weights.output, n_rows, logits.as<float>(), false));
  return Mark(kOther);
}

absl::Status CudaBackend::Impl::CaptureGraph(int32_t bucket, const CudaKvStorage& storage) {
  if (graphs.count(bucket) != 0) return absl::OkStatus();
  // Every kernel reads the fixed metadata addresses of Layout(bucket,
  // bucket, bucket) and sizes attention for the whole context, so the
  // graph serves every later step of the bucket (the metadata is copied
  // before each launch). Thread-local capture: the KV copy stream of
  // another thread is not affected.
  const MetaLayout m = Layout(bucket, bucket, bucket, max_blocks_per_seq);
  TANDEM_CUDA_RETURN_IF_ERROR(Check(
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture"));
  const bool was_profiling = profiling;
  profiling = false;  // no event marks inside a graph
  absl::Status enqueued =
      EnqueueForward(m, MetaFor(m, bucket, bucket), bucket, storage, config.context_length, false);
  profiling = was_profiling;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!enqueued.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return enqueued;
  }
  TANDEM_CUDA_RETURN_IF_ERROR(Check(ended, "cudaStreamEndCapture"));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  TANDEM_CUDA_RETURN_IF_ERROR(Check(instantiated, "cudaGraphInstantiate"));
  graphs.emplace(bucket, exec);
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::RunGraph(int32_t bucket, const MetaLayout& m,
                                         const CudaKvStorage& storage) {
  // A bucket not captured up front (CaptureGraphs) is captured at its
  // first step.
  (void)m;  // the graph reads Layout(bucket, bucket, bucket), which m is
  TANDEM_CUDA_RETURN_IF_ERROR(CaptureGraph(bucket, storage));
  auto it = graphs.find(bucket);
  TANDEM_CUDA_RETURN_IF_ERROR(Mark(kGraph));
  TANDEM_CUDA_RETURN_IF_ERROR(Check(cudaGraphLaunch(it->second, stream), "cudaGraphLaunch"));
  TANDEM_CUDA_RETURN_IF_ERROR(Mark(kOther));
  // The graph holds no layer events; every layer is complete when it ends.
  for (cudaEvent_t e : layer_events) {
    TANDEM_CUDA_RETURN_IF_ERROR(Check(cudaEventRecord(e, stream), "cudaEventRecord (layer)"));
  }
  return absl::OkStatus();
}

void CudaBackend::Impl::PlanRows(std::span<const ForwardEntry> batch) {
  row_plans.clear();
  sampled_entries.clear();
  for (size_t e = 0; e < batch.size(); ++e) {
    if (batch[e].sampling == nullptr) continue;
    row_plans.push_back(PlanDeviceRow(*batch[e].sampling, batch[e].history, config.vocab_size));
    sampled_entries.push_back(static_cast<int32_t>(e));
  }
}

absl::Status CudaBackend::Impl::EnqueueTopK(int32_t k) {
  const int32_t n_rows = static_cast<int32_t>(row_plans.size());
  TANDEM_CUDA_RETURN_IF_ERROR(
      Launch(LaunchRowTopK(logits.as<float>(), n_rows, config.vocab_size, k, topk_ws.get(),
                           topk_ids.as<int32_t>(), topk_values.as<float>(), stream),
             "top-K"));
  const size_t n = static_cast<size_t>(n_rows) * static_cast<size_t>(k);
  TANDEM_CUDA_RETURN_IF_ERROR(
      Check(cudaMemcpyAsync(host_ids.get(), topk_ids.get(), n * sizeof(int32_t),
                            cudaMemcpyDeviceToHost, stream),
            "copy of top-K ids"));
  return Check(cudaMemcpyAsync(host_values.get(), topk_values.get(), n * sizeof(float),
                               cudaMemcpyDeviceToHost, stream),
               "copy of top-K values");
}

absl::Status CudaBackend::Impl::EnqueueRowCopy(int32_t r) {
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  const size_t off = static_cast<size_t>(r) * vocab;
  return Check(cudaMemcpyAsync(host_logits.as<float>() + off, logits.as<float>() + off,
                               vocab * sizeof(float), cudaMemcpyDeviceToHost, stream),
               "copy of a logit row sampled on the host");
}

absl::Status CudaBackend::Impl::EnqueueReduction(int32_t fetch_k) {
  const int32_t n_rows = static_cast<int32_t>(row_plans.size());
  if (n_rows == 0) return absl::OkStatus();
  TANDEM_CUDA_RETURN_IF_ERROR(Mark(kOther));
  TANDEM_CUDA_RETURN_IF_ERROR(Launch(LaunchRowStats(logits.as<float>(), n_rows, config.vocab_size,
                                                    row_stats.as<RowStats>(), stream),
                                     "row statistics"));
  TANDEM_CUDA_RETURN_IF_ERROR(Check(cudaMemcpyAsync(host_stats.get(), row_stats.get(),
                                                    static_cast<size_t>(n_rows) * sizeof(RowStats),
                                                    cudaMemcpyDeviceToHost, stream),
                                    "copy of row statistics"));
  if (fetch_k > 0) TANDEM_CUDA_RETURN_IF_ERROR(EnqueueTopK(fetch_k));
  for (int32_t r = 0; r < n_rows; ++r) {
    if (row_plans[static_cast<size_t>(r)].mode == DeviceRowMode::kHost) {
      TANDEM_CUDA_RETURN_IF_ERROR(EnqueueRowCopy(r));
    }
  }
  return absl::OkStatus();
}

bool CudaBackend::Impl::BuildRow(std::span<const ForwardEntry> batch, int32_t r, int32_t fetched,
                                 sampling::SamplingView* view) const {
  const ForwardEntry& e = batch[static_cast<size_t>(sampled_entries[static_cast<size_t>(r)])];
  const size_t off = static_cast<size_t>(r) * static_cast<size_t>(fetched);
  return BuildViewFromTopK(
      row_plans[static_cast<size_t>(r)], *e.sampling, host_stats.as<RowStats>()[r],
      fetched > 0 ? host_ids.as<int32_t>() + off : nullptr,
      fetched > 0 ? host_values.as<float>() + off : nullptr, fetched, config.vocab_size, view);
}

void CudaBackend::Impl::BuildRowOnHost(std::span<const ForwardEntry> batch, int32_t r,
                                       sampling::SamplingView* view) {
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  const ForwardEntry& e = batch[static_cast<size_t>(sampled_entries[static_cast<size_t>(r)])];
  sampling::BuildSamplingView(
      std::span<const float>(host_logits.as<float>() + static_cast<size_t>(r) * vocab, vocab),
      *e.sampling, e.history, view, &scratch);
  ++host_fallbacks;
}

absl::Status CudaBackend::Impl::FinishViews(std::span<const ForwardEntry> batch, int32_t fetch_k,
                                            std::vector<sampling::SamplingView>* views) {
  const int32_t n_rows = static_cast<int32_t>(row_plans.size());
  views->resize(static_cast<size_t>(n_rows));
  retry.clear();
  for (int32_t r = 0; r < n_rows; ++r) {
    sampling::SamplingView* view = &(*views)[static_cast<size_t>(r)];
    if (row_plans[static_cast<size_t>(r)].mode == DeviceRowMode::kHost) {
      BuildRowOnHost(batch, r, view);
    } else if (!BuildRow(batch, r, fetch_k, view)) {
      retry.push_back(r);
    }
  }
  if (retry.empty()) return absl::OkStatus();

  // Rare: a min_p view wider than the first fetch, or temperature ties at
  // its edge. Fetch the most the device gives, and the rows themselves in
  // case even that is not enough.
  const int32_t wide = std::min(config.vocab_size, kMaxDeviceTopK);
  if (wide > fetch_k) TANDEM_CUDA_RETURN_IF_ERROR(EnqueueTopK(wide));
  for (int32_t r : retry) TANDEM_CUDA_RETURN_IF_ERROR(EnqueueRowCopy(r));
  TANDEM_CUDA_RETURN_IF_ERROR(Check(cudaEventRecord(done_event, stream), "cudaEventRecord"));
  TANDEM_CUDA_RETURN_IF_ERROR(Check(cudaEventSynchronize(done_event), "sampling"));
  for (int32_t r : retry) {
    sampling::SamplingView* view = &(*views)[static_cast<size_t>(r)];
    if (wide <= fetch_k || !BuildRow(batch, r, wide, view)) BuildRowOnHost(batch, r, view);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::Step(std::span<const ForwardEntry> batch, const LayerHook* hook,
                                     std::vector<sampling::SamplingView>* views,
                                     CudaKvStorage& storage) {
  // Validation (preconditions) and counts.
  int32_t n_tokens = 0, n_rows = 0, max_context = 0;
  bool decode_only = !batch.empty();
  const int32_t block_size = storage.shape().block_size;
  for (const ForwardEntry& e : batch) {
    const int32_t n = static_cast<int32_t>(e.tokens.size());
    Require(e.block_table != nullptr, "block_table is null");
    Require(e.start_pos >= 0, "start_pos < 0");
    Require(static_cast<int64_t>(e.block_table->size()) * block_size >=
                static_cast<int64_t>(e.start_pos) + n,
            "block table does not cover start_pos + n_tokens");
    Require(e.start_pos + n <= config.context_length, "positions beyond the context length");
    // The blocks the kernels may read: those holding positions
    // [0, start_pos + n). Pack copies exactly these.
    const int32_t covering = kv::BlocksForTokens(e.start_pos + n, block_size);
    for (int32_t i = 0; i < covering; ++i) {
      const int32_t b = (*e.block_table)[static_cast<size_t>(i)];
      Require(b >= 0 && b < storage.num_blocks(), "block id outside the KV pool");
    }
    for (int32_t t : e.tokens) {
      Require(t >= 0 && t < config.vocab_size, "token id outside [0, vocab_size)");
    }
    Require(e.sampling == nullptr || n > 0, "an entry with sampling has no token");
    n_tokens += n;
    n_rows += e.sampling != nullptr ? 1 : 0;
    if (n > 0) max_context = std::max(max_context, e.start_pos + n);
    decode_only = decode_only && n == 1 && e.sampling != nullptr;
  }
  if (n_tokens > max_tokens || n_rows > max_rows || static_cast<int32_t>(batch.size()) > max_seqs) {
    return absl::InternalError(
        absl::StrCat("batch of ", n_tokens, " tokens, ", n_rows, " sampled rows and ", batch.size(),
                     " sequences exceeds the CUDA backend's sizes (engine.max_num_batched_tokens ",
                     max_tokens, ", engine.max_num_seqs ", max_rows, ")"));
  }
  PlanRows(batch);
  int32_t fetch_k = 0;
  for (const DeviceRowPlan& p : row_plans) fetch_k = std::max(fetch_k, p.fetch);
  fetch_k = std::min(fetch_k, config.vocab_size);

  n_marks = 0;
  if (n_tokens > 0) {
    const int32_t cap = std::min(max_rows, max_tokens);
    const bool graph = use_graphs && decode_only && n_tokens <= cap;
    const int32_t bucket = graph ? GraphBucket(n_tokens, cap) : 0;
    const MetaLayout m = Pack(batch, storage, n_tokens, n_rows, bucket);
    TANDEM_CUDA_RETURN_IF_ERROR(Mark(kOther));
    TANDEM_CUDA_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(meta.get(), host_meta.get(), m.total * sizeof(int32_t),
                              cudaMemcpyHostToDevice, stream),
              "copy of the step metadata"));
    if (graph) {
      TANDEM_CUDA_RETURN_IF_ERROR(RunGraph(bucket, m, storage));
    } else {
      const BatchMeta b = MetaFor(m, n_tokens, static_cast<int32_t>(batch.size()));
      TANDEM_CUDA_RETURN_IF_ERROR(EnqueueForward(m, b, n_rows, storage, max_context, true));
    }
  }
  last_rows = n_rows;
  TANDEM_CUDA_RETURN_IF_ERROR(EnqueueReduction(fetch_k));
  TANDEM_CUDA_RETURN_IF_ERROR(Mark(kEnd));
  TANDEM_CUDA_RETURN_IF_ERROR(Check(cudaEventRecord(done_event, stream), "cudaEventRecord"));

  // The hook, layer by layer, once everything is enqueued:
  // CudaKvStorage::ReadTokens waits for the layer's event, so the copies of
  // layer l overlap the layers after it.
  if (hook != nullptr && *hook) {
    for (int32_t l = 0; l < config.n_layers; ++l) {
      for (size_t e = 0; e < batch.size(); ++e) {
        (*hook)(e, l, batch[e].start_pos, static_cast<int32_t>(batch[e].tokens.size()));
      }
    }
  }
  TANDEM_CUDA_RETURN_IF_ERROR(Check(cudaEventSynchronize(done_event), "forward"));
  TANDEM_CUDA_RETURN_IF_ERROR(CollectProfile());
  return FinishViews(batch, fetch_k, views);
}

absl::Status CudaBackend::Impl::WarmUp(uint64_t* growth_bytes) {
  // max_num_batched_tokens tokens in sequences of at most the context
  // length, on a temporary pool just big enough.
  const int32_t bs = options.block_size;
  const int32_t ctx = config.context_length;
  std::vector<int32_t> lengths;
  for (int32_t left = max_tokens; left > 0; left -= std::min(left, ctx)) {
    lengths.push_back(std::min(left, ctx));
  }
  int32_t blocks = 0;
  for (int32_t n : lengths) blocks += kv::BlocksForTokens(n, bs);
  absl::StatusOr<std::unique_ptr<CudaKvStorage>> temp =
      CudaKvStorage::Create(model->kv_shape(bs), options.kv_cache_dtype, blocks);
  if (!temp.ok()) return temp.status();

  std::vector<std::vector<int32_t>> tables(lengths.size());
  std::vector<std::vector<int32_t>> tokens(lengths.size());
  std::vector<ForwardEntry> batch(lengths.size());
  sampling::SamplingOptions widest;
  widest.temperature = 1.0f;
  widest.top_k = std::min(kMaxDeviceTopK, config.vocab_size);
  widest.top_logprobs = sampling::kMaxTopLogprobs;
  int32_t next_block = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    for (int32_t b = 0; b < kv::BlocksForTokens(lengths[i], bs); ++b) {
      tables[i].push_back(next_block++);
    }
    tokens[i].assign(static_cast<size_t>(lengths[i]), 0);
    batch[i].tokens = tokens[i];
    batch[i].start_pos = 0;
    batch[i].block_table = &tables[i];
    batch[i].sampling = static_cast<int32_t>(i) < max_rows ? &widest : nullptr;
  }
  size_t free_before = 0, free_after = 0, total = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(Check(cudaMemGetInfo(&free_before, &total), "cudaMemGetInfo"));
  std::vector<sampling::SamplingView> views;
  // No graph: one would hold the temporary pool's addresses (a warm-up of
  // one token is a decode step).
  const bool graphs_on = use_graphs;
  use_graphs = false;
  absl::Status stepped = Step(batch, nullptr, &views, **temp);
  use_graphs = graphs_on;
  TANDEM_CUDA_RETURN_IF_ERROR(stepped);
  TANDEM_CUDA_RETURN_IF_ERROR(Check(cudaStreamSynchronize(stream), "warm-up forward"));
  TANDEM_CUDA_RETURN_IF_ERROR(Check(cudaMemGetInfo(&free_after, &total), "cudaMemGetInfo"));
  *growth_bytes = free_before > free_after ? free_before - free_after : 0;
  host_fallbacks = 0;
  return absl::OkStatus();
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const model::LlamaModel& model,
                                                                 const BackendOptions& options) {
  const std::string device_name = options.device.ToString();
  if (!options.device.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine.device: the CUDA backend needs cuda:N, got ", device_name));
  }
  if (options.max_num_batched_tokens < 1 || options.max_num_seqs < 1 || options.block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA backend needs engine.max_num_batched_tokens, engine.max_num_seqs and "
        "engine.block_size >= 1, got ",
        options.max_num_batched_tokens, ", ", options.max_num_seqs, ", ", options.block_size));
  }
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.model = &model;
  s.config = model.config();
  s.options = options;
  s.device = options.device.index;
  const model::LlamaConfig& c = s.config;

  if (cudaError_t e = cudaSetDevice(s.device); e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("engine.device: ", device_name, ": ",
                                                      CudaStatus(e, "cudaSetDevice").message()));
  }
  size_t free_start = 0, total = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(s.Check(cudaMemGetInfo(&free_start, &total), "cudaMemGetInfo"));
  cudaDeviceProp prop{};
  TANDEM_CUDA_RETURN_IF_ERROR(
      s.Check(cudaGetDeviceProperties(&prop, s.device), "cudaGetDeviceProperties"));
  s.compute_capability = prop.major * 10 + prop.minor;
  TANDEM_CUDA_RETURN_IF_ERROR(
      s.Check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate"));

  absl::StatusOr<DeviceWeights> weights = UploadWeights(model, options.keep_f32_weights, s.stream);
  if (!weights.ok()) return weights.status();
  s.weights = *std::move(weights);

  s.q_dim = c.n_head * c.head_dim;
  s.kv_dim = c.n_head_kv * c.head_dim;
  s.qkv_dim = s.q_dim + 2 * s.kv_dim;
  s.act_dim = std::max({c.n_embd, s.q_dim, c.n_ff});
  s.max_tokens = options.max_num_batched_tokens;
  s.max_rows = std::min(options.max_num_seqs, s.max_tokens);
  const int32_t warm_seqs = (s.max_tokens + c.context_length - 1) / std::max(c.context_length, 1);
  s.max_seqs = std::max(options.max_num_seqs, warm_seqs);
  s.max_blocks_per_seq = kv::BlocksForTokens(c.context_length, options.block_size);
  s.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  std::vector<std::pair<int32_t, int32_t>> shapes;
  for (std::pair<int32_t, int32_t> shape :
       {std::pair{s.qkv_dim, c.n_embd}, std::pair{c.n_embd, s.q_dim},
        std::pair{2 * c.n_ff, c.n_embd}, std::pair{c.n_embd, c.n_ff},
        std::pair{c.vocab_size, c.n_embd}}) {
    if (std::find(shapes.begin(), shapes.end(), shape) == shapes.end()) shapes.push_back(shape);
  }
  absl::StatusOr<std::unique_ptr<GemmRunner>> gemm =
      GemmRunner::Create(s.weights.dtype, shapes, s.max_tokens, options.batch_invariant, s.stream);
  if (!gemm.ok()) return gemm.status();
  s.gemm = *std::move(gemm);
  if (options.batch_invariant) {
    TANDEM_CUDA_RETURN_IF_ERROR(s.gemm->CheckInvariance());
    if (options.log) {
      for (const GemmShapeReport& r : s.gemm->reports()) {
        std::string bits;
        for (size_t i = 0; i < r.invariant.size() && i < kInvarianceMs.size(); ++i) {
          absl::StrAppend(&bits, i == 0 ? "" : " ", kInvarianceMs[i], r.invariant[i] ? ":=" : ":x");
        }
        options.log(
            absl::StrCat("GEMM ", r.n, "x", r.k, ": ", r.engine, " (row 0 vs M=1: ", bits, ")"));
      }
    }
  }

  if (absl::Status arena = s.AllocateArena(); !arena.ok()) {
    return absl::Status(
        arena.code(), absl::StrCat("the activations for engine.max_num_batched_tokens ",
                                   s.max_tokens, " and engine.max_num_seqs ", options.max_num_seqs,
                                   " do not fit: ", arena.message()));
  }
  s.layer_events.assign(static_cast<size_t>(c.n_layers), nullptr);
  // Interprocess: a CUDA IPC receiver waits on them (cudaIpcGetEventHandle,
  // kv::DeviceKvAccess::layer_event); that needs timing disabled too.
  for (cudaEvent_t& e : s.layer_events) {
    TANDEM_CUDA_RETURN_IF_ERROR(
        s.Check(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming),
                "cudaEventCreate (layer)"));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(
      s.Check(cudaEventCreateWithFlags(&s.done_event, cudaEventDisableTiming), "cudaEventCreate"));

  // The activation peak: the arena, plus whatever one forward at
  // max_num_batched_tokens makes the device allocate besides (nothing,
  // unless a library allocates behind its workspace).
  uint64_t growth = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(s.WarmUp(&growth));
  size_t free_now = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(s.Check(cudaMemGetInfo(&free_now, &total), "cudaMemGetInfo"));

  const kv::KvShape shape = model.kv_shape(options.block_size);
  GpuMemoryInputs in;
  in.device_total_bytes = total;
  in.device_free_bytes = free_start;
  in.gpu_memory_fraction = options.gpu_memory_fraction;
  in.weight_bytes = s.weights.bytes;
  in.activation_peak_bytes = s.arena_bytes + growth;
  in.workspace_bytes = s.gemm->workspace_bytes();
  in.transfer_buffer_bytes = options.transfer_buffer_bytes;
  in.block_bytes = CudaKvStorage::BlockBytes(shape, options.kv_cache_dtype);
  // Anything this process holds beyond the parts above (cuBLAS handles,
  // allocation rounding), plus the KV pool's scratch block.
  const uint64_t used = free_start > free_now ? free_start - free_now : 0;
  const uint64_t accounted = in.weight_bytes + in.activation_peak_bytes + in.workspace_bytes;
  in.other_bytes = (used > accounted ? used - accounted : 0) + in.block_bytes;
  in.max_blocks = options.num_kv_blocks_set ? options.num_kv_blocks : 0;
  absl::StatusOr<GpuMemoryPlan> plan = PlanGpuMemory(in);
  if (!plan.ok()) return plan.status();
  s.plan = *plan;

  absl::StatusOr<std::unique_ptr<CudaKvStorage>> kv =
      CudaKvStorage::Create(shape, options.kv_cache_dtype, s.plan.num_blocks);
  if (!kv.ok()) return kv.status();
  s.kv = *std::move(kv);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    s.kv->SetLayerEvent(l, s.layer_events[static_cast<size_t>(l)]);
  }
  s.bit_exact_class = absl::StrCat("tandem-cuda/sm_", s.compute_capability, "/",
                                   options.batch_invariant ? "bi" : "nbi", "/",
                                   kv::KvDtypeName(s.weights.dtype), "/v1");
  if (options.log) {
    options.log(absl::StrCat(device_name, " (", prop.name, ", sm_", s.compute_capability,
                             "): weights ", kv::KvDtypeName(s.weights.dtype), ", KV cache ",
                             kv::KvDtypeName(options.kv_cache_dtype), ", ", s.bit_exact_class));
    options.log(s.plan.Describe(in));
  }
  auto backend = std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
  // Every decode graph now, before the worker starts anything else on the
  // device (NCCL, issue #16): none is captured while serving.
  if (absl::Status captured = backend->CaptureGraphs(); !captured.ok()) return captured;
  return backend;
}

const model::LlamaConfig& CudaBackend::config() const { return impl_->config; }
kv::KvStorage& CudaBackend::kv_storage() { return *impl_->kv; }
std::string CudaBackend::bit_exact_class() const { return impl_->bit_exact_class; }
bool CudaBackend::device_lost() const { return impl_->lost; }
const GpuMemoryPlan& CudaBackend::memory_plan() const { return impl_->plan; }

absl::Status CudaBackend::Forward(std::span<const ForwardEntry> batch, const LayerHook* hook,
                                  std::vector<sampling::SamplingView>* views) {
  Impl& s = *impl_;
  if (absl::Status lost = s.LostError(); !lost.ok()) return lost;
  absl::Status status = s.Check(cudaSetDevice(s.device), "cudaSetDevice");
  if (status.ok()) status = s.Step(batch, hook, views, *s.kv);
  if (!status.ok()) {
    // A capture left open by an error is closed; the stream is drained so
    // that the next step's host buffers are not read by this step's copies
    // (its own stream only: the step failed anyway).
    s.EndOpenCapture();
    const cudaError_t drained = cudaStreamSynchronize(s.stream);
    if (IsStickyCudaError(drained)) s.MarkLost(status);
    cudaGetLastError();  // clears a recoverable error
  }
  return status;
}

void CudaBackend::set_use_cuda_graphs(bool on) { impl_->use_graphs = on; }

absl::Status CudaBackend::CaptureGraphs() {
  Impl& s = *impl_;
  if (absl::Status lost = s.LostError(); !lost.ok()) return lost;
  TANDEM_CUDA_RETURN_IF_ERROR(s.Check(cudaSetDevice(s.device), "cudaSetDevice"));
  for (int32_t bucket : GraphBuckets(std::min(s.max_rows, s.max_tokens))) {
    absl::Status captured = s.CaptureGraph(bucket, *s.kv);
    if (!captured.ok()) {
      s.EndOpenCapture();
      cudaGetLastError();
      return captured;
    }
  }
  return absl::OkStatus();
}

size_t CudaBackend::captured_graphs() const { return impl_->graphs.size(); }
int64_t CudaBackend::host_sampling_fallbacks() const { return impl_->host_fallbacks; }

void CudaBackend::set_profiling(bool on) { impl_->profiling = on; }
ForwardProfile CudaBackend::profile() const { return impl_->prof; }
void CudaBackend::reset_profile() { impl_->prof = ForwardProfile{}; }

absl::StatusOr<std::vector<float>> CudaBackend::LastLogitsForTesting() {
  Impl& s = *impl_;
  TANDEM_CUDA_RETURN_IF_ERROR(s.Check(cudaSetDevice(s.device), "cudaSetDevice"));
  std::vector<float> out(static_cast<size_t>(s.last_rows) *
                         static_cast<size_t>(s.config.vocab_size));
  if (!out.empty()) {
    TANDEM_CUDA_RETURN_IF_ERROR(s.Check(
        cudaMemcpy(out.data(), s.logits.get(), out.size() * sizeof(float), cudaMemcpyDeviceToHost),
        "copy of the last logits"));
  }
  return out;
}

}  // namespace tandem::backend::cuda
