// A fixed-size pool of threads for data-parallel loops in the CPU forward
// pass (one pool per LlamaModel).
//
// Owns: num_threads - 1 worker threads, started in the constructor and
// joined in the destructor; the calling thread of ParallelFor is the
// remaining one, so a pool of 1 thread starts none and runs everything
// inline.
// Does not touch: what the loop body computes. Splitting work never changes
// numerics by itself: a body that computes each output element the same way
// whatever its range (as cpu_kernels.h's kernels do) gives the same bits
// for any thread count.
// Threads: ParallelFor may be called from any thread; concurrent calls are
// serialized (one loop runs at a time). The body must not call ParallelFor
// on the same pool (it would deadlock) and must not throw.
//
// Workers and the caller spin briefly (atomics) before sleeping on a
// condition variable, so back-to-back loops do not pay a wake-up each.
// Synchronization uses std::mutex / std::condition_variable rather than
// absl::Mutex so that ThreadSanitizer sees it (Debian's Abseil is not
// TSan-instrumented; see scripts/sanitize).
#ifndef TANDEM_ENGINE_MODEL_THREAD_POOL_H_
#define TANDEM_ENGINE_MODEL_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace tandem::model {

class ThreadPool {
 public:
  // Loop body: processes the indices [begin, end).
  using RangeFn = std::function<void(size_t begin, size_t end)>;

  // Starts num_threads - 1 workers. num_threads must be >= 1 (programmer
  // error otherwise: aborts); callers validate user input first.
  explicit ThreadPool(int32_t num_threads);
  // Wakes and joins every worker. No ParallelFor may be running.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int32_t num_threads() const { return num_threads_; }

  // Splits [0, n) into P = min(n, num_threads()) contiguous, non-empty
  // ranges, range i = [n*i/P, n*(i+1)/P), and calls fn once per range: range
  // 0 on the calling thread, range i on worker i. Returns when every range
  // is done (all of fn's writes are then visible to the caller). n == 0
  // calls nothing; P == 1 calls fn(0, n) inline without touching a worker.
  // Allocates nothing.
  void ParallelFor(size_t n, const RangeFn& fn);

 private:
  void WorkerLoop(size_t index);

  const int32_t num_threads_;
  std::vector<std::thread> workers_;  // const after construction

  std::mutex call_mu_;  // held for a whole ParallelFor: one loop at a time
  std::mutex mu_;
  std::condition_variable work_cv_;  // workers wait for a new generation
  std::condition_variable done_cv_;  // the caller waits for pending_ == 0
  // The current loop: bumped once per ParallelFor that uses workers, with
  // release order after fn_, n_, parts_ and pending_ are set, so a worker
  // that sees a new generation (acquire) sees that loop. Workers spin on it
  // for up to 50 us (kSpin) before sleeping on work_cv_ (under mu_), because
  // a forward pass runs dozens of short loops back to back and a futex
  // wake-up per loop costs about as much as a small loop itself.
  std::atomic<uint64_t> generation_{0};
  const RangeFn* fn_ = nullptr;  // written only between loops (call_mu_)
  size_t n_ = 0;
  size_t parts_ = 0;
  std::atomic<size_t> pending_{0};  // workers not yet done with this loop
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// Runs fn over [0, n) on `pool` when it is worth it, else fn(0, n) inline:
// splits only when pool is non-null with more than one thread and `work`
// (the loop's cost in the caller's unit, e.g. multiply-adds) is at least
// `min_work`. Small loops thus avoid the wake-up cost; a body that computes
// each element independently of its range gives the same bits either way.
void MaybeParallelFor(ThreadPool* pool, size_t n, size_t work, size_t min_work,
                      const ThreadPool::RangeFn& fn);

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_MODEL_THREAD_POOL_H_
