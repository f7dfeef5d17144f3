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
#include "engine/backend/cuda/kv_staging.h"

#define KV_RETURN_IF_ERROR(expr)             \
  do {                                       \
    absl::Status kv_status_ = (expr);        \
    if (!kv_status_.ok()) return kv_status_; \
  } while (false)

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
  std::mutex mu;                 // the staging buffer, the copy stream's work
  mutable std::mutex events_mu;  // layer_events (taken inside mu, never around a copy)
  std::vector<cudaEvent_t> layer_events;
  int device = 0;  // the CUDA device of the pools

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
    return absl::InvalidArgumentError(absl::StrCat(
        "KV shape needs positive fields: n_layers ", shape.n_layers, ", n_kv_heads ",
        shape.n_kv_heads, ", head_dim ", shape.head_dim, ", block_size ", shape.block_size));
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
  if (absl::Status s = CudaStatus(cudaGetDevice(&impl->device), "cudaGetDevice"); !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CudaStatus(cudaStreamCreateWithFlags(&impl->copy_stream, cudaStreamNonBlocking),
                     "cudaStreamCreateWithFlags (KV copy stream)");
      !s.ok()) {
    impl->copy_stream = nullptr;
    return s;
  }
  // Blocks per layer, the scratch block included.
  const int32_t layer_blocks = num_blocks + 1;
  const size_t pool_bytes =
      static_cast<size_t>(BlockBytes(shape, dtype) / 2) * static_cast<size_t>(layer_blocks);
  absl::StatusOr<DeviceBuffer> k = DeviceBuffer::Allocate(pool_bytes, "the KV cache's K pool");
  if (!k.ok()) return k.status();
  impl->k_pool = *std::move(k);
  absl::StatusOr<DeviceBuffer> v = DeviceBuffer::Allocate(pool_bytes, "the KV cache's V pool");
  if (!v.ok()) return v.status();
  impl->v_pool = *std::move(v);
  if (absl::Status s =
          CudaStatus(cudaMemsetAsync(impl->k_pool.get(), 0, pool_bytes, impl->copy_stream),
                     "cudaMemsetAsync (K pool)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CudaStatus(cudaMemsetAsync(impl->v_pool.get(), 0, pool_bytes, impl->copy_stream),
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
  std::lock_guard<std::mutex> lock(impl_->events_mu);
  if (layer < 0 || layer >= shape_.n_layers) {
    Fatal(absl::StrCat("SetLayerEvent: layer ", layer, " outside [0, ", shape_.n_layers, ")"));
  }
  impl_->layer_events[static_cast<size_t>(layer)] = event;
}

cudaEvent_t CudaKvStorage::LayerEventOrNull(int32_t layer) const {
  std::lock_guard<std::mutex> lock(impl_->events_mu);
  if (layer < 0 || layer >= shape_.n_layers) return nullptr;
  return impl_->layer_events[static_cast<size_t>(layer)];
}

// Both directions: the range is copied in chunks of the tokens the staging
// holds; each chunk is split into contiguous runs (kv_copy_runs.h), one
// cudaMemcpyAsync per run and pool, then the copy stream (only) is awaited.
void CudaKvStorage::ReadTokens(std::span<const int32_t> block_table, int32_t layer,
                               int32_t token_start, int32_t count, char* k_out, char* v_out) const {
  CopyTokens(/*to_device=*/false, block_table, layer, token_start, count, k_out, v_out);
}

void CudaKvStorage::WriteTokens(std::span<const int32_t> block_table, int32_t layer,
                                int32_t token_start, int32_t count, const char* k, const char* v) {
  // The host rows are only read on this path.
  CopyTokens(/*to_device=*/true, block_table, layer, token_start, count, const_cast<char*>(k),
             const_cast<char*>(v));
}

void CudaKvStorage::CopyTokens(bool to_device, std::span<const int32_t> block_table, int32_t layer,
                               int32_t token_start, int32_t count, char* host_k,
                               char* host_v) const {
  const char* what = to_device ? "WriteTokens" : "ReadTokens";
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (layer < 0 || layer >= shape_.n_layers) {
    Fatal(absl::StrCat(what, ": layer ", layer, " outside [0, ", shape_.n_layers, ")"));
  }
  if (count <= 0) return;
  cudaStream_t stream = impl_->copy_stream;
  if (!to_device) {
    if (cudaEvent_t event = LayerEventOrNull(layer); event != nullptr) {
      Check(cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent (KV read)");
    }
  }
  KvStagingRange range;
  range.block_table = block_table;
  range.layer = layer;
  range.layer_blocks = paged_.num_blocks;
  range.max_block = num_blocks();
  range.block_size = shape_.block_size;
  range.token_start = token_start;
  range.count = count;
  range.row_bytes = row_bytes();
  char* const stage[2] = {impl_->staging, impl_->staging + impl_->staging_half};
  char* const pool[2] = {static_cast<char*>(paged_.k), static_cast<char*>(paged_.v)};
  char* const host[2] = {host_k, host_v};
  const cudaMemcpyKind kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  const absl::Status copied = CopyKvThroughStaging(
      range, to_device, stage, impl_->staging_half, host,
      [&](int kv, size_t pool_offset, size_t stage_offset, size_t bytes) {
        void* dst = to_device ? pool[kv] + pool_offset : stage[kv] + stage_offset;
        const void* src = to_device ? stage[kv] + stage_offset : pool[kv] + pool_offset;
        Check(cudaMemcpyAsync(dst, src, bytes, kind, stream),
              to_device ? "cudaMemcpyAsync (KV write)" : "cudaMemcpyAsync (KV read)");
      },
      [&] { Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (KV copy)"); });
  if (!copied.ok()) Fatal(absl::StrCat(what, ": ", copied.message()));
}

namespace {

// The span of `table` holding tokens [token_start, token_start + count)
// (count > 0, the range checked by SplitKvCopyRuns).
KvBlockSpan SpanOf(std::span<const int32_t> table, int32_t block_size, int32_t token_start,
                   int32_t count) {
  KvBlockSpan span;
  const int32_t first = token_start / block_size;
  const int32_t last = (token_start + count - 1) / block_size;
  span.first_token = first * block_size;
  span.n_blocks = last - first + 1;
  for (int32_t i = 0; i < span.n_blocks; ++i) span.ids[i] = table[static_cast<size_t>(first + i)];
  return span;
}

// Tokens per launch such that a piece spans at most kKvSpanBlocks blocks
// of a pool with blocks of `block_size` tokens (ceil(n / bs) + 1 blocks
// at most for an unaligned piece of n tokens).
int32_t PieceTokens(int32_t block_size) { return (kKvSpanBlocks - 1) * block_size; }

[[nodiscard]] absl::Status CheckRange(std::span<const int32_t> table, int32_t layer,
                                      int32_t layer_blocks, int32_t max_block, int32_t block_size,
                                      int32_t token_start, int32_t count, const char* side) {
  std::string error;
  (void)SplitKvCopyRuns(table, layer, layer_blocks, max_block, block_size, token_start, count,
                        &error);
  if (!error.empty()) return absl::InvalidArgumentError(absl::StrCat(side, ": ", error));
  return absl::OkStatus();
}

}  // namespace

int CudaKvStorage::device_ordinal() const { return impl_->device; }

kv::DevicePoolInfo CudaKvStorage::pool_info() const {
  kv::DevicePoolInfo info;
  info.k = paged_.k;
  info.v = paged_.v;
  info.pool_bytes = BlockBytes(shape_, paged_.dtype) / 2 * static_cast<uint64_t>(paged_.num_blocks);
  info.n_layers = paged_.n_layers;
  info.layer_blocks = paged_.num_blocks;
  info.block_size = paged_.block_size;
  info.kv_dim = paged_.kv_dim;
  info.dtype = paged_.dtype;
  return info;
}

void* CudaKvStorage::layer_event(int32_t layer) const { return LayerEventOrNull(layer); }

absl::Status CudaKvStorage::MoveRows(bool gather, std::span<const int32_t> block_table,
                                     int32_t layer, int32_t token_start, int32_t count, void* frame,
                                     void* stream) {
  const char* what = gather ? "GatherRows" : "ScatterRows";
  if (layer < 0 || layer >= shape_.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": layer ", layer, " outside [0, ", shape_.n_layers, ")"));
  }
  if (absl::Status s = CheckRange(block_table, layer, paged_.num_blocks, num_blocks(),
                                  shape_.block_size, token_start, count, what);
      !s.ok()) {
    return s;
  }
  if (count > 0 && frame == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the frame buffer is null"));
  }
  if (count == 0) return absl::OkStatus();
  KV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(impl_->device), "cudaSetDevice"));
  auto s = static_cast<cudaStream_t>(stream);
  if (gather) {
    if (cudaEvent_t event = LayerEventOrNull(layer); event != nullptr) {
      KV_RETURN_IF_ERROR(
          CudaStatus(cudaStreamWaitEvent(s, event, 0), "cudaStreamWaitEvent (GatherRows)"));
    }
  }
  const size_t rb = row_bytes();
  char* const k_rows = static_cast<char*>(frame);
  char* const v_rows = k_rows + static_cast<size_t>(count) * rb;
  const int32_t piece = PieceTokens(shape_.block_size);
  for (int32_t done = 0; done < count; done += piece) {
    const int32_t n = std::min(piece, count - done);
    const int32_t start = token_start + done;
    const KvBlockSpan span = SpanOf(block_table, shape_.block_size, start, n);
    char* k = k_rows + static_cast<size_t>(done) * rb;
    char* v = v_rows + static_cast<size_t>(done) * rb;
    const cudaError_t e = gather ? LaunchKvGather(paged_, layer, span, start, n, k, v, s)
                                 : LaunchKvScatter(paged_, layer, span, start, n, k, v, s);
    KV_RETURN_IF_ERROR(CudaStatus(e, gather ? "LaunchKvGather" : "LaunchKvScatter"));
  }
  return absl::OkStatus();
}
absl::Status CudaKvStorage::GatherRows(std::span<const int32_t> block_table, int32_t layer,
                                       int32_t token_start, int32_t count, void* dst,
                                       void* stream) {
  return MoveRows(/*gather=*/true, block_table, layer, token_start, count, dst, stream);
}

