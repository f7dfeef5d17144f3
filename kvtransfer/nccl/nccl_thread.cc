#include "kvtransfer/nccl/nccl_thread.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace tandem::kvtransfer::nccl {

NcclThread::NcclThread(std::function<absl::Status()> start, std::vector<Tick> ticks,
                       std::function<void(std::string_view)> log, absl::Duration poll_interval)
    : ticks_(std::move(ticks)),
      log_(std::move(log)),
      poll_interval_(poll_interval),
      thread_([this, start = std::move(start)]() mutable { Loop(std::move(start)); }) {}

NcclThread::~NcclThread() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void NcclThread::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void NcclThread::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

absl::Status NcclThread::RunSync(std::string_view what, std::function<absl::Status()> task,
                                 absl::Duration timeout) {
  if (OnThread()) return task();
  struct Shared {
    absl::Notification done;
    absl::Status status;
  };
  auto shared = std::make_shared<Shared>();
  Post([shared, task = std::move(task)] {
    shared->status = task();
    shared->done.Notify();
  });
  if (!shared->done.WaitForNotificationWithTimeout(timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(std::string(what),
                                                    ": the NCCL thread did not answer within ",
                                                    absl::ToInt64Milliseconds(timeout), " ms"));
  }
  return shared->status;
}

void NcclThread::Loop(std::function<absl::Status()> start) {
  if (start) {
    absl::Status status = start();
    if (!status.ok() && log_) log_(absl::StrCat("NCCL thread: ", status.ToString()));
  }
  bool busy = false;
  while (true) {
    std::vector<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || woken_ || !tasks_.empty();
      };
      if (busy) {
        mu_.AwaitWithTimeout(absl::Condition(&ready), poll_interval_);
      } else {
        mu_.Await(absl::Condition(&ready));
      }
      if (stop_) return;
      woken_ = false;
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) task();
    busy = false;
    for (const Tick& tick : ticks_) busy = tick() || busy;
  }
}

}  // namespace tandem::kvtransfer::nccl
