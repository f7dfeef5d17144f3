#include "engine/backend/cuda/gemm.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/cuda/cuda_status.h"

namespace tandem::backend::cuda {
namespace {

// The pointer alignment every algorithm is chosen for (Run checks it).
constexpr uint32_t kMinAlignBytes = 16;
// Heuristic results looked at in batch-invariant mode before giving up.
constexpr int kInvariantCandidates = 16;

cudaDataType_t CudaType(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32:
      return CUDA_R_32F;
    case Dtype::kF16:
      return CUDA_R_16F;
    case Dtype::kBF16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

std::string ShapeName(int32_t m, int32_t n, int32_t k) {
  return absl::StrCat("GEMM m=", m, " n=", n, " k=", k);
}

// The matrix layouts of one call shape in cuBLAS's column-major terms:
// A = w, stored [k][n] (ld k, transposed by the op); B = a, [k][m] (ld
// k); C = D = out, [n][m] (ld n), F32.
struct Layouts {
  cublasLtMatrixLayout_t a = nullptr;
  cublasLtMatrixLayout_t b = nullptr;
  cublasLtMatrixLayout_t c = nullptr;

  Layouts() = default;
  Layouts(const Layouts&) = delete;
  Layouts& operator=(const Layouts&) = delete;
  ~Layouts() {
    if (a != nullptr) (void)cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) (void)cublasLtMatrixLayoutDestroy(b);
    if (c != nullptr) (void)cublasLtMatrixLayoutDestroy(c);
  }

  [[nodiscard]] absl::Status Init(Dtype dtype, int32_t m, int32_t n, int32_t k) {
    const std::string what = absl::StrCat("cublasLtMatrixLayoutCreate (", ShapeName(m, n, k), ")");
    absl::Status s = CublasStatus(cublasLtMatrixLayoutCreate(&a, CudaType(dtype), k, n, k), what);
    if (s.ok()) s = CublasStatus(cublasLtMatrixLayoutCreate(&b, CudaType(dtype), k, m, k), what);
    if (s.ok()) s = CublasStatus(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, n, m, n), what);
    return s;
  }
};

// Per call shape (m, n, k): its layouts and, in default mode, the
// heuristic's algorithm (none: the fixed-tile GEMM).
struct CallPlan {
  Layouts layouts;
  bool has_algo = false;
  cublasLtMatmulAlgo_t algo{};
};

// Per weight shape (n, k).
struct ShapePlan {
  bool fixed_tile = false;  // every call of the shape runs LaunchFixedTileGemm
  bool has_algo = false;    // batch-invariant mode: `algo` for every m
  cublasLtMatmulAlgo_t algo{};
  size_t report = 0;  // index into reports
};

// Pseudo-random values in [-1, 1) (a 64-bit LCG, Knuth's MMIX constants),
// the same on every run.
void FillRandom(std::vector<float>& v, uint64_t seed) {
  uint64_t x = seed;
  for (float& f : v) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    f = static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  }
}

}  // namespace

struct GemmRunner::Impl {
  Dtype dtype = Dtype::kBF16;
  int32_t max_m = 0;
  bool batch_invariant = false;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  DeviceBuffer workspace;
  std::map<std::pair<int32_t, int32_t>, ShapePlan> shapes;
  std::map<std::array<int32_t, 3>, std::unique_ptr<CallPlan>> calls;
  std::vector<GemmShapeReport> reports;

  ~Impl() {
    calls.clear();  // layouts before the handle
    if (pref != nullptr) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (op != nullptr) (void)cublasLtMatmulDescDestroy(op);
    if (handle != nullptr) (void)cublasLtDestroy(handle);
  }

  [[nodiscard]] absl::Status Init();
  // The call plan of (m, n, k), made on first use.
  [[nodiscard]] absl::StatusOr<CallPlan*> Plan(int32_t m, int32_t n, int32_t k);
  // Batch-invariant mode: the shape's one algorithm (split-K 1), checked
  // at every m of the invariance check and at max_m; none found: fixed
  // tile.
  [[nodiscard]] absl::Status ChooseInvariantAlgo(int32_t n, int32_t k, ShapePlan& shape);
  // out = a . w^T (+ out): the shape's cuBLASLt algorithm (or fixed tile).
  [[nodiscard]] absl::Status Launch(const void* a, const void* w, int32_t m, int32_t n, int32_t k,
                                    float* out, bool accumulate, const ShapePlan& shape,
                                    cudaStream_t s);
};

