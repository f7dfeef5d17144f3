#include "kvtransfer/cuda_ipc/ipc_sender.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvtransfer/cuda_ipc/ipc_codec.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

std::string KeyName(const TransferKey& key) {
  return absl::StrCat("request ", key.request_id, " attempt ", key.attempt);
}

}  // namespace

CudaIpcSender::CudaIpcSender(Options options) : options_(std::move(options)) {}

absl::Status CudaIpcSender::ExportPoolsLocked() {
  if (pools_exported_) return absl::OkStatus();
  kv::DevicePoolInfo info = options_.kv->pool_info();
  absl::StatusOr<std::string> k = options_.api->ExportMemory(info.k);
  if (!k.ok()) return k.status();
  absl::StatusOr<std::string> v = options_.api->ExportMemory(info.v);
  if (!v.ok()) return v.status();
  k_handle_ = *std::move(k);
  v_handle_ = *std::move(v);
  events_.assign(static_cast<size_t>(info.n_layers), ExportedEvent{});
  pools_exported_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::string> CudaIpcSender::EventHandleLocked(int32_t layer, void* event) {
  ExportedEvent& e = events_[static_cast<size_t>(layer)];
  if (e.event != event || e.handle.empty()) {
    absl::StatusOr<std::string> handle = options_.api->ExportEvent(event);
    if (!handle.ok()) return handle.status();
    e.event = event;
    e.handle = *std::move(handle);
  }
  return e.handle;
}

absl::StatusOr<std::string> CudaIpcSender::OpenTransfer(const TransferKey& key,
                                                        const TransportPeer& peer) {
  const std::string host = options_.api->HostId();
  if (!peer.host_id.empty() && peer.host_id != host) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc needs one host: the decode worker ",
                                                   peer.kv_endpoint, " is on host ", peer.host_id,
                                                   ", this prefill worker on ", host));
  }
  absl::MutexLock lock(&mu_);
  if (transfers_.contains(key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc transfer of ", KeyName(key), " is already open"));
  }
  if (absl::Status s = ExportPoolsLocked(); !s.ok()) return s;
  kv::DevicePoolInfo info = options_.kv->pool_info();
  IpcSetup setup;
  setup.host_id = host;
  setup.pid = options_.api->Pid();
  setup.instance_id = options_.api->InstanceId();
  setup.device_ordinal = options_.kv->device_ordinal();
  setup.k_handle = k_handle_;
  setup.v_handle = v_handle_;
  setup.pool_bytes = info.pool_bytes;
  setup.n_layers = info.n_layers;
  setup.layer_blocks = info.layer_blocks;
  setup.block_size = info.block_size;
  setup.kv_dim = info.kv_dim;
  setup.dtype = info.dtype;
  Transfer transfer;
  transfer.setup_events.assign(static_cast<size_t>(info.n_layers), nullptr);
  setup.event_handles.resize(static_cast<size_t>(info.n_layers));
  for (int32_t l = 0; l < info.n_layers; ++l) {
    void* event = options_.kv->layer_event(l);
    if (event == nullptr) continue;  // before the first Forward: frames carry it
    absl::StatusOr<std::string> handle = EventHandleLocked(l, event);
    if (!handle.ok()) return handle.status();
    setup.event_handles[static_cast<size_t>(l)] = *std::move(handle);
    transfer.setup_events[static_cast<size_t>(l)] = event;
  }
  bool events_dropped = false;
  std::string bytes = EncodeSetup(setup, &events_dropped);
  if (events_dropped) transfer.setup_events.assign(transfer.setup_events.size(), nullptr);
  transfers_.emplace(key, std::move(transfer));
  return bytes;
}

absl::StatusOr<FrameDescriptor> CudaIpcSender::SendRows(const TransferKey& key,
                                                        kv::DeviceKvAccess& kv,
                                                        std::span<const int32_t> block_table,
                                                        int32_t layer, int32_t token_start,
                                                        int32_t count) {
  if (&kv != options_.kv) {
    return absl::InvalidArgumentError(
        "cuda_ipc SendRows: 'kv' is not the KV storage this data path exports");
  }
  kv::DevicePoolInfo info = kv.pool_info();
  if (layer < 0 || layer >= info.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc SendRows: 'layer' ", layer, " outside [0, ", info.n_layers, ")"));
  }
  if (count < 1 || token_start < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc SendRows: bad range 'token_start' ",
                                                   token_start, " 'count' ", count));
  }
  const int64_t end = static_cast<int64_t>(token_start) + count;
  const int64_t first = token_start / info.block_size;
  const int64_t last = (end - 1) / info.block_size;
  if (last >= static_cast<int64_t>(block_table.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc SendRows: tokens [", token_start, ", ", end, ") need ", last + 1,
                     " blocks, 'block_table' has ", block_table.size()));
  }
  IpcLocator locator;
  locator.first_block = static_cast<uint32_t>(first);
  for (int64_t i = first; i <= last; ++i) {
    int32_t b = block_table[static_cast<size_t>(i)];
    if (b < 0 || b >= info.layer_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc SendRows: 'block_table[", i, "]' ",
                                                     b, " outside [0, ", info.layer_blocks, ")"));
    }
    locator.blocks.push_back(b);
  }
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(key);
  if (it == transfers_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda_ipc SendRows: no open transfer for ", KeyName(key)));
  }
  void* event = kv.layer_event(layer);
  if (event == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cuda_ipc SendRows: layer ", layer,
                                                      " has no event (no Forward wrote it yet)"));
  }
  if (it->second.setup_events[static_cast<size_t>(layer)] != event) {
    absl::StatusOr<std::string> handle = EventHandleLocked(layer, event);
    if (!handle.ok()) return handle.status();
    locator.event_handle = *std::move(handle);
  }
  FrameDescriptor desc;
  desc.request_id = key.request_id;
  desc.attempt = key.attempt;
  desc.layer = static_cast<uint32_t>(layer);
  desc.token_start = static_cast<uint32_t>(token_start);
  desc.token_count = static_cast<uint32_t>(count);
  desc.comm_seq = it->second.frames;
  desc.locator = EncodeLocator(locator);
  if (desc.locator.size() > kMaxLocatorBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda_ipc SendRows: tokens [", token_start, ", ", end, ") span ", locator.blocks.size(),
        " blocks, more than a locator holds; send smaller ranges"));
  }
  ++it->second.frames;
  bytes_total_ += 2ull * static_cast<uint64_t>(count) * static_cast<uint64_t>(info.kv_dim) *
                  kv::KvDtypeBytes(info.dtype);
  return desc;
}

std::optional<absl::Status> CudaIpcSender::Poll(const TransferKey& key,
                                                const absl::Status& control) {
  if (control.ok()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(key);
  if (it == transfers_.end() || it->second.frames == 0) return control;
  const absl::Time now = Now();
  if (!it->second.failure_seen.has_value()) it->second.failure_seen = now;
  if (now - *it->second.failure_seen < absl::Milliseconds(options_.transfer_timeout_ms)) {
    return std::nullopt;
  }
  return control;
}

void CudaIpcSender::CloseTransfer(const TransferKey& key) {
  absl::MutexLock lock(&mu_);
  transfers_.erase(key);
}

}  // namespace tandem::kvtransfer::cuda_ipc
