// tandem-gpu-bench: the GPU numbers of scripts/device-check (issue #15's
// targets; docs/benchmarks.md, "GPU (H200)"). Built only with
// TANDEM_ENABLE_CUDA. Every time is from CUDA events unless it says wall.
//
//   tandem-gpu-bench peak
//       bf16 GEMM peak: cuBLASLt's first heuristic algorithm, 8192^3, BF16
//       A/B/D, F32 compute, 32 MiB workspace, random inputs, 3 warm-ups then
//       the mean of 10; device-to-device copy bandwidth: cudaMemcpyAsync of
//       2 GiB, 2 warm-ups then the mean of 10, counting bytes read plus
//       written (METHOD.md's convention).
//   tandem-gpu-bench prefill --model M [--tokens 2048] [--peak-tflops X]
//       One prompt of random ids through the CUDA backend (BF16 weights and
//       KV, max_num_batched_tokens = tokens, one chunk): 1 warm-up, the mean
//       of 5. FLOPs as bench/README.md counts BM_Prefill's: 2 per
//       multiply-add of every matrix but the output projection for all
//       tokens, the output projection once, attention 4 q_dim per key (token
//       t has t + 1 keys) per layer. Time split GEMM / attention / other
//       from CudaBackend::profile(). Then each GEMM shape at m = tokens
//       (QKV fused, O, gate/up fused, down; output at m = 1) through the
//       engine's GemmRunner and through cuBLASLt alone (its first heuristic
//       algorithm, same types: BF16 in, F32 out).
//   tandem-gpu-bench decode --model M [--batch 1] [--prompt 128] [--output 128]
//                           [--copy-gbps X]
//       B prompts of random ids prefilled (chunks within 2048 tokens), then
//       `output` greedy steps of B tokens: tokens/s (wall, the decode steps
//       only), the forward's event time per step, and the bytes of the
//       weight matrices read per step over that time beside the copy
//       bandwidth.
//   tandem-gpu-bench invariance --model M
//       The engine's batch-invariance table: per weight shape (n x k), the
//       GEMM engine chosen and whether row 0 is bit-identical at each m in
//       kInvarianceMs (GemmRunner::CheckInvariance, BF16, max_m 2048), and
//       the mode's slowdown: the invariant runner's time beside the default
//       runner's at m = 1 and m = 2048.
//
// Output: "key=value" lines (the script parses them) and small tables.
// Exit: 0 measured, 1 a CUDA / model error, 2 bad flag, 77 no CUDA GPU (one
// line: "tandem-gpu-bench: no CUDA GPU (<reason>); nothing to measure").
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backend/backend_factory.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/cuda/cuda_status.h"
#include "engine/backend/cuda/gemm.h"
#include "engine/gguf/gguf_file.h"
#include "engine/kv/kv_storage.h"
#include "engine/model/llama_model.h"
#include "engine/sampling/sampler.h"
#include "tools/cli_args.h"

namespace tandem::gpubench {
namespace {

using backend::cuda::CublasStatus;
using backend::cuda::CudaStatus;

constexpr char kUsage[] =
    "usage: tandem-gpu-bench peak\n"
    "       tandem-gpu-bench prefill --model M [--tokens 2048] [--peak-tflops X]\n"
    "       tandem-gpu-bench decode --model M [--batch 1] [--prompt 128] [--output 128]"
    " [--copy-gbps X]\n"
    "       tandem-gpu-bench invariance --model M\n";

#define BENCH_RETURN_IF_ERROR(expr)                    \
  do {                                                 \
    if (absl::Status _s = (expr); !_s.ok()) return _s; \
  } while (0)

// cudaMalloc'd memory, freed at scope exit.
class DeviceMem {
 public:
  DeviceMem() = default;
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  ~DeviceMem() {
    if (p_ != nullptr) cudaFree(p_);
  }
  [[nodiscard]] absl::Status Allocate(size_t bytes, const char* what) {
    return CudaStatus(cudaMalloc(&p_, bytes), what);
  }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

// A CUDA event pair timing work on one stream.
class EventTimer {
 public:
  EventTimer() {
    cudaEventCreate(&start_);
    cudaEventCreate(&stop_);
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  void Start(cudaStream_t s) { cudaEventRecord(start_, s); }
  // Records the stop, waits for it, returns the milliseconds between.
  [[nodiscard]] absl::StatusOr<float> StopMs(cudaStream_t s) {
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(stop_, s), "cudaEventRecord"));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(stop_), "cudaEventSynchronize"));
    float ms = 0;
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, start_, stop_), "elapsed"));
    return ms;
  }

 private:
  cudaEvent_t start_{}, stop_{};
};