absl::Status GemmRunner::Impl::Init() {
  absl::Status s = CublasStatus(cublasLtCreate(&handle), "cublasLtCreate");
  if (!s.ok()) {
    handle = nullptr;
    return s;
  }
  s = CublasStatus(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                   "cublasLtMatmulDescCreate");
  if (!s.ok()) {
    op = nullptr;
    return s;
  }
  const int32_t trans_a = CUBLAS_OP_T;
  const int32_t trans_b = CUBLAS_OP_N;
  s = CublasStatus(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)),
      "cublasLtMatmulDescSetAttribute (TRANSA)");
  if (!s.ok()) return s;
  s = CublasStatus(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)),
      "cublasLtMatmulDescSetAttribute (TRANSB)");
  if (!s.ok()) return s;
  s = CublasStatus(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  if (!s.ok()) {
    pref = nullptr;
    return s;
  }
  const uint64_t ws = kWorkspaceBytes;
  s = CublasStatus(cublasLtMatmulPreferenceSetAttribute(
                       pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                   "cublasLtMatmulPreferenceSetAttribute (MAX_WORKSPACE_BYTES)");
  for (cublasLtMatmulPreferenceAttributes_t attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (!s.ok()) return s;
    s = CublasStatus(
        cublasLtMatmulPreferenceSetAttribute(pref, attr, &kMinAlignBytes, sizeof(kMinAlignBytes)),
        "cublasLtMatmulPreferenceSetAttribute (MIN_ALIGNMENT)");
  }
  if (!s.ok()) return s;
  absl::StatusOr<DeviceBuffer> buffer =
      DeviceBuffer::Allocate(kWorkspaceBytes, "the cuBLASLt workspace");
  if (!buffer.ok()) return buffer.status();
  workspace = *std::move(buffer);
  return absl::OkStatus();
}

absl::StatusOr<CallPlan*> GemmRunner::Impl::Plan(int32_t m, int32_t n, int32_t k) {
  std::unique_ptr<CallPlan>& slot = calls[{m, n, k}];
  if (slot != nullptr) return slot.get();
  auto plan = std::make_unique<CallPlan>();
  if (absl::Status s = plan->layouts.Init(dtype, m, n, k); !s.ok()) {
    calls.erase({m, n, k});
    return s;
  }
  if (!batch_invariant) {
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle, op, plan->layouts.a, plan->layouts.b, plan->layouts.c, plan->layouts.c, pref, 1,
        &result, &returned);
    if (status == CUBLAS_STATUS_SUCCESS && returned > 0) {
      plan->has_algo = true;
      plan->algo = result.algo;
    } else if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) {
      calls.erase({m, n, k});
      return CublasStatus(
          status, absl::StrCat("cublasLtMatmulAlgoGetHeuristic (", ShapeName(m, n, k), ")"));
    }
  }
  slot = std::move(plan);
  return slot.get();
}

absl::Status GemmRunner::Impl::ChooseInvariantAlgo(int32_t n, int32_t k, ShapePlan& shape) {
  // The m values the algorithm must run at: the check's and max_m.
  std::vector<int32_t> ms;
  for (int32_t m : kInvarianceMs) {
    if (m <= max_m) ms.push_back(m);
  }
  if (ms.empty() || ms.back() != max_m) ms.push_back(max_m);
  absl::StatusOr<CallPlan*> top = Plan(max_m, n, k);
  if (!top.ok()) return top.status();
  cublasLtMatmulHeuristicResult_t results[kInvariantCandidates] = {};
  int returned = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle, op, (*top)->layouts.a, (*top)->layouts.b, (*top)->layouts.c, (*top)->layouts.c, pref,
      kInvariantCandidates, results, &returned);
  if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) {
    return CublasStatus(
        status, absl::StrCat("cublasLtMatmulAlgoGetHeuristic (", ShapeName(max_m, n, k), ")"));
  }
  if (status != CUBLAS_STATUS_SUCCESS) returned = 0;
  const int32_t split_k = 1;
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
  for (int i = 0; i < returned; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    cublasLtMatmulAlgo_t algo = results[i].algo;
    if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k,
                                             sizeof(split_k)) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                             &reduction,
                                             sizeof(reduction)) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    bool runs_everywhere = true;
    for (int32_t m : ms) {
      absl::StatusOr<CallPlan*> plan = Plan(m, n, k);
      if (!plan.ok()) return plan.status();
      cublasLtMatmulHeuristicResult_t check{};
      const Layouts& l = (*plan)->layouts;
      if (cublasLtMatmulAlgoCheck(handle, op, l.a, l.b, l.c, l.c, &algo, &check) !=
              CUBLAS_STATUS_SUCCESS ||
          check.workspaceSize > kWorkspaceBytes) {
        runs_everywhere = false;
        break;
      }
    }
    if (runs_everywhere) {
      shape.has_algo = true;
      shape.algo = algo;
      return absl::OkStatus();
    }
  }
  shape.fixed_tile = true;
  return absl::OkStatus();
}

