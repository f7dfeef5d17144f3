// Host-memory stand-ins for the cuda_ipc tests: a kv::DeviceKvAccess over
// host arrays (HostKv, the shared HostDeviceKv with layer events) and an IpcApi (HostIpcApi) whose handles name host
// pointers in a registry shared by the simulated processes of one test
// (HostIpcRegistry). Streams and events model what the data path relies on:
// a stream that waited an event that has not fired holds every event
// recorded on it after the wait (a dead prefill worker); a fired event
// releases them. Copies themselves run at once (CopyFromPeer is a memcpy).
#ifndef TANDEM_TESTS_KVTRANSFER_CUDA_IPC_HOST_IPC_H_
#define TANDEM_TESTS_KVTRANSFER_CUDA_IPC_HOST_IPC_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/kv/device_kv.h"
#include "kvtransfer/cuda_ipc/ipc_api.h"
#include "tests/engine/kv/host_device_kv.h"

namespace tandem::kvtransfer::cuda_ipc::testing {

// An event: a layer event of a HostKv (fired is the test's switch) or a
// local event of a HostIpcApi (ready when every event its stream waited on
// at record time has fired).
struct HostEvent {
  std::atomic<bool> fired{true};
  std::vector<HostEvent*> deps;  // local events: the stream's waits at record
};

// The shared host KV (tests/engine/kv/host_device_kv.h: PagedKv pools in
// host memory, copies at once) with a HostEvent per layer.
class HostKv final : public kv::testing::HostDeviceKv {
 public:
  // with_events false: layer_event() is null until CreateEvents() (a
  // storage before its first Forward).
  HostKv(int32_t n_layers, int32_t layer_blocks, int32_t block_size, int32_t kv_dim,
         kv::KvDtype dtype = kv::KvDtype::kF32, bool with_events = true);

  // The layer's HostEvent; null before CreateEvents or for a layer out of
  // range.
  void* layer_event(int32_t layer) const override;

  void CreateEvents() { events_ready_ = true; }
  // false: the layer's event never fires (until set true again).
  void SetLayerEventFired(int32_t layer, bool fired) { events_[layer]->fired = fired; }

 private:
  const int32_t n_layers_;
  std::vector<std::unique_ptr<HostEvent>> events_;
  bool events_ready_;
};

// What every simulated process of a test shares: handle -> host object.
class HostIpcRegistry {
 public:
  struct Counts {
    int mem_exports = 0, mem_opens = 0, mem_closes = 0;
    int event_exports = 0, event_opens = 0, event_closes = 0;
  };
  std::string Register(const char* kind, void* ptr);
  void* Find(std::string_view handle);
  Counts counts() {
    absl::MutexLock lock(&mu_);
    return counts_;
  }
  template <typename F>
  void Count(F f) {
    absl::MutexLock lock(&mu_);
    f(counts_);
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, void*, std::less<>> handles_ ABSL_GUARDED_BY(mu_);
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

// One simulated process's IpcApi.
class HostIpcApi final : public IpcApi {
 public:
  HostIpcApi(std::shared_ptr<HostIpcRegistry> registry, std::string host_id,
             std::string instance_id, int64_t pid)
      : registry_(std::move(registry)),
        host_id_(std::move(host_id)),
        instance_id_(std::move(instance_id)),
        pid_(pid) {}
  ~HostIpcApi() override;

  std::string HostId() const override { return host_id_; }
  std::string InstanceId() const override { return instance_id_; }
  int64_t Pid() const override { return pid_; }
  absl::StatusOr<std::string> ExportMemory(void* ptr) override;
  absl::StatusOr<void*> OpenMemory(std::string_view handle) override;
  void CloseMemory(void* ptr) override;
  absl::StatusOr<std::string> ExportEvent(void* event) override;
  absl::StatusOr<void*> OpenEvent(std::string_view handle) override;
  void CloseEvent(void* event) override;
  absl::StatusOr<void*> CreateStream() override;
  void DestroyStream(void* stream) override;
  absl::StatusOr<void*> CreateEvent() override;
  void DestroyEvent(void* event) override;
  absl::Status StreamWaitEvent(void* stream, void* event) override;
  absl::Status RecordEvent(void* event, void* stream) override;
  absl::StatusOr<bool> QueryEvent(void* event) override;

  // Streams and local events alive (created, not destroyed).
  int live_streams();
  int live_events();

 private:
  struct Stream {
    std::vector<HostEvent*> waits;
  };
  std::shared_ptr<HostIpcRegistry> registry_;
  const std::string host_id_, instance_id_;
  const int64_t pid_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<HostEvent>> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kvtransfer::cuda_ipc::testing

#endif  // TANDEM_TESTS_KVTRANSFER_CUDA_IPC_HOST_IPC_H_