// Random bf16 values in [-1, 1) (the high half of a float), so no GEMM is
// timed on zeros (METHOD.md).
[[nodiscard]] absl::Status FillRandomBf16(void* dev, size_t n, uint32_t seed) {
  std::vector<uint16_t> host(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    const float f = u(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    host[i] = static_cast<uint16_t>(b >> 16);
  }
  return CudaStatus(cudaMemcpy(dev, host.data(), n * 2, cudaMemcpyHostToDevice), "fill");
}

// One cuBLASLt matmul, row-major out[m][n] = a[m][k] . w[n][k]^T (the
// engine's convention, gemm.h): column-major out^T = w^T' . a^T with
// transa = T. a and w BF16; out `out_type` (BF16 or F32); F32 compute;
// cuBLASLt's first heuristic algorithm for a 32 MiB workspace.
class LtGemm {
 public:
  ~LtGemm() {
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (b_) cublasLtMatrixLayoutDestroy(b_);
    if (c_) cublasLtMatrixLayoutDestroy(c_);
    if (op_) cublasLtMatmulDescDestroy(op_);
  }
  [[nodiscard]] absl::Status Init(cublasLtHandle_t h, int32_t m, int32_t n, int32_t k,
                                  cudaDataType out_type, size_t workspace_bytes) {
    h_ = h;
    BENCH_RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate"));
    const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
    cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof(nt));
    // A = w: k x n column-major (ld k), transposed; B = a: k x m (ld k);
    // C = D = out^T: n x m (ld n).
    BENCH_RETURN_IF_ERROR(
        CublasStatus(cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, k, n, k), "layout A"));
    BENCH_RETURN_IF_ERROR(
        CublasStatus(cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, k, m, k), "layout B"));
    BENCH_RETURN_IF_ERROR(
        CublasStatus(cublasLtMatrixLayoutCreate(&c_, out_type, n, m, n), "layout C"));
    cublasLtMatmulPreference_t pref;
    BENCH_RETURN_IF_ERROR(CublasStatus(cublasLtMatmulPreferenceCreate(&pref), "preference"));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace_bytes, sizeof(workspace_bytes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(h_, op_, a_, b_, c_, c_, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    BENCH_RETURN_IF_ERROR(CublasStatus(st, "AlgoGetHeuristic"));
    if (found == 0) {
      return absl::InternalError(
          absl::StrCat("cuBLASLt has no algorithm for m=", m, " n=", n, " k=", k));
    }
    algo_ = result.algo;
    return absl::OkStatus();
  }
  [[nodiscard]] absl::Status Run(const void* a, const void* w, void* out, void* workspace,
                                 size_t workspace_bytes, cudaStream_t s) {
    const float alpha = 1.0f, beta = 0.0f;
    return CublasStatus(cublasLtMatmul(h_, op_, &alpha, w, a_, a, b_, &beta, out, c_, out, c_,
                                       &algo_, workspace, workspace_bytes, s),
                        "cublasLtMatmul");
  }

 private:
  cublasLtHandle_t h_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
};

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// Mean ms of `reps` runs of `fn` after `warmup` runs, from events on `s`.
template <typename Fn>
[[nodiscard]] absl::StatusOr<double> TimeMs(cudaStream_t s, int warmup, int reps, Fn fn) {
  for (int i = 0; i < warmup; ++i) BENCH_RETURN_IF_ERROR(fn());
  EventTimer t;
  t.Start(s);
  for (int i = 0; i < reps; ++i) BENCH_RETURN_IF_ERROR(fn());
  absl::StatusOr<float> ms = t.StopMs(s);
  if (!ms.ok()) return ms.status();
  return static_cast<double>(*ms) / reps;
}

