#include "tests/engine/kv/host_device_kv.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::kv::testing {
namespace {

// OK when `table` covers tokens [start, start + count) of `layer` in pools
// of `shape` (block_size, layer_blocks, n_layers); INVALID_ARGUMENT naming
// `what` and the field otherwise.
absl::Status CheckTable(const DevicePoolInfo& shape, std::span<const int32_t> table,
                        int32_t layer, int32_t start, int32_t count, const char* what) {
  if (layer < 0 || layer >= shape.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": layer ", layer, " outside [0, ", shape.n_layers, ")"));
  }
  if (start < 0 || count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": token_start ", start, " or count ", count, " is negative"));
  }
  const int64_t end = int64_t{start} + count;
  if (end > static_cast<int64_t>(table.size()) * shape.block_size) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": tokens [", start, ", ", end,
                                                   ") outside a table of ", table.size(),
                                                   " blocks of ", shape.block_size));
  }
  for (int64_t t = start; t < end; ++t) {
    const int32_t block = table[t / shape.block_size];
    if (block < 0 || block >= shape.layer_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": block ", block, " outside [0, ",
                                                     shape.layer_blocks, ")"));
    }
  }
  return absl::OkStatus();
}

// Byte offset of token `token` of `layer` in a pool of `shape`'s layout
// (PagedKv, device_kv.h) at the block `table` names for it.
uint64_t RowOffset(const DevicePoolInfo& shape, std::span<const int32_t> table, int32_t layer,
                   int64_t token) {
  const uint64_t row = (static_cast<uint64_t>(layer) * shape.layer_blocks +
                        static_cast<uint64_t>(table[token / shape.block_size])) *
                           shape.block_size +
                       static_cast<uint64_t>(token % shape.block_size);
  return row * static_cast<uint64_t>(shape.kv_dim) * KvDtypeBytes(shape.dtype);
}

}  // namespace

HostDeviceKv::HostDeviceKv(int32_t n_layers, int32_t layer_blocks, int32_t block_size,
                           int32_t kv_dim, KvDtype dtype)
    : row_bytes_(static_cast<uint64_t>(kv_dim) * KvDtypeBytes(dtype)) {
  shape_.n_layers = n_layers;
  shape_.layer_blocks = layer_blocks;
  shape_.block_size = block_size;
  shape_.kv_dim = kv_dim;
  shape_.dtype = dtype;
  shape_.pool_bytes = static_cast<uint64_t>(n_layers) * layer_blocks * block_size * row_bytes_;
  k_.assign(shape_.pool_bytes, 0);
  v_.assign(shape_.pool_bytes, 0);
}

void HostDeviceKv::FillRandom(uint32_t seed) {
  std::mt19937 rng(seed);
  for (char& c : k_) c = static_cast<char>(rng());
  for (char& c : v_) c = static_cast<char>(rng());
}

absl::Status HostDeviceKv::CheckRange(std::span<const int32_t> table, int32_t layer,
                                      int32_t start, int32_t count, const char* what) const {
  return CheckTable(shape_, table, layer, start, count, what);
}

void HostDeviceKv::CheckOrAbort(std::span<const int32_t> table, int32_t layer, int32_t start,
                                int32_t count, const char* what) const {
  if (absl::Status s = CheckRange(table, layer, start, count, what); !s.ok()) {
    std::fprintf(stderr, "HostDeviceKv: %s\n", s.ToString().c_str());
    std::abort();  // a test bug
  }
}

void HostDeviceKv::ReadTokens(std::span<const int32_t> table, int32_t layer, int32_t start,
                              int32_t count, char* k_out, char* v_out) const {
  CheckOrAbort(table, layer, start, count, "ReadTokens");
  for (int32_t i = 0; i < count; ++i) {
    const uint64_t at = RowOffset(shape_, table, layer, int64_t{start} + i);
    std::memcpy(k_out + i * row_bytes_, k_.data() + at, row_bytes_);
    std::memcpy(v_out + i * row_bytes_, v_.data() + at, row_bytes_);
  }
}

void HostDeviceKv::WriteTokens(std::span<const int32_t> table, int32_t layer, int32_t start,
                               int32_t count, const char* k, const char* v) {
  CheckOrAbort(table, layer, start, count, "WriteTokens");
  for (int32_t i = 0; i < count; ++i) {
    const uint64_t at = RowOffset(shape_, table, layer, int64_t{start} + i);
    std::memcpy(k_.data() + at, k + i * row_bytes_, row_bytes_);
    std::memcpy(v_.data() + at, v + i * row_bytes_, row_bytes_);
  }
}

