// ThreadPool: ParallelFor's documented chunks ([n*i/C, n*(i+1)/C), C =
// min(n, 4 * threads)), claimed by whichever thread is free (a blocked
// worker's share goes to the caller), inline runs, back-to-back and
// concurrent loops, shutdown; MaybeParallelFor's size threshold.
#include "engine/model/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::model {
namespace {

struct Call {
  size_t begin;
  size_t end;
  std::thread::id thread;
  bool operator<(const Call& o) const { return begin < o.begin; }
};

// Every fn call of one ParallelFor, sorted by begin.
std::vector<Call> Record(ThreadPool& pool, size_t n) {
  std::mutex mu;
  std::vector<Call> calls;
  pool.ParallelFor(n, [&](size_t begin, size_t end) {
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back({begin, end, std::this_thread::get_id()});
  });
  std::sort(calls.begin(), calls.end());
  return calls;
}

TEST(ThreadPoolTest, SplitsIntoTheDocumentedContiguousChunks) {
  for (int32_t threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{64},
                     size_t{1001}}) {
      SCOPED_TRACE(::testing::Message() << threads << " threads, n " << n);
      const std::vector<Call> calls = Record(pool, n);
      const size_t chunks =
          threads == 1 ? std::min<size_t>(n, 1) : std::min<size_t>(n, 4 * threads);
      ASSERT_EQ(calls.size(), chunks);
      for (size_t i = 0; i < chunks; ++i) {
        EXPECT_EQ(calls[i].begin, n * i / chunks);
        EXPECT_EQ(calls[i].end, n * (i + 1) / chunks);
        EXPECT_LT(calls[i].begin, calls[i].end);
      }
      // A loop of one chunk runs inline on the caller.
      if (chunks == 1) {
        EXPECT_EQ(calls[0].thread, std::this_thread::get_id());
      }
    }
  }
}

// A worker that stops inside its first chunk (as a descheduled vCPU would)
// does not hold up the others: the caller claims every other chunk. The
// worker's chunk waits until the caller has run them all (or 60 s, which
// fails the test), so a pool that split the loop into fixed per-thread
// shares would fail here, not hang.
TEST(ThreadPoolTest, AStalledWorkersShareGoesToTheCaller) {
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  constexpr size_t kN = 8;  // 8 chunks of 1 on 2 threads
  std::mutex mu;
  std::condition_variable cv;
  size_t caller_chunks = 0;
  bool worker_stalled_until_caller_done = true;
  for (int loop = 0; loop < 50; ++loop) {
    caller_chunks = 0;
    size_t worker_chunks = 0;
    pool.ParallelFor(kN, [&](size_t begin, size_t end) {
      ASSERT_EQ(end, begin + 1);
      std::unique_lock<std::mutex> lock(mu);
      if (std::this_thread::get_id() == caller) {
        ++caller_chunks;
        cv.notify_all();
        return;
      }
      ++worker_chunks;
      if (worker_chunks == 1) {
        // The caller has every chunk but this one to run.
        worker_stalled_until_caller_done &= cv.wait_for(
            lock, std::chrono::seconds(60), [&] { return caller_chunks == kN - 1; });
      }
    });
    EXPECT_EQ(caller_chunks + worker_chunks, kN);
    EXPECT_LE(worker_chunks, 1u) << "loop " << loop;
  }
  EXPECT_TRUE(worker_stalled_until_caller_done);
}

TEST(ThreadPoolTest, OneThreadRunsTheWholeRangeInline) {
  ThreadPool pool(1);
  const std::vector<Call> calls = Record(pool, 100);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].begin, 0u);
  EXPECT_EQ(calls[0].end, 100u);
  EXPECT_EQ(calls[0].thread, std::this_thread::get_id());
}

// Many short loops back to back: a lost wake-up or a stale range would hang
// or miscount here.
TEST(ThreadPoolTest, ManyLoopsInARowEachCoverEveryIndexOnce) {
  ThreadPool pool(3);
  std::vector<int> hits(37);
  for (int iter = 0; iter < 5000; ++iter) {
    const size_t n = static_cast<size_t>(iter % 37) + 1;
    pool.ParallelFor(n, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) ++hits[i];
    });
  }
  for (size_t i = 0; i < hits.size(); ++i) {
    // Index i is covered by every loop with n > i: n = iter % 37 + 1.
    int expected = 0;
    for (int iter = 0; iter < 5000; ++iter) expected += (iter % 37) + 1 > static_cast<int>(i);
    EXPECT_EQ(hits[i], expected) << "index " << i;
  }
}

TEST(ThreadPoolTest, ConcurrentCallersEachGetTheirWholeLoop) {
  ThreadPool pool(2);
  constexpr int kLoops = 500;
  constexpr size_t kN = 100;
  std::vector<std::atomic<int>> hits_a(kN), hits_b(kN);
  auto run = [&](std::vector<std::atomic<int>>& hits) {
    for (int i = 0; i < kLoops; ++i) {
      pool.ParallelFor(kN, [&](size_t begin, size_t end) {
        for (size_t j = begin; j < end; ++j) hits[j].fetch_add(1, std::memory_order_relaxed);
      });
    }
  };
  std::thread a([&] { run(hits_a); });
  std::thread b([&] { run(hits_b); });
  a.join();
  b.join();
  for (size_t j = 0; j < kN; ++j) {
    EXPECT_EQ(hits_a[j].load(), kLoops);
    EXPECT_EQ(hits_b[j].load(), kLoops);
  }
}

TEST(ThreadPoolTest, ShutsDownCleanlyIdleOrAfterWork) {
  for (int i = 0; i < 20; ++i) {
    auto idle = std::make_unique<ThreadPool>(4);
    idle.reset();
    auto used = std::make_unique<ThreadPool>(4);
    std::atomic<size_t> sum{0};
    used->ParallelFor(10, [&](size_t begin, size_t end) { sum += end - begin; });
    EXPECT_EQ(sum.load(), 10u);
    used.reset();
  }
}

TEST(MaybeParallelForTest, SplitsOnlyFromMinWorkUp) {
  ThreadPool pool(2);
  std::vector<std::pair<size_t, size_t>> calls;
  std::mutex mu;
  auto fn = [&](size_t begin, size_t end) {
    std::lock_guard<std::mutex> lock(mu);
    calls.emplace_back(begin, end);
  };
  MaybeParallelFor(&pool, 10, 99, 100, fn);  // below min_work: inline
  EXPECT_EQ(calls, (std::vector<std::pair<size_t, size_t>>{{0, 10}}));
  calls.clear();
  MaybeParallelFor(&pool, 10, 100, 100, fn);  // at min_work: split in 8 chunks
  std::sort(calls.begin(), calls.end());
  EXPECT_EQ(calls, (std::vector<std::pair<size_t, size_t>>{
                       {0, 1}, {1, 2}, {2, 3}, {3, 5}, {5, 6}, {6, 7}, {7, 8}, {8, 10}}));
  calls.clear();
  MaybeParallelFor(nullptr, 10, 1000, 0, fn);  // no pool: inline
  EXPECT_EQ(calls, (std::vector<std::pair<size_t, size_t>>{{0, 10}}));
  calls.clear();
  MaybeParallelFor(&pool, 0, 1000, 0, fn);  // empty: nothing
  EXPECT_TRUE(calls.empty());
}

}  // namespace
}  // namespace tandem::model