// The cuBLASLt handle, stream and workspace of the stand-alone GEMMs.
struct LtContext {
  cublasLtHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  DeviceMem workspace;
  ~LtContext() {
    if (handle) cublasLtDestroy(handle);
    if (stream) cudaStreamDestroy(stream);
  }
  [[nodiscard]] absl::Status Init() {
    BENCH_RETURN_IF_ERROR(CublasStatus(cublasLtCreate(&handle), "cublasLtCreate"));
    BENCH_RETURN_IF_ERROR(
        CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
    return workspace.Allocate(kWorkspaceBytes, "workspace");
  }
};

// ms of one cuBLASLt GEMM of (m, n, k), BF16 in, `out_type` out.
[[nodiscard]] absl::StatusOr<double> TimeLtGemm(LtContext& ctx, int32_t m, int32_t n, int32_t k,
                                                cudaDataType out_type, int warmup, int reps) {
  DeviceMem a, w, out;
  BENCH_RETURN_IF_ERROR(a.Allocate(size_t{2} * m * k, "A"));
  BENCH_RETURN_IF_ERROR(w.Allocate(size_t{2} * n * k, "W"));
  BENCH_RETURN_IF_ERROR(out.Allocate((out_type == CUDA_R_32F ? 4 : 2) * size_t{1} * m * n, "D"));
  BENCH_RETURN_IF_ERROR(FillRandomBf16(a.get(), size_t{1} * m * k, 1));
  BENCH_RETURN_IF_ERROR(FillRandomBf16(w.get(), size_t{1} * n * k, 2));
  LtGemm g;
  BENCH_RETURN_IF_ERROR(g.Init(ctx.handle, m, n, k, out_type, kWorkspaceBytes));
  return TimeMs(ctx.stream, warmup, reps, [&] {
    return g.Run(a.get(), w.get(), out.get(), ctx.workspace.get(), kWorkspaceBytes, ctx.stream);
  });
}

// "tandem-gpu-bench: no CUDA GPU (...)" and 77, or 0 when there is one.
int CheckGpu() {
  std::string why;
  if (backend::SystemDeviceQuery().DeviceCount(&why) > 0) return 0;
  std::printf("tandem-gpu-bench: no CUDA GPU (%s); nothing to measure\n",
              why.empty() ? "no CUDA device" : why.c_str());
  return 77;
}

[[nodiscard]] absl::Status Peak() {
  LtContext ctx;
  BENCH_RETURN_IF_ERROR(ctx.Init());
  constexpr int32_t kN = 8192;
  absl::StatusOr<double> ms = TimeLtGemm(ctx, kN, kN, kN, CUDA_R_16BF, 3, 10);
  if (!ms.ok()) return ms.status();
  const double tflops = 2.0 * kN * kN * kN / (*ms * 1e-3) * 1e-12;
  std::printf("peak_bf16_gemm_tflops=%.1f\n", tflops);
  std::printf(
      "peak_bf16_gemm_ms=%.3f  (8192^3, cuBLASLt heuristic #1, BF16 in/out, F32 "
      "compute, mean of 10)\n",
      *ms);
  constexpr size_t kBytes = size_t{2} << 30;
  DeviceMem src, dst;
  BENCH_RETURN_IF_ERROR(src.Allocate(kBytes, "copy source"));
  BENCH_RETURN_IF_ERROR(dst.Allocate(kBytes, "copy destination"));
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(src.get(), 0x5a, kBytes, ctx.stream), "set"));
  absl::StatusOr<double> copy_ms = TimeMs(ctx.stream, 2, 10, [&] {
    return CudaStatus(
        cudaMemcpyAsync(dst.get(), src.get(), kBytes, cudaMemcpyDeviceToDevice, ctx.stream),
        "cudaMemcpyAsync");
  });
  if (!copy_ms.ok()) return copy_ms.status();
  std::printf("copy_gbps=%.0f\n", 2.0 * kBytes / (*copy_ms * 1e-3) * 1e-9);
  std::printf("copy_ms=%.3f  (2 GiB device to device, bytes read + written, mean of 10)\n",
              *copy_ms);
  return absl::OkStatus();
}

