#include "tests/kvtransfer/cuda_ipc/host_ipc.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::cuda_ipc::testing {

HostKv::HostKv(int32_t n_layers, int32_t layer_blocks, int32_t block_size, int32_t kv_dim,
               kv::KvDtype dtype, bool with_events)
    : HostDeviceKv(n_layers, layer_blocks, block_size, kv_dim, dtype),
      n_layers_(n_layers),
      events_ready_(with_events) {
  for (int32_t l = 0; l < n_layers; ++l) events_.push_back(std::make_unique<HostEvent>());
}

void* HostKv::layer_event(int32_t layer) const {
  if (!events_ready_ || layer < 0 || layer >= n_layers_) return nullptr;
  return events_[layer].get();
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