absl::Status CudaKvStorage::ScatterRows(std::span<const int32_t> block_table, int32_t layer,
                                        int32_t token_start, int32_t count, const void* src,
                                        void* stream) {
  // The frame is only read on this path.
  return MoveRows(/*gather=*/false, block_table, layer, token_start, count, const_cast<void*>(src),
                  stream);
}

absl::Status CudaKvStorage::CopyFromPeer(const kv::DevicePoolInfo& peer,
                                         std::span<const int32_t> peer_table,
                                         std::span<const int32_t> block_table, int32_t layer,
                                         int32_t token_start, int32_t count, void* stream) {
  auto mismatch = [](const char* field, int64_t peer_value, int64_t own) {
    return absl::InvalidArgumentError(absl::StrCat("CopyFromPeer: the peer's ", field, " ",
                                                   peer_value, " differs from this KV cache's ",
                                                   own));
  };
  if (peer.n_layers != shape_.n_layers) return mismatch("n_layers", peer.n_layers, shape_.n_layers);
  if (peer.kv_dim != paged_.kv_dim) return mismatch("kv_dim", peer.kv_dim, paged_.kv_dim);
  if (peer.dtype != paged_.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyFromPeer: the peer's dtype ", kv::KvDtypeName(peer.dtype),
                     " differs from this KV cache's ", kv::KvDtypeName(paged_.dtype)));
  }
  if (peer.block_size <= 0 || peer.layer_blocks <= 0 || peer.k == nullptr || peer.v == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyFromPeer: the peer's pools are not set (block_size ", peer.block_size,
                     ", layer_blocks ", peer.layer_blocks, ", k/v null: ", peer.k == nullptr, "/",
                     peer.v == nullptr, ")"));
  }
  if (layer < 0 || layer >= shape_.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyFromPeer: layer ", layer, " outside [0, ", shape_.n_layers, ")"));
  }
  KV_RETURN_IF_ERROR(CheckRange(peer_table, layer, peer.layer_blocks, peer.layer_blocks,
                                peer.block_size, token_start, count, "CopyFromPeer (peer table)"));
  KV_RETURN_IF_ERROR(CheckRange(block_table, layer, paged_.num_blocks, num_blocks(),
                                shape_.block_size, token_start, count, "CopyFromPeer (own table)"));
  if (count == 0) return absl::OkStatus();
  KV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(impl_->device), "cudaSetDevice"));
  PagedKv src;
  src.k = peer.k;
  src.v = peer.v;
  src.dtype = peer.dtype;
  src.n_layers = peer.n_layers;
  src.num_blocks = peer.layer_blocks;
  src.block_size = peer.block_size;
  src.kv_dim = peer.kv_dim;
  // Pieces whose tokens span at most kKvSpanBlocks blocks on either side.
  const int32_t piece = PieceTokens(std::min(peer.block_size, shape_.block_size));
  for (int32_t done = 0; done < count; done += piece) {
    const int32_t n = std::min(piece, count - done);
    const int32_t start = token_start + done;
    const KvBlockSpan src_span = SpanOf(peer_table, peer.block_size, start, n);
    const KvBlockSpan dst_span = SpanOf(block_table, shape_.block_size, start, n);
    KV_RETURN_IF_ERROR(CudaStatus(LaunchKvCopyPeer(src, src_span, paged_, dst_span, layer, start, n,
                                                   static_cast<cudaStream_t>(stream)),
                                  "LaunchKvCopyPeer"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::backend::cuda
