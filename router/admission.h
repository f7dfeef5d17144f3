// Admission control of the router's Generate streams (router.max_inflight,
// router.max_queued): at most max_inflight requests run at once; up to
// max_queued more wait in a FIFO until a slot frees, their deadline passes
// (DEADLINE_EXCEEDED) or the client cancels (CANCELLED, removed at once);
// beyond that a request is refused at once with RESOURCE_EXHAUSTED and a
// retry-after estimate (RetryAfterMs).
//
// Owns: the running count, the wait queue and the recent completion times.
// Does not touch: the requests themselves (it calls the callbacks it was
// given) or gRPC (statuses are absl::Status; the router converts them).
// Threads: every method is thread-safe. Callbacks run without the lock held,
// on the caller's thread (Submit, Release, Cancel) or, for a deadline, on
// the one timer thread that Admission owns (no thread per waiting request,
// no polling: it sleeps until the earliest queued deadline).
#ifndef TANDEM_ROUTER_ADMISSION_H_
#define TANDEM_ROUTER_ADMISSION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::router {

class Admission {
 public:
  struct Options {
    int32_t max_inflight = 512;  // >= 1: requests running at once
    int32_t max_queued = 512;    // >= 0: requests waiting for a slot
  };
  // Runs once when the request got a slot; the owner must call Release()
  // exactly once when the request has ended.
  using StartFn = std::function<void()>;
  // Runs once when a queued request leaves the queue without a slot:
  // DEADLINE_EXCEEDED (its deadline passed) or CANCELLED (Cancel()). The
  // status' message says how long it waited and why.
  using DropFn = std::function<void(absl::Status)>;

  // What an owner may watch (router/router_metrics.h: the router's
  // gauges and its queue-time histogram). Both callbacks run under
  // Admission's lock, so they see every change in order; they must be
  // cheap and must not call back into this Admission. Either may be empty.
  struct Observer {
    // After every change of the counts: running() and queued() now.
    std::function<void(int running, int queued)> on_counts;
    // A request left the wait stage: `waited` is zero for one started at
    // once, else its time in the queue, whether it then got a slot or was
    // dropped (deadline, cancel). Not called for a refused request (it
    // never waited) nor for one still queued when Admission is destroyed.
    std::function<void(absl::Duration waited)> on_waited;
  };

  // What Submit did with a request.
  struct Ticket {
    // OK: started (`start` already ran) or queued. RESOURCE_EXHAUSTED:
    // refused, neither callback will run; the message is "router at
    // capacity: N running, M queued (router.max_inflight,
    // router.max_queued)".
    absl::Status status;
    bool queued = false;         // with OK: waiting in the queue
    uint64_t id = 0;             // with OK: the request's id, for Cancel()
    int64_t retry_after_ms = 0;  // with RESOURCE_EXHAUSTED: RetryAfterMs(...)
  };

  // Completions remembered for the rate estimate (the newest ones).
  static constexpr int kRateWindow = 32;
  // Completions older than this are forgotten (an idle router does not
  // estimate from an hour-old burst).
  static constexpr absl::Duration kRateHorizon = absl::Seconds(60);
  static constexpr int64_t kMinRetryAfterMs = 100;
  static constexpr int64_t kMaxRetryAfterMs = 10000;

  // INVALID_ARGUMENT naming the key (router.max_inflight < 1,
  // router.max_queued < 0); the config loader refuses both first.
  [[nodiscard]] static absl::Status ValidateOptions(const Options& options);

  // Starts the timer thread. `options` must pass ValidateOptions (a bad
  // value aborts with its message).
  explicit Admission(const Options& options, Observer observer = {});
  // Stops the timer thread. Requests still queued get neither callback.
  ~Admission();
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Admits a request: with a free slot (and nobody queued) runs `start`
  // before returning; else queues it (FIFO) until Release() hands it a
  // slot, `deadline` passes or Cancel(id); else refuses it. `start` and
  // `drop` must not call back into this Admission synchronously except
  // Release() (which is safe from `start`: the next start is deferred to
  // the outer call, so a chain of instant failures does not recurse).
  Ticket Submit(absl::Time deadline, StartFn start, DropFn drop);

  // A request with the id `id` left (its client cancelled): if it is
  // queued, it is removed and its `drop` runs with CANCELLED before this
  // returns; if it is running or unknown, nothing happens.
  void Cancel(uint64_t id);

  // A running request ended: frees its slot and starts the oldest queued
  // request, if any, on this thread. Records the completion time for the
  // retry-after estimate.
  void Release();

  int running() const;
  int queued() const;

  // The retry-after hint for a refused request, in ms:
  //   `completions` requests finished in the last `span` (the newest
  //   kRateWindow within kRateHorizon, span = now - the oldest of them),
  //   so one slot frees every span / completions on average; a new request
  //   would wait behind `queued` others: (queued + 1) * span / completions.
  //   No completion recorded: kMaxRetryAfterMs. Clamped to
  //   [kMinRetryAfterMs, kMaxRetryAfterMs].
  static int64_t RetryAfterMs(int queued, int completions, absl::Duration span);

 private:
  struct Waiter {
    absl::Time deadline;
    absl::Time enqueued;
    StartFn start;
    DropFn drop;
  };

  // Moves the queue head into a running slot when one is free; returns its
  // start callback (empty when none).
  StartFn TakeNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `start` and, on this thread, the starts that Release() deferred
  // while it ran.
  void RunStarts(StartFn start);
  // The timer thread: drops queued requests whose deadline passed.
  void TimerLoop();
  int64_t RetryAfterLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // observer_.on_counts with the counts now (after each change).
  void NotifyCountsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // observer_.on_waited(waited).
  void NotifyWaitedLocked(absl::Duration waited) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const Observer observer_;
  mutable absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Keyed by id: ids increase, so begin() is the oldest (FIFO).
  std::map<uint64_t, Waiter> queue_ ABSL_GUARDED_BY(mu_);
  // (deadline, id) of every queued request: begin() is the next to expire.
  std::set<std::pair<absl::Time, uint64_t>> deadlines_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Time> completions_ ABSL_GUARDED_BY(mu_);  // oldest first
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar timer_cv_;  // the earliest deadline changed, or stopping
  std::thread timer_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ADMISSION_H_