// The model and its CUDA backend.
struct Loaded {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<backend::ModelBackend> owner;
  backend::cuda::CudaBackend* cuda = nullptr;
};

[[nodiscard]] absl::StatusOr<Loaded> Load(const std::string& path, int32_t max_tokens,
                                          int32_t max_seqs, int32_t num_blocks) {
  Loaded l;
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(path);
  if (!f.ok()) return f.status();
  l.file = std::move(*f);
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> m = model::LlamaModel::Load(*l.file);
  if (!m.ok()) return m.status();
  l.model = std::move(*m);
  backend::BackendOptions o;
  o.device = backend::DeviceSpec{backend::DeviceSpec::Kind::kCuda, 0};
  o.kv_cache_dtype = kv::KvDtype::kBF16;
  o.batch_invariant = false;
  o.max_num_batched_tokens = max_tokens;
  o.max_num_seqs = max_seqs;
  o.num_kv_blocks = num_blocks;
  o.num_kv_blocks_set = true;
  o.log = [](const std::string& line) { std::printf("backend: %s\n", line.c_str()); };
  absl::StatusOr<std::unique_ptr<backend::ModelBackend>> b = backend::CreateBackend(*l.model, o);
  if (!b.ok()) return b.status();
  l.owner = std::move(*b);
  l.cuda = dynamic_cast<backend::cuda::CudaBackend*>(l.owner.get());
  if (l.cuda == nullptr) return absl::InternalError("CreateBackend did not return CUDA");
  return l;
}

std::vector<int32_t> RandomIds(size_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(0, vocab - 1);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = u(rng);
  return ids;
}

std::vector<int32_t> Table(int32_t first_block, int32_t tokens) {
  std::vector<int32_t> t;
  for (int32_t b = 0; b < kv::BlocksForTokens(tokens, 16); ++b) t.push_back(first_block + b);
  return t;
}

// Elements of every weight matrix a token multiplies by (bench/README.md's
// MatMulWeights rule): n_layers x (n_embd x (2 q_dim + 2 kv_dim) + 3 n_embd
// x n_ff) + vocab x n_embd.
double MatrixParams(const model::LlamaConfig& c) {
  const double q_dim = static_cast<double>(c.n_head) * c.head_dim;
  const double kv_dim = static_cast<double>(c.n_head_kv) * c.head_dim;
  return c.n_layers * (c.n_embd * (2 * q_dim + 2 * kv_dim) + 3.0 * c.n_embd * c.n_ff) +
         static_cast<double>(c.vocab_size) * c.n_embd;
}

// The model's GEMM shapes (n, k) as the CUDA backend fuses them, with the
// rows each has per token ("m per token": 0 for the output, once a step).
struct Shape {
  const char* name;
  int32_t n, k;
  bool once;  // the output projection: the sampled rows only
};
std::vector<Shape> Shapes(const model::LlamaConfig& c) {
  const int32_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  return {{"qkv", q_dim + 2 * kv_dim, c.n_embd, false},
          {"o", c.n_embd, q_dim, false},
          {"gate_up", 2 * c.n_ff, c.n_embd, false},
          {"down", c.n_embd, c.n_ff, false},
          {"output", c.vocab_size, c.n_embd, true}};
}

