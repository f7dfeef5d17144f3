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
// Scheduling is dynamic: a loop is cut into a few chunks per thread, and the
// caller and the workers claim chunks until none is left, so a thread that
// is slow (a busy core, a descheduled vCPU, a sleeping worker not yet
// awake) leaves its share to the others instead of holding up the loop.
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

  // Splits [0, n) into C = min(n, kChunksPerThread * num_threads(), 65535)
  // contiguous, non-empty chunks, chunk i = [n*i/C, n*(i+1)/C), and calls
  // fn once per chunk, on whichever thread claims it first (the caller
  // claims too; chunks are claimed in ascending order, the order of the
  // calls across threads is not fixed). Returns when every chunk is done
  // (all of fn's writes are then visible to the caller). n == 0 calls
  // nothing; with one thread, or n == 1, fn(0, n) runs inline without
  // touching a worker. Allocates nothing.
  void ParallelFor(size_t n, const RangeFn& fn);

  // Chunks per thread of a loop (see ParallelFor): enough for a fast thread
  // to take over a slow one's work, few enough that each call still covers
  // a large range.
  static constexpr size_t kChunksPerThread = 4;

 private:
  void WorkerLoop();

  const int32_t num_threads_;
  std::vector<std::thread> workers_;  // const after construction

  // Claims chunks of loop `generation` until none is left (or a newer loop
  // has started); each finished chunk counts in done_.
  void RunChunks(uint32_t generation);

  std::mutex call_mu_;  // held for a whole ParallelFor: one loop at a time
  std::mutex mu_;
  std::condition_variable work_cv_;  // workers wait for a new generation
  std::condition_variable done_cv_;  // the caller waits for every chunk done
  // The current loop, its chunk count and its next unclaimed chunk, in one
  // word: generation << 32 | chunks << 16 | next (chunks <= 0xFFFF).
  // ParallelFor stores (its generation, chunks, 0) with release order after
  // fn_, n_ and done_ are set; a thread claims chunk c by a CAS from
  // (g, C, c) to (g, C, c + 1) (acquire), so a claim of loop g sees loop
  // g's fn_ and n_, which stay put until that chunk is done. A worker that
  // wakes late, after its loop ended, finds another generation or no chunk
  // left and claims nothing. Workers spin on the generation for up to 50 us
  // (kSpin) before sleeping on work_cv_ (under mu_), because a forward pass
  // runs dozens of short loops back to back and a futex wake-up per loop
  // costs about as much as a small loop itself.
  std::atomic<uint64_t> claim_{0};
  uint32_t generation_ = 0;  // the caller's count of loops (call_mu_)
  // The current loop's body and size: written by the caller between loops
  // only, read by a thread only after it claimed a chunk of that loop.
  const RangeFn* fn_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> done_{0};  // chunks of the current loop finished
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
