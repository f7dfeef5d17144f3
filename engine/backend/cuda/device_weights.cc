#include "engine/backend/cuda/device_weights.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backend/cuda/cuda_status.h"
#include "engine/model/llama_weights.h"
#include "engine/model/weight_matrix.h"

namespace tandem::backend::cuda {
namespace {

using model::internal::WeightMatrix;

constexpr size_t kPieceAlign = 256;                 // every piece's offset in the arena
constexpr size_t kStagingBytes = size_t{32} << 20;  // per pinned half (two halves: 64 MiB)

size_t RoundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

double GiB(uint64_t bytes) { return static_cast<double>(bytes) / (uint64_t{1} << 30); }

// The host side of the upload, alive only during UploadWeights: two pinned
// F32 halves (the host fills one while the other is copied), an event per
// half (its last copy done), a device F32 scratch the conversion reads
// (stream order keeps its uses apart).
struct Staging {
  float* halves[2] = {nullptr, nullptr};
  cudaEvent_t done[2] = {nullptr, nullptr};
  DeviceBuffer scratch;  // [half_floats] F32, when the dtype is not F32
  size_t half_floats = 0;
  int next = 0;

  ~Staging() {
    for (int i = 0; i < 2; ++i) {
      if (done[i] != nullptr) (void)cudaEventDestroy(done[i]);
      if (halves[i] != nullptr) (void)cudaFreeHost(halves[i]);
    }
  }
};

// Walked twice over the same weights (Build): first counting (assigns every
// piece its arena offset, base null, pointers left null), then uploading
// into the arena at `base` with the same offsets.
class Uploader {
 public:
  Uploader(Dtype dtype, cudaStream_t stream) : dtype_(dtype), stream_(stream) {}

  void StartUpload(char* base, Staging* staging) {
    base_ = base;
    staging_ = staging;
    total_ = 0;
  }
  size_t total() const { return total_; }
  // The most floats one row of any piece has (the staging must hold one).
  size_t max_cols() const { return max_cols_; }

  // The matrices `parts` ([out][in] each, one `in`) stacked row-wise into
  // one [sum out][in] DeviceMatrix of dtype_.
  [[nodiscard]] absl::Status Matrix(std::initializer_list<const WeightMatrix*> parts,
                                    const char* name, DeviceMatrix* out) {
    const size_t cols = (*parts.begin())->in;
    size_t rows = 0;
    for (const WeightMatrix* p : parts) {
      if (p->in != cols || p->data == nullptr) {
        return absl::InternalError(absl::StrCat("weight ", name, ": parts disagree on columns (",
                                                p->in, " vs ", cols, ") or are missing"));
      }
      rows += p->out;
    }
    const size_t offset = Reserve(rows * cols * KvDtypeBytes(dtype_), cols);
    out->rows = static_cast<int32_t>(rows);
    out->cols = static_cast<int32_t>(cols);
    out->data = base_ == nullptr ? nullptr : base_ + offset;
    if (base_ == nullptr) return absl::OkStatus();
    size_t row_base = 0;
    for (const WeightMatrix* p : parts) {
      char* dst = base_ + offset + row_base * cols * KvDtypeBytes(dtype_);
      if (absl::Status s = Upload(
              p->out, cols,
              [p](size_t r0, size_t n, float* f) { model::internal::DequantizeRows(*p, r0, n, f); },
              dst, dtype_, name);
          !s.ok()) {
        return s;
      }
      row_base += p->out;
    }
    return absl::OkStatus();
  }

  // The F32 vectors `parts` ({data, size}) concatenated, kept F32.
  [[nodiscard]] absl::Status Vector(std::initializer_list<std::pair<const float*, size_t>> parts,
                                    const char* name, const float** out) {
    size_t n = 0;
    for (const auto& [data, size] : parts) {
      if (data == nullptr) return absl::InternalError(absl::StrCat("weight ", name, " missing"));
      n += size;
    }
    const size_t offset = Reserve(n * sizeof(float), 1);
    *out = base_ == nullptr ? nullptr : reinterpret_cast<const float*>(base_ + offset);
    if (base_ == nullptr) return absl::OkStatus();
    char* dst = base_ + offset;
    for (const auto& [data, size] : parts) {
      const float* src = data;
      if (absl::Status s = Upload(
              size, 1,
              [src](size_t r0, size_t k, float* f) { std::memcpy(f, src + r0, k * sizeof(float)); },
              dst, Dtype::kF32, name);
          !s.ok()) {
        return s;
      }
      dst += size * sizeof(float);
    }
    return absl::OkStatus();
  }