[[nodiscard]] absl::Status Prefill(const std::string& path, int32_t tokens, double peak_tflops) {
  absl::StatusOr<Loaded> l = Load(path, tokens, 1, kv::BlocksForTokens(tokens, 16) + 1);
  if (!l.ok()) return l.status();
  const model::LlamaConfig& c = l->model->config();
  const std::vector<int32_t> ids = RandomIds(static_cast<size_t>(tokens), c.vocab_size, 7);
  const std::vector<int32_t> table = Table(0, tokens);
  sampling::SamplingOptions greedy;
  backend::ForwardEntry e;
  e.tokens = ids;
  e.block_table = &table;
  e.sampling = &greedy;
  std::vector<sampling::SamplingView> views;
  BENCH_RETURN_IF_ERROR(l->cuda->Forward(std::span(&e, 1), nullptr, &views));  // warm-up
  l->cuda->set_profiling(true);
  l->cuda->reset_profile();
  constexpr int kReps = 5;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) {
    BENCH_RETURN_IF_ERROR(l->cuda->Forward(std::span(&e, 1), nullptr, &views));
  }
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
      kReps;
  const backend::cuda::ForwardProfile p = l->cuda->profile();
  const double n = tokens;
  const double output = static_cast<double>(c.vocab_size) * c.n_embd;
  const double q_dim = static_cast<double>(c.n_head) * c.head_dim;
  const double flops = 2.0 * n * (MatrixParams(c) - output) + 2.0 * output +
                       4.0 * q_dim * c.n_layers * (n * (n + 1) / 2);
  const double f = p.forwards > 0 ? 1.0 / p.forwards : 0.0;
  const double total_ms = p.total_ms * f;
  const double tflops = total_ms > 0 ? flops / (total_ms * 1e-3) * 1e-12 : 0.0;
  std::printf(
      "prefill_tokens=%d\nprefill_gflop=%.1f\nprefill_ms=%.3f\nprefill_wall_ms=%.3f\n"
      "prefill_tflops=%.1f\n",
      tokens, flops * 1e-9, total_ms, wall_ms, tflops);
  if (peak_tflops > 0) std::printf("prefill_pct_of_peak=%.1f\n", 100.0 * tflops / peak_tflops);
  std::printf("prefill_gemm_ms=%.3f\nprefill_attention_ms=%.3f\nprefill_other_ms=%.3f\n",
              p.gemm_ms * f, p.attention_ms * f, p.other_ms * f);

  // Each GEMM shape: the engine's GemmRunner beside cuBLASLt alone.
  LtContext ctx;
  BENCH_RETURN_IF_ERROR(ctx.Init());
  std::vector<std::pair<int32_t, int32_t>> nk;
  for (const Shape& s : Shapes(c)) nk.emplace_back(s.n, s.k);
  absl::StatusOr<std::unique_ptr<backend::cuda::GemmRunner>> runner =
      backend::cuda::GemmRunner::Create(backend::cuda::Dtype::kBF16, nk, tokens,
                                        /*batch_invariant=*/false, ctx.stream);
  if (!runner.ok()) return runner.status();
  std::printf(
      "| gemm | m | n | k | engine ms | cuBLASLt ms |"
      " engine speed (cuBLASLt ms / engine ms) |\n"
      "|---|---|---|---|---|---|---|\n");
  double engine_sum = 0;
  for (const Shape& s : Shapes(c)) {
    const int32_t m = s.once ? 1 : tokens;
    DeviceMem a, w, out;
    BENCH_RETURN_IF_ERROR(a.Allocate(size_t{2} * m * s.k, "A"));
    BENCH_RETURN_IF_ERROR(w.Allocate(size_t{2} * s.n * s.k, "W"));
    BENCH_RETURN_IF_ERROR(out.Allocate(size_t{4} * m * s.n, "D"));
    BENCH_RETURN_IF_ERROR(FillRandomBf16(a.get(), size_t{1} * m * s.k, 3));
    BENCH_RETURN_IF_ERROR(FillRandomBf16(w.get(), size_t{1} * s.n * s.k, 4));
    absl::StatusOr<double> engine = TimeMs(ctx.stream, 3, 10, [&] {
      return (*runner)->Run(a.get(), w.get(), m, s.n, s.k, static_cast<float*>(out.get()), false,
                            ctx.stream);
    });
    if (!engine.ok()) return engine.status();
    absl::StatusOr<double> alone = TimeLtGemm(ctx, m, s.n, s.k, CUDA_R_32F, 3, 10);
    if (!alone.ok()) return alone.status();
    engine_sum += *engine * (s.once ? 1 : c.n_layers);
    std::printf("| %s | %d | %d | %d | %.4f | %.4f | %.0f%% |\n", s.name, m, s.n, s.k, *engine,
                *alone, 100.0 * *alone / *engine);
  }
  std::printf("prefill_gemm_sum_ms=%.3f  (the shapes above x layers, GemmRunner alone)\n",
              engine_sum);
  return absl::OkStatus();
}