absl::Status GemmRunner::Impl::Launch(const void* a, const void* w, int32_t m, int32_t n, int32_t k,
                                      float* out, bool accumulate, const ShapePlan& shape,
                                      cudaStream_t s) {
  const cublasLtMatmulAlgo_t* algo = nullptr;
  const CallPlan* plan = nullptr;
  if (!shape.fixed_tile) {
    absl::StatusOr<CallPlan*> p = Plan(m, n, k);
    if (!p.ok()) return p.status();
    plan = *p;
    if (batch_invariant) {
      algo = shape.has_algo ? &shape.algo : nullptr;
    } else {
      algo = plan->has_algo ? &plan->algo : nullptr;
    }
  }
  if (algo == nullptr) {
    return CudaStatus(LaunchFixedTileGemm(a, w, dtype, m, n, k, out, accumulate, s),
                      absl::StrCat("LaunchFixedTileGemm (", ShapeName(m, n, k), ")"));
  }
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  const Layouts& l = plan->layouts;
  return CublasStatus(cublasLtMatmul(handle, op, &alpha, w, l.a, a, l.b, &beta, out, l.c, out, l.c,
                                     algo, workspace.get(), kWorkspaceBytes, s),
                      absl::StrCat("cublasLtMatmul (", ShapeName(m, n, k), ")"));
}

GemmRunner::GemmRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GemmRunner::~GemmRunner() = default;

absl::StatusOr<std::unique_ptr<GemmRunner>> GemmRunner::Create(
    Dtype dtype, const std::vector<std::pair<int32_t, int32_t>>& shapes, int32_t max_m,
    bool batch_invariant, cudaStream_t stream) {
  if (max_m < 1) {
    return absl::InvalidArgumentError(absl::StrCat("GEMM max_m must be >= 1, got ", max_m));
  }
  auto impl = std::make_unique<Impl>();
  impl->dtype = dtype;
  impl->max_m = max_m;
  impl->batch_invariant = batch_invariant;
  impl->stream = stream;
  for (const auto& [n, k] : shapes) {
    if (n < 1 || k < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("GEMM weight shape needs n, k >= 1, got n=", n, " k=", k));
    }
    auto [it, inserted] = impl->shapes.try_emplace({n, k});
    if (!inserted) continue;
    it->second.report = impl->reports.size();
    GemmShapeReport report;
    report.n = n;
    report.k = k;
    impl->reports.push_back(report);
  }
  if (absl::Status s = impl->Init(); !s.ok()) return s;
  for (auto& [nk, shape] : impl->shapes) {
    if (batch_invariant) {
      if (absl::Status s = impl->ChooseInvariantAlgo(nk.first, nk.second, shape); !s.ok()) {
        return s;
      }
    }
    impl->reports[shape.report].engine = shape.fixed_tile ? "fixed-tile" : "cublaslt";
  }
  return std::unique_ptr<GemmRunner>(new GemmRunner(std::move(impl)));
}

const std::vector<GemmShapeReport>& GemmRunner::reports() const { return impl_->reports; }

