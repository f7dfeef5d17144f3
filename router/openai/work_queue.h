// A fixed set of threads running queued tasks, first in first out: where
// the HTTP front door parses, renders and tokenizes request bodies, off
// the HTTP loop thread (a 7 MB chat body takes seconds to tokenize; the
// loop must keep answering /health and writing every stream meanwhile).
//
// Owns: its threads and the queue. Does not touch: what the tasks do.
// Threads: `threads` workers; Post and Stop from any thread (the queue
// under mu_).
#ifndef TANDEM_ROUTER_OPENAI_WORK_QUEUE_H_
#define TANDEM_ROUTER_OPENAI_WORK_QUEUE_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::router::openai {

class WorkQueue {
 public:
  // Starts `threads` (>= 1) worker threads.
  explicit WorkQueue(int threads);
  ~WorkQueue();  // Stop()
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `task` for the next free worker. False, and `task` dropped,
  // once Stop has begun.
  bool Post(std::function<void()> task);

  // Refuses new tasks, lets the workers finish every task already queued,
  // joins them. Idempotent; not from a task.
  void Stop();

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // fixed by the constructor; joined by Stop
};

}  // namespace tandem::router::openai

#endif  // TANDEM_ROUTER_OPENAI_WORK_QUEUE_H_
