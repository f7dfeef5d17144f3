#include "engine/backend/cuda/cuda_kv_storage.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/backend/cuda/cuda_status.h"
#include "engine/backend/cuda/kv_copy_runs.h"

namespace tandem::backend::cuda {
namespace {

// Pinned staging bytes for K, and as many for V.
constexpr size_t kStagingBytes = size_t{4} << 20;

// The interface has no error path (kv_storage.h): a CUDA error or a caller
// bug in a copy is fatal.
[[noreturn]] void Fatal(const std::string& message) {
  std::fprintf(stderr, "CudaKvStorage: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

void Check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) Fatal(CudaStatus(error, what).ToString());
}

}  // namespace

struct CudaKvStorage::Impl {
  DeviceBuffer k_pool;
  DeviceBuffer v_pool;
  cudaStream_t copy_stream = nullptr;
  char* staging = nullptr;  // pinned: [0, half) K, [half, 2 * half) V
  size_t staging_half = 0;
  std::mutex mu;  // the staging buffer, the copy stream's work, layer_events
  std::vector<cudaEvent_t> layer_events;

  ~Impl() {
    if (staging != nullptr) (void)cudaFreeHost(staging);
    if (copy_stream != nullptr) (void)cudaStreamDestroy(copy_stream);
  }
};

CudaKvStorage::CudaKvStorage(const kv::KvShape& shape, std::unique_ptr<Impl> impl)
    : shape_(shape), impl_(std::move(impl)) {}

CudaKvStorage::~CudaKvStorage() = default;

uint64_t CudaKvStorage::BlockBytes(const kv::KvShape& shape, kv::KvDtype dtype) {
  return uint64_t{2} * static_cast<uint64_t>(shape.n_layers) *
         static_cast<uint64_t>(shape.block_size) * static_cast<uint64_t>(shape.kv_dim()) *
         kv::KvDtypeBytes(dtype);
}

absl::StatusOr<std::unique_ptr<CudaKvStorage>> CudaKvStorage::Create(const kv::KvShape& shape,
                                                                     kv::KvDtype dtype,
                                                                     int32_t num_blocks) {
  if (shape.n_layers <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV shape needs positive fields: n_layers ", shape.n_layers,
                     ", n_kv_heads ", shape.n_kv_heads, ", head_dim ", shape.head_dim,
                     ", block_size ", shape.block_size));
  }
  if (!kv::IsKnownKvDtype(static_cast<uint32_t>(dtype))) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown KV dtype ", static_cast<uint32_t>(dtype)));
  }
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV num_blocks must be at least 1, got ", num_blocks));
  }
  auto impl = std::make_unique<Impl>();
  if (absl::Status s = CudaStatus(
          cudaStreamCreateWithFlags(&impl->copy_stream, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags (KV copy stream)");
      !s.ok()) {
    impl->copy_stream = nullptr;
    return s;
  }
  // Blocks per layer, the scratch block included.
  const int32_t layer_blocks = num_blocks + 1;
  const size_t pool_bytes = static_cast<size_t>(BlockBytes(shape, dtype) / 2) *
                            static_cast<size_t>(layer_blocks);
  absl::StatusOr<DeviceBuffer> k = DeviceBuffer::Allocate(pool_bytes, "the KV cache's K pool");
  if (!k.ok()) return k.status();
  impl->k_pool = *std::move(k);
  absl::StatusOr<DeviceBuffer> v = DeviceBuffer::Allocate(pool_bytes, "the KV cache's V pool");
  if (!v.ok()) return v.status();
  impl->v_pool = *std::move(v);
  if (absl::Status s = CudaStatus(
          cudaMemsetAsync(impl->k_pool.get(), 0, pool_bytes, impl->copy_stream),
          "cudaMemsetAsync (K pool)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(
          cudaMemsetAsync(impl->v_pool.get(), 0, pool_bytes, impl->copy_stream),
          "cudaMemsetAsync (V pool)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(cudaStreamSynchronize(impl->copy_stream),
                                  "cudaStreamSynchronize (KV pool zeroing)");
      !s.ok()) {
    return s;
  }
  const size_t row_bytes = static_cast<size_t>(shape.kv_dim()) * kv::KvDtypeBytes(dtype);
  impl->staging_half = std::max(kStagingBytes, row_bytes);
  void* staging = nullptr;
  if (absl::Status s = CudaStatus(
          cudaHostAlloc(&staging, 2 * impl->staging_half, cudaHostAllocDefault),
          absl::StrCat("cudaHostAlloc of ", 2 * impl->staging_half, " bytes (KV staging)"));
      !s.ok()) {
    (void)cudaGetLastError();
    return s;
  }
  impl->staging = static_cast<char*>(staging);
  impl->layer_events.assign(static_cast<size_t>(shape.n_layers), nullptr);

  PagedKv paged;
  paged.k = impl->k_pool.get();
  paged.v = impl->v_pool.get();
  paged.dtype = dtype;
  paged.n_layers = shape.n_layers;
  paged.num_blocks = layer_blocks;
  paged.block_size = shape.block_size;
  paged.kv_dim = shape.kv_dim();
  std::unique_ptr<CudaKvStorage> storage(new CudaKvStorage(shape, std::move(impl)));
  storage->paged_ = paged;
  return storage;
}

void CudaKvStorage::SetLayerEvent(int32_t layer, cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (layer < 0 || layer >= shape_.n_layers) {
    Fatal(absl::StrCat("SetLayerEvent: layer ", layer, " outside [0, ", shape_.n_layers, ")"));
  }
  impl_->layer_events[static_cast<size_t>(layer)] = event;
}

// Both directions: the range is copied in chunks of the tokens the staging
// holds; each chunk is split into contiguous runs (kv_copy_runs.h), one
// cudaMemcpyAsync per run and pool, then the copy stream (only) is awaited.
void CudaKvStorage::ReadTokens(std::span<const int32_t> block_table, int32_t layer,
                               int32_t token_start, int32_t count, char* k_out,
                               char* v_out) const {
  CopyTokens(/*to_device=*/false, block_table, layer, token_start, count, k_out, v_out);
}

void CudaKvStorage::WriteTokens(std::span<const int32_t> block_table, int32_t layer,
                                int32_t token_start, int32_t count, const char* k,
                                const char* v) {
  // The host rows are only read on this path.
  CopyTokens(/*to_device=*/true, block_table, layer, token_start, count, const_cast<char*>(k),
             const_cast<char*>(v));
}

void CudaKvStorage::CopyTokens(bool to_device, std::span<const int32_t> block_table,
                               int32_t layer, int32_t token_start, int32_t count, char* host_k,
                               char* host_v) const {
  const char* what = to_device ? "WriteTokens" : "ReadTokens";
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (layer < 0 || layer >= shape_.n_layers) {
    Fatal(absl::StrCat(what, ": layer ", layer, " outside [0, ", shape_.n_layers, ")"));
  }
  if (count <= 0) return;
  cudaStream_t stream = impl_->copy_stream;
  if (!to_device) {
    if (cudaEvent_t event = impl_->layer_events[static_cast<size_t>(layer)]; event != nullptr) {
      Check(cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent (KV read)");
    }
  }
  const size_t rb = row_bytes();
  const int32_t chunk = static_cast<int32_t>(
      std::min<size_t>(impl_->staging_half / rb, static_cast<size_t>(count)));
  char* const stage[2] = {impl_->staging, impl_->staging + impl_->staging_half};
  char* const pool[2] = {static_cast<char*>(paged_.k), static_cast<char*>(paged_.v)};
  char* const host[2] = {host_k, host_v};
  const cudaMemcpyKind kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  std::string error;
  for (int32_t done = 0; done < count;) {
    const int32_t n = std::min(chunk, count - done);
    const std::vector<KvCopyRun> runs =
        SplitKvCopyRuns(block_table, layer, paged_.num_blocks, num_blocks(), shape_.block_size,
                        token_start + done, n, &error);
    if (!error.empty()) Fatal(absl::StrCat(what, ": ", error));
    const size_t host_offset = static_cast<size_t>(done) * rb;
    const size_t bytes_in_chunk = static_cast<size_t>(n) * rb;
    if (to_device) {
      for (int kv = 0; kv < 2; ++kv) std::memcpy(stage[kv], host[kv] + host_offset, bytes_in_chunk);
    }
    for (const KvCopyRun& run : runs) {
      const size_t pool_at = static_cast<size_t>(run.pool_row) * rb;
      const size_t stage_at = static_cast<size_t>(run.buffer_row) * rb;
      const size_t bytes = static_cast<size_t>(run.rows) * rb;
      for (int kv = 0; kv < 2; ++kv) {
        void* dst = to_device ? pool[kv] + pool_at : stage[kv] + stage_at;
        const void* src = to_device ? stage[kv] + stage_at : pool[kv] + pool_at;
        Check(cudaMemcpyAsync(dst, src, bytes, kind, stream),
              to_device ? "cudaMemcpyAsync (KV write)" : "cudaMemcpyAsync (KV read)");
      }
    }
    // The staging is reused by the next chunk (and the next call); a
    // writer's caller may free its rows once this returns.
    Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (KV copy)");
    if (!to_device) {
      for (int kv = 0; kv < 2; ++kv) std::memcpy(host[kv] + host_offset, stage[kv], bytes_in_chunk);
    }
    done += n;
  }
}

}  // namespace tandem::backend::cuda
