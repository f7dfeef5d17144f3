// WorkQueue (router/openai/work_queue.h): tasks run on the fixed threads,
// first in first out, concurrently up to the thread count; Stop runs what
// was queued and refuses the rest.
#include "router/openai/work_queue.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tandem::router::openai {
namespace {

TEST(WorkQueueTest, OneThreadRunsTasksInOrderOffTheCallersThread) {
  WorkQueue q(1);
  absl::Mutex mu;
  std::vector<int> order;
  std::set<std::thread::id> threads;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(q.Post([&, i] {
      absl::MutexLock lock(&mu);
      order.push_back(i);
      threads.insert(std::this_thread::get_id());
    }));
  }
  q.Stop();  // runs what was queued
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

TEST(WorkQueueTest, TasksRunConcurrentlyUpToTheThreadCount) {
  WorkQueue q(2);
  absl::Notification release;
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(q.Post([&] {
      const int now = running.fetch_add(1) + 1;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      release.WaitForNotificationWithTimeout(absl::Seconds(10));
      running.fetch_sub(1);
    }));
  }
  // Two run at once, the third waits for a free thread.
  for (int i = 0; i < 1000 && most.load() < 2; ++i) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(most.load(), 2);
  release.Notify();
  q.Stop();
  EXPECT_EQ(running.load(), 0);
}

TEST(WorkQueueTest, PostAfterStopIsRefusedAndStopIsIdempotent) {
  WorkQueue q(2);
  q.Stop();
  bool ran = false;
  EXPECT_FALSE(q.Post([&] { ran = true; }));
  q.Stop();
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace tandem::router::openai