std::string HostDeviceKv::Rows(std::span<const int32_t> table, int32_t layer, int32_t start,
                               int32_t count) const {
  std::string frame(2 * static_cast<uint64_t>(count) * row_bytes_, '\0');
  ReadTokens(table, layer, start, count, frame.data(), frame.data() + count * row_bytes_);
  return frame;
}

DevicePoolInfo HostDeviceKv::pool_info() const {
  DevicePoolInfo info = shape_;
  info.k = const_cast<char*>(k_.data());
  info.v = const_cast<char*>(v_.data());
  return info;
}

absl::Status HostDeviceKv::MoveRows(bool gather, std::span<const int32_t> block_table,
                                    int32_t layer, int32_t token_start, int32_t count,
                                    void* frame, void* stream) {
  const char* what = gather ? "GatherRows" : "ScatterRows";
  if (absl::Status s = CheckRange(block_table, layer, token_start, count, what); !s.ok()) {
    return s;
  }
  if (count > 0 && frame == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the frame buffer is null"));
  }
  ++(gather ? gathers_ : scatters_);
  Run(stream, [this, gather, table = std::vector<int32_t>(block_table.begin(), block_table.end()),
               layer, token_start, count, frame] {
    char* k = static_cast<char*>(frame);
    char* v = k + count * row_bytes_;
    if (gather) {
      ReadTokens(table, layer, token_start, count, k, v);
    } else {
      WriteTokens(table, layer, token_start, count, k, v);
    }
  });
  return absl::OkStatus();
}

absl::Status HostDeviceKv::GatherRows(std::span<const int32_t> block_table, int32_t layer,
                                      int32_t token_start, int32_t count, void* dst,
                                      void* stream) {
  return MoveRows(/*gather=*/true, block_table, layer, token_start, count, dst, stream);
}

absl::Status HostDeviceKv::ScatterRows(std::span<const int32_t> block_table, int32_t layer,
                                       int32_t token_start, int32_t count, const void* src,
                                       void* stream) {
  // The frame is only read on this path.
  return MoveRows(/*gather=*/false, block_table, layer, token_start, count,
                  const_cast<void*>(src), stream);
}

absl::Status HostDeviceKv::CopyFromPeer(const DevicePoolInfo& peer,
                                        std::span<const int32_t> peer_table,
                                        std::span<const int32_t> block_table, int32_t layer,
                                        int32_t token_start, int32_t count, void* stream) {
  auto mismatch = [](const char* field, int64_t peer_value, int64_t own) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyFromPeer: the peer's ", field, " ", peer_value, " differs from this one's ", own));
  };
  if (peer.n_layers != shape_.n_layers) return mismatch("n_layers", peer.n_layers, shape_.n_layers);
  if (peer.kv_dim != shape_.kv_dim) return mismatch("kv_dim", peer.kv_dim, shape_.kv_dim);
  if (peer.dtype != shape_.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("CopyFromPeer: the peer's dtype ",
                                                   KvDtypeName(peer.dtype), " differs from ",
                                                   KvDtypeName(shape_.dtype)));
  }
  const uint64_t peer_pool = static_cast<uint64_t>(peer.n_layers) * peer.layer_blocks *
                             peer.block_size * row_bytes_;
  if (peer.k == nullptr || peer.v == nullptr || peer.block_size <= 0 ||
      peer.layer_blocks <= 0 || peer.pool_bytes < peer_pool) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyFromPeer: the peer's pools are not set or too small (pool_bytes ", peer.pool_bytes,
        ", the shape needs ", peer_pool, ")"));
  }
  if (stream == nullptr) return absl::InvalidArgumentError("CopyFromPeer: null stream");
  if (absl::Status s = CheckTable(peer, peer_table, layer, token_start, count,
                                  "CopyFromPeer (peer table)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange(block_table, layer, token_start, count,
                                  "CopyFromPeer (own table)");
      !s.ok()) {
    return s;
  }
  ++copies_;
  Run(stream, [this, peer, from_table = std::vector<int32_t>(peer_table.begin(), peer_table.end()),
               to_table = std::vector<int32_t>(block_table.begin(), block_table.end()), layer,
               token_start, count] {
    for (int64_t t = token_start; t < int64_t{token_start} + count; ++t) {
      const uint64_t from = RowOffset(peer, from_table, layer, t);
      const uint64_t to = RowOffset(shape_, to_table, layer, t);
      std::memcpy(k_.data() + to, static_cast<const char*>(peer.k) + from, row_bytes_);
      std::memcpy(v_.data() + to, static_cast<const char*>(peer.v) + from, row_bytes_);
    }
  });
  return absl::OkStatus();
}

}  // namespace tandem::kv::testing
