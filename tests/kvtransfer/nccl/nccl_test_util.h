// Host-memory stand-ins for the NCCL data path's seams, so the core runs
// end to end on the CPU:
// - HostStream: an in-order queue of operations, each of which may be
//   "not yet" (a receive whose bytes have not arrived); later ones wait,
//   as on a CUDA stream. Pumped on every enqueue and event query.
// - HostDeviceOps (DeviceOps): host buffers, HostStreams, events that
//   fire when every operation enqueued before them is done; counts live
//   buffers so a leak shows.
// - FakeNcclFactory / fake NcclComm: a 2-rank communicator connected
//   in-process (rank 0's sends are buffered messages that rank 1's
//   receives take in order, a size mismatch is an async error). Knobs: init
//   never completes, the link stalls (nothing moves, no error: a stopped
//   peer), a rank's communicator stays in progress after GroupEnd. Records
//   each rank's receive sizes in posting order, group sizes and aborts.
// - HostKv (kv::DeviceKvAccess): the shared HostDeviceKv (paged K/V pools
//   in host arrays, tests/engine/kv/host_device_kv.h) whose GatherRows /
//   ScatterRows are memcpy on a HostStream.
// Threads: all of it is thread-safe.
#ifndef TANDEM_TESTS_KVTRANSFER_NCCL_NCCL_TEST_UTIL_H_
#define TANDEM_TESTS_KVTRANSFER_NCCL_NCCL_TEST_UTIL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/kv/device_kv.h"
#include "kvtransfer/nccl/nccl_comm.h"
#include "tests/engine/kv/host_device_kv.h"

namespace tandem::kvtransfer::nccl::testing {

class HostStream {
 public:
  // Returns true when done; false: "not yet", run it again on the next pump.
  using Op = std::function<bool()>;
  void Enqueue(Op op);
  // Runs operations from the head while they complete.
  void Pump();
  // Operations enqueued so far / completed so far (in order).
  uint64_t enqueued();
  uint64_t completed();

 private:
  absl::Mutex mu_;
  std::deque<Op> ops_ ABSL_GUARDED_BY(mu_);
  uint64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
};

class HostDeviceOps final : public DeviceOps {
 public:
  absl::Status BindThread() override { return absl::OkStatus(); }
  absl::StatusOr<void*> CreateStream() override;
  void DestroyStream(void* stream) override;
  absl::StatusOr<void*> Allocate(uint64_t bytes, void* stream) override;
  void Free(void* buffer, void* stream) override;  // in stream order
  absl::StatusOr<void*> RecordEvent(void* stream) override;
  EventState QueryEvent(void* event, absl::Status* error) override;
  void DestroyEvent(void* event) override;
  absl::Status StreamWaitEvent(void* stream, void* event) override;

  int live_buffers() const { return live_buffers_.load(); }
  int live_streams() const { return live_streams_.load(); }

 private:
  std::atomic<int> live_buffers_{0};
  std::atomic<int> live_streams_{0};
};

// The state both ranks of one fake communicator share.
struct FakeLink {
  absl::Mutex mu;
  bool joined[2] ABSL_GUARDED_BY(mu) = {false, false};
  bool aborted[2] ABSL_GUARDED_BY(mu) = {false, false};
  // While set, a rank's communicator stays in progress after its next
  // GroupEnd (`held`) until it is cleared.
  bool hold_posting[2] ABSL_GUARDED_BY(mu) = {false, false};
  bool held[2] ABSL_GUARDED_BY(mu) = {false, false};
  std::deque<std::string> messages ABSL_GUARDED_BY(mu);  // rank 0 -> rank 1
  std::string error ABSL_GUARDED_BY(mu);                 // async error, if any
  std::vector<uint64_t> recv_sizes ABSL_GUARDED_BY(mu);  // rank 1, posting order
  std::vector<int> group_sizes[2] ABSL_GUARDED_BY(mu);
  int open_group[2] ABSL_GUARDED_BY(mu) = {-1, -1};  // ops in the open group
};

class FakeNcclFactory final : public NcclCommFactory {
 public:
  absl::StatusOr<std::string> GetUniqueId() override;
  absl::StatusOr<std::unique_ptr<NcclComm>> InitRank(const std::string& unique_id, int nranks,
                                                     int rank, absl::Time deadline) override;

  // New communicators stay kInProgress forever (a peer that never joins).
  void set_never_complete_init(bool value) { never_complete_init_ = value; }
  bool never_complete_init() const { return never_complete_init_.load(); }
  // Nothing moves on any link (sends and receives never complete).
  void set_stalled(bool value) { stalled_ = value; }
  bool stalled() const { return stalled_.load(); }

  int unique_ids_made() const { return unique_ids_made_.load(); }
  int aborts() const { return aborts_.load(); }
  void CountAbort() { ++aborts_; }
  // The link of `unique_id` (null before a rank joined).
  std::shared_ptr<FakeLink> link(const std::string& unique_id);
  // The links in the order they were made.
  std::vector<std::shared_ptr<FakeLink>> links();

 private:
  std::atomic<bool> never_complete_init_{false};
  std::atomic<bool> stalled_{false};
  std::atomic<int> unique_ids_made_{0};
  std::atomic<int> aborts_{0};
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<FakeLink>> links_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<FakeLink>> order_ ABSL_GUARDED_BY(mu_);
};

// The shared host KV (tests/engine/kv/host_device_kv.h) whose copies run
// in order on the HostStream they are given (at once for a null stream),
// like kernels on a CUDA stream.
class HostKv final : public kv::testing::HostDeviceKv {
 public:
  using HostDeviceKv::HostDeviceKv;

 protected:
  void Run(void* stream, std::function<void()> copy) override;
};

// Waits (up to `timeout`) for `done` to become true, checking every ms.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(20));

}  // namespace tandem::kvtransfer::nccl::testing

#endif  // TANDEM_TESTS_KVTRANSFER_NCCL_NCCL_TEST_UTIL_H_
