#include "engine/model/thread_pool.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace tandem::model {
namespace {

// Range `part` of `parts` over [0, n): [n*part/parts, n*(part+1)/parts).
// n * parts cannot overflow for any n a forward pass produces (parts <= 256).
size_t RangeBegin(size_t n, size_t part, size_t parts) { return n * part / parts; }

}  // namespace

ThreadPool::ThreadPool(int32_t num_threads) : num_threads_(num_threads) {
  if (num_threads < 1) {
    std::fprintf(stderr, "ThreadPool: num_threads %d < 1\n", num_threads);
    std::abort();
  }
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int32_t i = 1; i < num_threads; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(static_cast<size_t>(i)); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::ParallelFor(size_t n, const RangeFn& fn) {
  const size_t parts = std::min(n, static_cast<size_t>(num_threads_));
  if (parts == 0) return;
  if (parts == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    parts_ = parts;
    pending_ = parts - 1;
    ++generation_;
  }
  // Only workers 1..parts-1 have a range; waking the others too keeps the
  // protocol simple (they see no range for them and sleep again).
  work_cv_.notify_all();
  fn(0, RangeBegin(n, 1, parts));
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(size_t index) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    // A worker may sleep through generations in which it had no range (no
    // loop completes without every worker that has one), so the current
    // loop is always the one to look at.
    seen = generation_;
    if (index >= parts_) continue;
    const RangeFn& fn = *fn_;
    const size_t begin = RangeBegin(n_, index, parts_);
    const size_t end = RangeBegin(n_, index + 1, parts_);
    lock.unlock();
    fn(begin, end);
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void MaybeParallelFor(ThreadPool* pool, size_t n, size_t work, size_t min_work,
                      const ThreadPool::RangeFn& fn) {
  if (pool == nullptr || pool->num_threads() == 1 || work < min_work) {
    if (n > 0) fn(0, n);
    return;
  }
  pool->ParallelFor(n, fn);
}

}  // namespace tandem::model
