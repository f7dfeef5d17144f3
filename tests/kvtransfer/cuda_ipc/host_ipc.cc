#include "tests/kvtransfer/cuda_ipc/host_ipc.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::cuda_ipc::testing {

HostKv::HostKv(int32_t n_layers, int32_t layer_blocks, int32_t block_size, int32_t kv_dim,
               kv::KvDtype dtype, bool with_events)
    : events_ready_(with_events) {
  shape_.n_layers = n_layers;
  shape_.layer_blocks = layer_blocks;
  shape_.block_size = block_size;
  shape_.kv_dim = kv_dim;
  shape_.dtype = dtype;
  shape_.pool_bytes = static_cast<uint64_t>(n_layers) * layer_blocks * block_size * row_bytes();
  k_.assign(shape_.pool_bytes, 0);
  v_.assign(shape_.pool_bytes, 0);
  for (int32_t l = 0; l < n_layers; ++l) events_.push_back(std::make_unique<HostEvent>());
}

uint64_t HostKv::row_bytes() const {
  return static_cast<uint64_t>(shape_.kv_dim) * kv::KvDtypeBytes(shape_.dtype);
}

kv::DevicePoolInfo HostKv::pool_info() const {
  kv::DevicePoolInfo info = shape_;
  info.k = const_cast<uint8_t*>(k_.data());
  info.v = const_cast<uint8_t*>(v_.data());
  return info;
}

void* HostKv::layer_event(int32_t layer) const {
  if (!events_ready_ || layer < 0 || layer >= shape_.n_layers) return nullptr;
  return events_[layer].get();
}

int64_t HostKv::RowOffset(const kv::DevicePoolInfo& info, std::span<const int32_t> table,
                          int32_t layer, int64_t token) {
  const int64_t index = token / info.block_size;
  if (index >= static_cast<int64_t>(table.size())) return -1;
  const int32_t block = table[index];
  if (block < 0 || block >= info.layer_blocks) return -1;
  const int64_t row = (static_cast<int64_t>(layer) * info.layer_blocks + block) * info.block_size +
                      token % info.block_size;
  return row * info.kv_dim * kv::KvDtypeBytes(info.dtype);
}

absl::Status HostKv::GatherRows(std::span<const int32_t> table, int32_t layer, int32_t token_start,
                                int32_t count, void* dst, void*) {
  const uint64_t rb = row_bytes();
  auto* out = static_cast<uint8_t*>(dst);
  for (int32_t i = 0; i < count; ++i) {
    int64_t off = RowOffset(shape_, table, layer, token_start + i);
    if (off < 0 || layer < 0 || layer >= shape_.n_layers) {
      return absl::InvalidArgumentError(absl::StrCat("GatherRows: token ", token_start + i));
    }
    std::memcpy(out + i * rb, k_.data() + off, rb);
    std::memcpy(out + (count + i) * rb, v_.data() + off, rb);
  }
  return absl::OkStatus();
}

absl::Status HostKv::ScatterRows(std::span<const int32_t> table, int32_t layer, int32_t token_start,
                                 int32_t count, const void* src, void*) {
  const uint64_t rb = row_bytes();
  const auto* in = static_cast<const uint8_t*>(src);
  for (int32_t i = 0; i < count; ++i) {
    int64_t off = RowOffset(shape_, table, layer, token_start + i);
    if (off < 0 || layer < 0 || layer >= shape_.n_layers) {
      return absl::InvalidArgumentError(absl::StrCat("ScatterRows: token ", token_start + i));
    }
    std::memcpy(k_.data() + off, in + i * rb, rb);
    std::memcpy(v_.data() + off, in + (count + i) * rb, rb);
  }
  return absl::OkStatus();
}

