// What NcclSender (P) and NcclReceiver (D) share: the lock, the channels
// to poll, the callbacks deferred to the NCCL thread, the watchdog turn
// (Tick) and shutdown.
//
// Threads: Tick on the NCCL thread; the rest under mu_ from the caller.
// Callbacks a caller must not see inline (Receive's done) are deferred
// and run by Tick on the NCCL thread without the lock; communicators are
// aborted there too, without the lock.
#ifndef TANDEM_KVTRANSFER_NCCL_NCCL_ENDPOINT_H_
#define TANDEM_KVTRANSFER_NCCL_NCCL_ENDPOINT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/kv/device_kv.h"
#include "kvtransfer/nccl/channel.h"
#include "kvtransfer/nccl/nccl_comm.h"
#include "kvtransfer/nccl/nccl_data_plane.h"
#include "kvtransfer/nccl/nccl_thread.h"

namespace tandem::kvtransfer::nccl {

// The K+V bytes of `count` tokens in `pool`'s layout: KvLayout::FrameBytes
// (2 * count * kv_dim * dtype bytes), the size of a TCP FRAME's payload.
uint64_t DeviceFrameBytes(const kv::DevicePoolInfo& pool, uint32_t count);

class NcclEndpoint {
 public:
  NcclEndpoint(const NcclDataPlaneOptions& options, std::shared_ptr<NcclCommFactory> factory,
               std::shared_ptr<DeviceOps> device, int rank);
  virtual ~NcclEndpoint();

  // Before any other call; the thread outlives every use until Shutdown.
  void set_thread(NcclThread* thread) { thread_ = thread; }
  // One watchdog turn (NCCL thread). True while something is pending.
  bool Tick();
  // After the NCCL thread stopped: fails every channel with CANCELLED,
  // aborts their communicators and runs the deferred callbacks here.
  void Shutdown();

 protected:
  // A channel of this endpoint's rank with a fresh transfer stream, polled
  // from the next Tick. Errors: the stream's.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Channel>> NewChannel(std::string peer,
                                                                    uint64_t generation,
                                                                    std::string unique_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the derived class's references to channels and transfers
  // (Shutdown, after every channel failed).
  virtual void ForgetAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // Runs `callback` on the NCCL thread, without the lock, soon.
  void Defer(std::function<void()> callback) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    deferred_.push_back(std::move(callback));
  }
  void Log(std::string_view line) const {
    if (options_.log) options_.log(line);
  }

  const NcclDataPlaneOptions options_;
  const std::shared_ptr<NcclCommFactory> factory_;
  const std::shared_ptr<DeviceOps> device_;
  const int rank_;
  NcclThread* thread_ = nullptr;
  std::atomic<uint64_t> bytes_total_{0};

  absl::Mutex mu_;

 private:
  std::vector<std::shared_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> deferred_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kvtransfer::nccl

#endif  // TANDEM_KVTRANSFER_NCCL_NCCL_ENDPOINT_H_
