// The process's one NCCL thread (NCCL is not thread-safe across
// communicators of one device): every NcclComm / NcclCommFactory call of
// the data plane runs here. It runs posted tasks in order, then the
// registered ticks (the sender's and the receiver's watchdog turn); while a
// tick reports pending work it turns again every `poll_interval`,
// otherwise it sleeps until Post or Wake.
//
// Threads: Post, Wake and RunSync from any thread; ticks and tasks on the
// NCCL thread. The destructor stops and joins (pending tasks are dropped).
#ifndef TANDEM_KVTRANSFER_NCCL_NCCL_THREAD_H_
#define TANDEM_KVTRANSFER_NCCL_NCCL_THREAD_H_

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer::nccl {

class NcclThread {
 public:
  // Returns true while it has work to poll.
  using Tick = std::function<bool()>;

  // `start` runs first on the thread (e.g. DeviceOps::BindThread); its
  // error is logged through `log` (may be empty) and the thread runs on.
  NcclThread(std::function<absl::Status()> start, std::vector<Tick> ticks,
             std::function<void(std::string_view)> log,
             absl::Duration poll_interval = absl::Milliseconds(1));
  ~NcclThread();
  NcclThread(const NcclThread&) = delete;
  NcclThread& operator=(const NcclThread&) = delete;

  // Queues `task` for the thread.
  void Post(std::function<void()> task);
  // Makes the thread run its ticks soon.
  void Wake();
  // Runs `task` on the thread and waits for it, at most `timeout`
  // (DEADLINE_EXCEEDED naming `what` then; the task still runs later).
  // Runs inline when called on the thread itself.
  [[nodiscard]] absl::Status RunSync(std::string_view what, std::function<absl::Status()> task,
                                     absl::Duration timeout);
  bool OnThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void Loop(std::function<absl::Status()> start);

  const std::vector<Tick> ticks_;
  const std::function<void(std::string_view)> log_;
  const absl::Duration poll_interval_;

  absl::Mutex mu_;
  std::vector<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace tandem::kvtransfer::nccl

#endif  // TANDEM_KVTRANSFER_NCCL_NCCL_THREAD_H_