[[nodiscard]] absl::Status Decode(const std::string& path, int32_t batch, int32_t prompt,
                                  int32_t output, double copy_gbps) {
  const int32_t per_seq = kv::BlocksForTokens(prompt + output + 1, 16);
  const int32_t max_tokens = std::max(2048, batch);
  absl::StatusOr<Loaded> l = Load(path, max_tokens, std::max(batch, 1), batch * per_seq);
  if (!l.ok()) return l.status();
  const model::LlamaConfig& c = l->model->config();
  std::vector<std::vector<int32_t>> prompts, tables, generated(static_cast<size_t>(batch));
  for (int32_t s = 0; s < batch; ++s) {
    prompts.push_back(RandomIds(static_cast<size_t>(prompt), c.vocab_size, 100 + s));
    tables.push_back(Table(s * per_seq, prompt + output + 1));
  }
  sampling::SamplingOptions greedy;
  std::vector<sampling::SamplingView> views;
  // Prefill, as many whole prompts per forward as 2048 tokens hold.
  const int32_t per_forward = std::max(1, max_tokens / prompt);
  for (int32_t s0 = 0; s0 < batch; s0 += per_forward) {
    std::vector<backend::ForwardEntry> entries;
    for (int32_t s = s0; s < std::min(batch, s0 + per_forward); ++s) {
      backend::ForwardEntry e;
      e.tokens = prompts[static_cast<size_t>(s)];
      e.block_table = &tables[static_cast<size_t>(s)];
      e.sampling = &greedy;
      entries.push_back(e);
    }
    BENCH_RETURN_IF_ERROR(l->cuda->Forward(entries, nullptr, &views));
    for (size_t i = 0; i < views.size(); ++i) {
      generated[static_cast<size_t>(s0) + i].push_back(
          sampling::SampleFromView(views[i], greedy, 0).token_id);
    }
  }
  l->cuda->set_profiling(true);
  l->cuda->reset_profile();
  const auto t0 = std::chrono::steady_clock::now();
  for (int32_t step = 1; step < output; ++step) {
    std::vector<backend::ForwardEntry> entries;
    for (int32_t s = 0; s < batch; ++s) {
      backend::ForwardEntry e;
      e.tokens = std::span<const int32_t>(&generated[static_cast<size_t>(s)].back(), 1);
      e.start_pos = prompt + step - 1;
      e.block_table = &tables[static_cast<size_t>(s)];
      e.sampling = &greedy;
      entries.push_back(e);
    }
    BENCH_RETURN_IF_ERROR(l->cuda->Forward(entries, nullptr, &views));
    for (int32_t s = 0; s < batch; ++s) {
      generated[static_cast<size_t>(s)].push_back(
          sampling::SampleFromView(views[static_cast<size_t>(s)], greedy,
                                   static_cast<uint32_t>(step))
              .token_id);
    }
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const backend::cuda::ForwardProfile p = l->cuda->profile();
  const int32_t steps = output - 1;
  const double step_ms = p.forwards > 0 ? p.total_ms / p.forwards : 0.0;
  const double weight_bytes = 2.0 * MatrixParams(c);  // BF16 on the device
  const double weight_gbps = step_ms > 0 ? weight_bytes / (step_ms * 1e-3) * 1e-9 : 0.0;
  std::printf(
      "decode_batch=%d\ndecode_steps=%d\ndecode_tokens_per_s=%.1f\n"
      "decode_step_ms=%.4f\ndecode_step_wall_ms=%.4f\ndecode_weight_gb=%.3f\n"
      "decode_weight_gbps=%.0f\n",
      batch, steps, batch * steps / wall_s, step_ms, wall_s * 1e3 / steps, weight_bytes * 1e-9,
      weight_gbps);
  if (copy_gbps > 0) {
    std::printf("decode_weight_pct_of_copy=%.1f\n", 100.0 * weight_gbps / copy_gbps);
  }
  return absl::OkStatus();
}

[[nodiscard]] absl::Status Invariance(const std::string& path) {
  absl::StatusOr<std::unique_ptr<gguf::GgufFile>> f = gguf::GgufFile::Open(path);
  if (!f.ok()) return f.status();
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> m = model::LlamaModel::Load(**f);
  if (!m.ok()) return m.status();
  LtContext ctx;
  BENCH_RETURN_IF_ERROR(ctx.Init());
  std::vector<std::pair<int32_t, int32_t>> nk;
  for (const Shape& s : Shapes((*m)->config())) nk.emplace_back(s.n, s.k);
  absl::StatusOr<std::unique_ptr<backend::cuda::GemmRunner>> runner =
      backend::cuda::GemmRunner::Create(backend::cuda::Dtype::kBF16, nk, 2048,
                                        /*batch_invariant=*/true, ctx.stream);
  if (!runner.ok()) return runner.status();
  BENCH_RETURN_IF_ERROR((*runner)->CheckInvariance());
  // The price of the mode: each shape at m = 1 and 2048 through the
  // batch-invariant runner (cuBLASLt with one fixed algorithm, or the
  // fixed-tile fallback) and the default one (cuBLASLt's heuristic per m).
  absl::StatusOr<std::unique_ptr<backend::cuda::GemmRunner>> fast =
      backend::cuda::GemmRunner::Create(backend::cuda::Dtype::kBF16, nk, 2048,
                                        /*batch_invariant=*/false, ctx.stream);
  if (!fast.ok()) return fast.status();
  std::string header = "| n x k | engine |", rule = "|---|---|";
  for (int32_t mm : backend::cuda::kInvarianceMs) {
    absl::StrAppend(&header, " m=", mm, " |");
    rule += "---|";
  }
  header += " invariant / default ms, m=1 | m=2048 |";
  rule += "---|---|";
  std::printf("%s\n%s\n", header.c_str(), rule.c_str());
  for (const backend::cuda::GemmShapeReport& r : (*runner)->reports()) {
    std::string line = absl::StrCat("| ", r.n, " x ", r.k, " | ", r.engine, " |");
    for (size_t i = 0; i < backend::cuda::kInvarianceMs.size(); ++i) {
      absl::StrAppend(&line,
                      i < r.invariant.size() ? (r.invariant[i] ? " yes |" : " no |") : " - |");
    }
    for (int32_t mm : {1, 2048}) {
      DeviceMem a, w, out;
      BENCH_RETURN_IF_ERROR(a.Allocate(size_t{2} * mm * r.k, "A"));
      BENCH_RETURN_IF_ERROR(w.Allocate(size_t{2} * r.n * r.k, "W"));
      BENCH_RETURN_IF_ERROR(out.Allocate(size_t{4} * mm * r.n, "D"));
      BENCH_RETURN_IF_ERROR(FillRandomBf16(a.get(), size_t{1} * mm * r.k, 5));
      BENCH_RETURN_IF_ERROR(FillRandomBf16(w.get(), size_t{1} * r.n * r.k, 6));
      double ms[2] = {0, 0};
      for (int which = 0; which < 2; ++which) {
        backend::cuda::GemmRunner& g = which == 0 ? **runner : **fast;
        absl::StatusOr<double> t = TimeMs(ctx.stream, 3, 10, [&] {
          return g.Run(a.get(), w.get(), mm, r.n, r.k, static_cast<float*>(out.get()), false,
                       ctx.stream);
        });
        if (!t.ok()) return t.status();
        ms[which] = *t;
      }
      absl::StrAppend(&line, absl::StrFormat(" %.4f / %.4f (%.2fx) |", ms[0], ms[1],
                                             ms[1] > 0 ? ms[0] / ms[1] : 0.0));
    }
    std::printf("%s\n", line.c_str());
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  auto usage_error = [&](const std::string& what) {
    std::fprintf(stderr, "tandem-gpu-bench %s: %s\n%s", command.c_str(), what.c_str(), kUsage);
    return 2;
  };
  // Each command's own flags: any other is refused, not ignored.
  std::vector<cli::FlagSpec> spec;
  if (command == "prefill") {
    spec = {{"model"}, {"tokens"}, {"peak-tflops"}};
  } else if (command == "decode") {
    spec = {{"model"}, {"batch"}, {"prompt"}, {"output"}, {"copy-gbps"}};
  } else if (command == "invariance") {
    spec = {{"model"}};
  } else if (command != "peak") {
    return usage_error("unknown command");
  }
  absl::StatusOr<cli::ParsedArgs> parsed = cli::ParseArgs(args, spec);
  if (!parsed.ok()) return usage_error(std::string(parsed.status().message()));
  if (!parsed->positional().empty()) {
    return usage_error("unexpected argument '" + parsed->positional()[0] + "'");
  }
  const std::string model = parsed->GetString("model", "");
  if (command != "peak" && model.empty()) return usage_error("--model: required");
  auto int_flag = [&](const char* name, int64_t fallback, int64_t lo, int64_t hi,
                      int32_t* out) -> absl::Status {
    absl::StatusOr<int64_t> v = parsed->GetInt(name, fallback);
    if (!v.ok()) return v.status();
    if (*v < lo || *v > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": must be in [", lo, ", ", hi, "], got ", *v));
    }
    *out = static_cast<int32_t>(*v);
    return absl::OkStatus();
  };
  int32_t tokens = 0, batch = 0, prompt = 0, output = 0;
  for (absl::Status s :
       {int_flag("tokens", 2048, 1, 65536, &tokens), int_flag("batch", 1, 1, 1024, &batch),
        int_flag("prompt", 128, 1, 8192, &prompt), int_flag("output", 128, 2, 8192, &output)}) {
    if (!s.ok()) return usage_error(std::string(s.message()));
  }
  absl::StatusOr<double> peak = parsed->GetDouble("peak-tflops", 0);
  absl::StatusOr<double> copy = parsed->GetDouble("copy-gbps", 0);
  if (!peak.ok()) return usage_error(std::string(peak.status().message()));
  if (!copy.ok()) return usage_error(std::string(copy.status().message()));
  if (int rc = CheckGpu(); rc != 0) return rc;
  absl::Status s;
  if (command == "peak") s = Peak();
  if (command == "prefill") s = Prefill(model, tokens, *peak);
  if (command == "decode") s = Decode(model, batch, prompt, output, *copy);
  if (command == "invariance") s = Invariance(model);
  if (!s.ok()) {
    std::fprintf(stderr, "tandem-gpu-bench %s: %s\n", command.c_str(),
                 std::string(s.ToString()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem::gpubench

int main(int argc, char** argv) { return tandem::gpubench::Main(argc, argv); }