absl::Status GemmRunner::Run(const void* a, const void* w, int32_t m, int32_t n, int32_t k,
                             float* out, bool accumulate, cudaStream_t stream) {
  Impl& s = *impl_;
  auto it = s.shapes.find({n, k});
  if (it == s.shapes.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ShapeName(m, n, k), ": weight shape (n, k) not given to GemmRunner::Create"));
  }
  if (m < 1 || m > s.max_m) {
    return absl::InvalidArgumentError(
        absl::StrCat(ShapeName(m, n, k), ": m outside [1, max_m = ", s.max_m, "]"));
  }
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(w) |
                         reinterpret_cast<uintptr_t>(out);
  if (a == nullptr || w == nullptr || out == nullptr || bits % kMinAlignBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(ShapeName(m, n, k),
                                                   ": a, w and out must be non-null and ",
                                                   kMinAlignBytes, "-byte aligned"));
  }
  return s.Launch(a, w, m, n, k, out, accumulate, it->second, stream);
}

absl::Status GemmRunner::CheckInvariance() {
  Impl& s = *impl_;
  std::vector<int32_t> ms;
  for (int32_t m : kInvarianceMs) {
    if (m <= s.max_m) ms.push_back(m);
  }
  const int32_t m_top = ms.back();  // kInvarianceMs[0] == 1 <= max_m
  const size_t elem = KvDtypeBytes(s.dtype);
  for (auto& [nk, shape] : s.shapes) {
    const auto [n, k] = nk;
    GemmShapeReport& report = s.reports[shape.report];
    if (shape.fixed_tile) continue;  // no cuBLASLt algorithm (left) to check
    report.invariant.clear();
    const std::string name = ShapeName(m_top, n, k);
    const size_t a_count = static_cast<size_t>(m_top) * static_cast<size_t>(k);
    const size_t w_count = static_cast<size_t>(n) * static_cast<size_t>(k);
    absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(a_count * elem, "the GEMM check's a");
    if (!a.ok()) return a.status();
    absl::StatusOr<DeviceBuffer> w = DeviceBuffer::Allocate(w_count * elem, "the GEMM check's w");
    if (!w.ok()) return w.status();
    absl::StatusOr<DeviceBuffer> out =
        DeviceBuffer::Allocate(static_cast<size_t>(m_top) * static_cast<size_t>(n) * sizeof(float),
                               "the GEMM check's out");
    if (!out.ok()) return out.status();
    absl::StatusOr<DeviceBuffer> f32 = DeviceBuffer::Allocate(
        std::max(a_count, w_count) * sizeof(float), "the GEMM check's F32 inputs");
    if (!f32.ok()) return f32.status();
    // Inputs: random F32 on the host, copied and converted to the dtype.
    for (auto [dst, count, seed] :
         {std::tuple{a->get(), a_count, uint64_t{1}}, std::tuple{w->get(), w_count, uint64_t{2}}}) {
      std::vector<float> host(count);
      FillRandom(host, seed);
      cudaError_t error = cudaMemcpyAsync(f32->get(), host.data(), count * sizeof(float),
                                          cudaMemcpyHostToDevice, s.stream);
      if (error == cudaSuccess) {
        error = LaunchConvertF32(f32->as<float>(), count, dst, s.dtype, s.stream);
      }
      // `host` is pageable and goes out of scope: wait for the copy.
      if (error == cudaSuccess) error = cudaStreamSynchronize(s.stream);
      if (absl::Status st = CudaStatus(error, absl::StrCat(name, ": check inputs")); !st.ok()) {
        return st;
      }
    }
    std::vector<float> first(static_cast<size_t>(n));
    std::vector<float> row(static_cast<size_t>(n));
    for (int32_t m : ms) {
      if (absl::Status st =
              s.Launch(a->get(), w->get(), m, n, k, out->as<float>(), false, shape, s.stream);
          !st.ok()) {
        return st;
      }
      cudaError_t error = cudaMemcpyAsync(row.data(), out->get(), row.size() * sizeof(float),
                                          cudaMemcpyDeviceToHost, s.stream);
      if (error == cudaSuccess) error = cudaStreamSynchronize(s.stream);
      if (absl::Status st = CudaStatus(error, absl::StrCat(name, ": check at m=", m)); !st.ok()) {
        return st;
      }
      if (m == 1) first = row;
      report.invariant.push_back(
          std::memcmp(first.data(), row.data(), row.size() * sizeof(float)) == 0);
    }
    const bool varies = std::find(report.invariant.begin(), report.invariant.end(), false) !=
                        report.invariant.end();
    if (s.batch_invariant && varies) {
      shape.fixed_tile = true;
      report.engine = "fixed-tile";
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::backend::cuda
