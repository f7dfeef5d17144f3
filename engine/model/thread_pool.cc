#include "engine/model/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace tandem::model {
namespace {

// Chunk `part` of `parts` over [0, n): [n*part/parts, n*(part+1)/parts).
// n * parts cannot overflow for any n a forward pass produces (parts <=
// 0xFFFF).
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
    workers_.emplace_back([this] { WorkerLoop(); });
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
  if (n == 0) return;
  if (num_threads_ == 1 || n == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  // At most 0xFFFF: the count has 16 bits of claim_.
  const size_t chunks =
      std::min({n, kChunksPerThread * static_cast<size_t>(num_threads_), size_t{0xFFFF}});
  fn_ = &fn;
  n_ = n;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t generation = ++generation_;
  claim_.store(static_cast<uint64_t>(generation) << 32 | static_cast<uint64_t>(chunks) << 16,
               std::memory_order_release);
  // Spinning workers see the new generation; sleeping ones are woken. The
  // empty critical section orders this against a worker that checked the
  // generation under mu_ and is about to wait.
  { std::lock_guard<std::mutex> lock(mu_); }
  work_cv_.notify_all();
  RunChunks(generation);
  auto all_done = [&] { return done_.load(std::memory_order_acquire) == chunks; };
  if (!SpinUntil(all_done)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, all_done);
  }
}

void ThreadPool::RunChunks(uint32_t generation) {
  for (;;) {
    uint64_t claim = claim_.load(std::memory_order_acquire);
    size_t c, chunks;
    do {
      c = claim & 0xFFFF;
      chunks = (claim >> 16) & 0xFFFF;
      if (static_cast<uint32_t>(claim >> 32) != generation || c >= chunks) return;
    } while (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel,
                                           std::memory_order_acquire));
    // Chunk c of loop `generation` is ours: that loop cannot end before it
    // is done, so fn_ and n_ are still the ones its caller set.
    (*fn_)(RangeBegin(n_, c, chunks), RangeBegin(n_, c + 1, chunks));
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
      { std::lock_guard<std::mutex> lock(mu_); }
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::WorkerLoop() {
  uint32_t seen = 0;
  auto generation = [this] {
    return static_cast<uint32_t>(claim_.load(std::memory_order_acquire) >> 32);
  };
  for (;;) {
    auto new_loop = [&] { return generation() != seen; };
    if (!SpinUntil(new_loop)) {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || new_loop(); });
      if (stop_) return;
    }
    seen = generation();
    RunChunks(seen);
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
