#include "engine/model/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace tandem::model {
namespace {

// Range `part` of `parts` over [0, n): [n*part/parts, n*(part+1)/parts).
// n * parts cannot overflow for any n a forward pass produces (parts <= 256).
size_t RangeBegin(size_t n, size_t part, size_t parts) { return n * part / parts; }

// How long a worker (or the caller) spins on an atomic before sleeping.
constexpr auto kSpin = std::chrono::microseconds(50);

// Polls `done` for up to kSpin; true once it holds.
template <typename Done>
bool SpinUntil(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= deadline) return false;
  }
}

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
  fn_ = &fn;
  n_ = n;
  parts_ = parts;
  // Every worker reports, even one without a range, so none is still
  // reading fn_, n_ or parts_ when the next loop writes them.
  pending_.store(workers_.size(), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  // Spinning workers see the new generation; sleeping ones are woken. The
  // empty critical section orders this against a worker that checked the
  // generation under mu_ and is about to wait.
  { std::lock_guard<std::mutex> lock(mu_); }
  work_cv_.notify_all();
  fn(0, RangeBegin(n, 1, parts));
  if (!SpinUntil([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(size_t index) {
  uint64_t seen = 0;
  for (;;) {
    auto new_loop = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!SpinUntil(new_loop)) {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || new_loop(); });
      if (stop_) return;
    }
    // Every loop waits for every worker, so a new generation is exactly
    // one loop on.
    seen = generation_.load(std::memory_order_acquire);
    if (index < parts_) {
      (*fn_)(RangeBegin(n_, index, parts_), RangeBegin(n_, index + 1, parts_));
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      { std::lock_guard<std::mutex> lock(mu_); }
      done_cv_.notify_one();
    }
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