absl::Status HostKv::CopyFromPeer(const kv::DevicePoolInfo& peer,
                                  std::span<const int32_t> peer_table,
                                  std::span<const int32_t> block_table, int32_t layer,
                                  int32_t token_start, int32_t count, void* stream) {
  if (peer.n_layers != shape_.n_layers) return absl::InvalidArgumentError("CopyFromPeer: n_layers");
  if (peer.kv_dim != shape_.kv_dim) return absl::InvalidArgumentError("CopyFromPeer: kv_dim");
  if (peer.dtype != shape_.dtype) return absl::InvalidArgumentError("CopyFromPeer: dtype");
  if (layer < 0 || layer >= shape_.n_layers || count < 1 || token_start < 0) {
    return absl::InvalidArgumentError("CopyFromPeer: range");
  }
  if (stream == nullptr) return absl::InvalidArgumentError("CopyFromPeer: null stream");
  const uint64_t rb = row_bytes();
  for (int32_t i = 0; i < count; ++i) {
    int64_t from = RowOffset(peer, peer_table, layer, token_start + i);
    int64_t to = RowOffset(shape_, block_table, layer, token_start + i);
    if (from < 0 || to < 0 || static_cast<uint64_t>(from) + rb > peer.pool_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("CopyFromPeer: token ", token_start + i, " outside a table"));
    }
    std::memcpy(k_.data() + to, static_cast<const uint8_t*>(peer.k) + from, rb);
    std::memcpy(v_.data() + to, static_cast<const uint8_t*>(peer.v) + from, rb);
  }
  ++copies_;
  return absl::OkStatus();
}

std::string HostIpcRegistry::Register(const char* kind, void* ptr) {
  absl::MutexLock lock(&mu_);
  std::string handle = absl::StrCat(kind, ":", handles_.size());
  handles_[handle] = ptr;
  return handle;
}

void* HostIpcRegistry::Find(std::string_view handle) {
  absl::MutexLock lock(&mu_);
  auto it = handles_.find(handle);
  return it == handles_.end() ? nullptr : it->second;
}

HostIpcApi::~HostIpcApi() = default;

absl::StatusOr<std::string> HostIpcApi::ExportMemory(void* ptr) {
  registry_->Count([](auto& c) { ++c.mem_exports; });
  return registry_->Register("mem", ptr);
}

absl::StatusOr<void*> HostIpcApi::OpenMemory(std::string_view handle) {
  void* ptr = handle.starts_with("mem:") ? registry_->Find(handle) : nullptr;
  if (ptr == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("no memory ", std::string(handle)));
  registry_->Count([](auto& c) { ++c.mem_opens; });
  return ptr;
}

void HostIpcApi::CloseMemory(void*) {
  registry_->Count([](auto& c) { ++c.mem_closes; });
}

absl::StatusOr<std::string> HostIpcApi::ExportEvent(void* event) {
  registry_->Count([](auto& c) { ++c.event_exports; });
  return registry_->Register("event", event);
}

absl::StatusOr<void*> HostIpcApi::OpenEvent(std::string_view handle) {
  void* event = handle.starts_with("event:") ? registry_->Find(handle) : nullptr;
  if (event == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("no event ", std::string(handle)));
  registry_->Count([](auto& c) { ++c.event_opens; });
  return event;
}

void HostIpcApi::CloseEvent(void*) {
  registry_->Count([](auto& c) { ++c.event_closes; });
}

absl::StatusOr<void*> HostIpcApi::CreateStream() {
  absl::MutexLock lock(&mu_);
  streams_.push_back(std::make_unique<Stream>());
  return static_cast<void*>(streams_.back().get());
}

void HostIpcApi::DestroyStream(void* stream) {
  absl::MutexLock lock(&mu_);
  std::erase_if(streams_, [&](const auto& s) { return s.get() == stream; });
}

absl::StatusOr<void*> HostIpcApi::CreateEvent() {
  absl::MutexLock lock(&mu_);
  events_.push_back(std::make_unique<HostEvent>());
  return static_cast<void*>(events_.back().get());
}

void HostIpcApi::DestroyEvent(void* event) {
  absl::MutexLock lock(&mu_);
  std::erase_if(events_, [&](const auto& e) { return e.get() == event; });
}

absl::Status HostIpcApi::StreamWaitEvent(void* stream, void* event) {
  absl::MutexLock lock(&mu_);
  static_cast<Stream*>(stream)->waits.push_back(static_cast<HostEvent*>(event));
  return absl::OkStatus();
}

absl::Status HostIpcApi::RecordEvent(void* event, void* stream) {
  absl::MutexLock lock(&mu_);
  static_cast<HostEvent*>(event)->deps = static_cast<Stream*>(stream)->waits;
  return absl::OkStatus();
}

absl::StatusOr<bool> HostIpcApi::QueryEvent(void* event) {
  absl::MutexLock lock(&mu_);
  const auto& deps = static_cast<HostEvent*>(event)->deps;
  return std::all_of(deps.begin(), deps.end(), [](HostEvent* e) { return e->fired.load(); });
}

int HostIpcApi::live_streams() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

int HostIpcApi::live_events() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(events_.size());
}

}  // namespace tandem::kvtransfer::cuda_ipc::testing