 private:
  size_t Reserve(size_t bytes, size_t cols) {
    const size_t offset = RoundUp(total_, kPieceAlign);
    total_ = offset + bytes;
    max_cols_ = std::max(max_cols_, cols);
    return offset;
  }

  // rows x cols floats, produced `fill(first_row, n_rows, out)` a chunk of
  // rows at a time into a pinned half, copied to the device and written at
  // `dst` as `dtype` (F32: copied straight there; else through the device
  // scratch and LaunchConvertF32).
  template <typename Fill>
  [[nodiscard]] absl::Status Upload(size_t rows, size_t cols, Fill fill, char* dst, Dtype dtype,
                                    const char* name) {
    Staging& st = *staging_;
    const size_t chunk_rows = std::max<size_t>(1, st.half_floats / cols);
    const size_t elem = KvDtypeBytes(dtype);
    for (size_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const size_t n = std::min(chunk_rows, rows - r0);
      const int h = st.next;
      st.next ^= 1;
      // The half's previous copy must be done before the host refills it.
      if (absl::Status s = CudaStatus(cudaEventSynchronize(st.done[h]),
                                      absl::StrCat("upload of ", name, ": cudaEventSynchronize"));
          !s.ok()) {
        return s;
      }
      fill(r0, n, st.halves[h]);
      const size_t count = n * cols;
      char* out = dst + r0 * cols * elem;
      cudaError_t error;
      if (dtype == Dtype::kF32) {
        error = cudaMemcpyAsync(out, st.halves[h], count * sizeof(float), cudaMemcpyHostToDevice,
                                stream_);
      } else {
        error = cudaMemcpyAsync(st.scratch.get(), st.halves[h], count * sizeof(float),
                                cudaMemcpyHostToDevice, stream_);
        if (error == cudaSuccess) {
          error = LaunchConvertF32(st.scratch.as<float>(), count, out, dtype, stream_);
        }
      }
      if (error == cudaSuccess) error = cudaEventRecord(st.done[h], stream_);
      if (absl::Status s = CudaStatus(error, absl::StrCat("upload of ", name)); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  Dtype dtype_;
  cudaStream_t stream_;
  char* base_ = nullptr;
  Staging* staging_ = nullptr;
  size_t total_ = 0;
  size_t max_cols_ = 1;
};

// Every piece of DeviceWeights, in arena order (the one walk both passes
// share).
[[nodiscard]] absl::Status Build(const model::internal::ModelWeights& w,
                                 const model::LlamaConfig& c, Uploader& u, DeviceWeights& out) {
  const size_t n_embd = static_cast<size_t>(c.n_embd);
  const size_t q_dim = static_cast<size_t>(c.n_head) * static_cast<size_t>(c.head_dim);
  const size_t kv_dim = static_cast<size_t>(c.n_head_kv) * static_cast<size_t>(c.head_dim);
  absl::Status s = u.Matrix({&w.token_embd.view}, "token_embd", &out.token_embd);
  if (!s.ok()) return s;
  // A tied output is a second view of token_embd's bytes (llama_weights.h).
  if (w.output.view.data == w.token_embd.view.data) {
    out.output = out.token_embd;
  } else if (s = u.Matrix({&w.output.view}, "output", &out.output); !s.ok()) {
    return s;
  }
  if (s = u.Vector({{w.output_norm.data, n_embd}}, "output_norm", &out.output_norm); !s.ok()) {
    return s;
  }
  out.rope_freqs = nullptr;
  if (c.rope_freq_factors) {
    s = u.Vector({{w.rope_freqs.data, static_cast<size_t>(c.rope_dim / 2)}}, "rope_freqs",
                 &out.rope_freqs);
    if (!s.ok()) return s;
  }
  out.layers.assign(w.layers.size(), DeviceLayer{});
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const model::internal::LayerWeights& l = w.layers[i];
    DeviceLayer& d = out.layers[i];
    if (s = u.Vector({{l.attn_norm.data, n_embd}}, "attn_norm", &d.attn_norm); !s.ok()) return s;
    if (s = u.Matrix({&l.wq.view, &l.wk.view, &l.wv.view}, "attn_qkv", &d.wqkv); !s.ok()) {
      return s;
    }
    d.bqkv = nullptr;
    if (c.qkv_bias) {
      s = u.Vector({{l.bq.data, q_dim}, {l.bk.data, kv_dim}, {l.bv.data, kv_dim}}, "attn_qkv bias",
                   &d.bqkv);
      if (!s.ok()) return s;
    }
    if (s = u.Matrix({&l.wo.view}, "attn_output", &d.wo); !s.ok()) return s;
    if (s = u.Vector({{l.ffn_norm.data, n_embd}}, "ffn_norm", &d.ffn_norm); !s.ok()) return s;
    if (s = u.Matrix({&l.w_gate.view, &l.w_up.view}, "ffn_gate_up", &d.w_gate_up); !s.ok()) {
      return s;
    }
    if (s = u.Matrix({&l.w_down.view}, "ffn_down", &d.w_down); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// F32 when keep_f32_weights; else F16 when every matrix is F16; else BF16.
Dtype ChooseDtype(const model::internal::ModelWeights& w, bool keep_f32_weights) {
  if (keep_f32_weights) return Dtype::kF32;
  bool all_f16 = w.token_embd.view.type == gguf::TensorType::kF16 &&
                 w.output.view.type == gguf::TensorType::kF16;
  for (const model::internal::LayerWeights& l : w.layers) {
    for (const model::internal::Matrix* m :
         {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      all_f16 = all_f16 && m->view.type == gguf::TensorType::kF16;
    }
  }
  return all_f16 ? Dtype::kF16 : Dtype::kBF16;
}

}  // namespace

absl::StatusOr<DeviceWeights> UploadWeights(const model::LlamaModel& model, bool keep_f32_weights,
                                            cudaStream_t stream) {
  const model::internal::ModelWeights& w = model.weights_for_device_upload();
  DeviceWeights out;
  out.dtype = ChooseDtype(w, keep_f32_weights);
  Uploader uploader(out.dtype, stream);
  if (absl::Status s = Build(w, model.config(), uploader, out); !s.ok()) return s;
  const size_t weight_bytes = uploader.total();
  const size_t half_floats = std::max(kStagingBytes / sizeof(float), uploader.max_cols());
  const size_t scratch_bytes = out.dtype == Dtype::kF32 ? 0 : half_floats * sizeof(float);

  size_t free_bytes = 0, total_bytes = 0;
  if (absl::Status s = CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
      !s.ok()) {
    return s;
  }
  if (weight_bytes + scratch_bytes > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the model does not fit: weights need %.2f GiB (%s, %u bytes per weight; plus %.0f MiB "
        "of upload scratch), the device has %.2f GiB free of %.2f GiB",
        GiB(weight_bytes), kv::KvDtypeName(out.dtype), kv::KvDtypeBytes(out.dtype),
        static_cast<double>(scratch_bytes) / (1 << 20), GiB(free_bytes), GiB(total_bytes)));
  }

  absl::StatusOr<DeviceBuffer> arena = DeviceBuffer::Allocate(weight_bytes, "the weights");
  if (!arena.ok()) return arena.status();
  Staging staging;
  staging.half_floats = half_floats;
  for (int i = 0; i < 2; ++i) {
    void* p = nullptr;
    if (absl::Status s =
            CudaStatus(cudaHostAlloc(&p, half_floats * sizeof(float), cudaHostAllocDefault),
                       "cudaHostAlloc (weight upload staging)");
        !s.ok()) {
      (void)cudaGetLastError();
      return s;
    }
    staging.halves[i] = static_cast<float*>(p);
    if (absl::Status s =
            CudaStatus(cudaEventCreateWithFlags(&staging.done[i], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags (weight upload)");
        !s.ok()) {
      staging.done[i] = nullptr;
      return s;
    }
    // Recorded once so that the first cudaEventSynchronize returns at once.
    if (absl::Status s =
            CudaStatus(cudaEventRecord(staging.done[i], stream), "cudaEventRecord (weight upload)");
        !s.ok()) {
      return s;
    }
  }
  if (scratch_bytes > 0) {
    absl::StatusOr<DeviceBuffer> scratch =
        DeviceBuffer::Allocate(scratch_bytes, "the weight upload scratch");
    if (!scratch.ok()) return scratch.status();
    staging.scratch = *std::move(scratch);
  }

  uploader.StartUpload(arena->as<char>(), &staging);
  absl::Status s = Build(w, model.config(), uploader, out);
  // Wait for the copies even after an error: the staging is freed below.
  const absl::Status sync =
      CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize (weight upload)");
  if (!s.ok()) return s;
  if (!sync.ok()) return sync;
  out.bytes = weight_bytes;
  out.arena.push_back(*std::move(arena));
  return out;
}

}  // namespace tandem::backend::cuda
