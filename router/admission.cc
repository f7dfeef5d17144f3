#include "router/admission.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::router {
namespace {

// The Admission whose RunStarts is on this thread's stack, and the starts
// that Release() deferred meanwhile (run by that outer RunStarts).
thread_local const Admission* tls_starting = nullptr;
thread_local std::deque<Admission::StartFn>* tls_deferred = nullptr;

int64_t WaitedMs(absl::Time since, absl::Time now) {
  return absl::ToInt64Milliseconds(now - since);
}

}  // namespace

absl::Status Admission::ValidateOptions(const Options& options) {
  if (options.max_inflight < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("router.max_inflight must be >= 1, got ", options.max_inflight));
  }
  if (options.max_queued < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("router.max_queued must be >= 0, got ", options.max_queued));
  }
  return absl::OkStatus();
}

Admission::Admission(const Options& options, Observer observer)
    : options_(options), observer_(std::move(observer)) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) {
    std::fprintf(stderr, "Admission: %s\n", std::string(s.message()).c_str());
    std::abort();
  }
  timer_ = std::thread([this] { TimerLoop(); });
}

Admission::~Admission() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  timer_cv_.SignalAll();
  timer_.join();
}

Admission::Ticket Admission::Submit(absl::Time deadline, StartFn start, DropFn drop) {
  Ticket ticket;
  {
    absl::MutexLock lock(&mu_);
    ticket.id = next_id_++;
    if (running_ < options_.max_inflight && queue_.empty()) {
      ++running_;
      NotifyWaitedLocked(absl::ZeroDuration());
      NotifyCountsLocked();
    } else if (static_cast<int64_t>(queue_.size()) < options_.max_queued) {
      ticket.queued = true;
      const bool earliest = deadlines_.empty() || deadline < deadlines_.begin()->first;
      queue_.emplace(ticket.id, Waiter{deadline, absl::Now(), std::move(start), std::move(drop)});
      deadlines_.emplace(deadline, ticket.id);
      if (earliest) timer_cv_.Signal();
      NotifyCountsLocked();
      return ticket;
    } else {
      ticket.status = absl::ResourceExhaustedError(
          absl::StrCat("router at capacity: ", running_, " running, ", queue_.size(),
                       " queued (router.max_inflight, router.max_queued)"));
      ticket.retry_after_ms = RetryAfterLocked(absl::Now());
      return ticket;
    }
  }
  RunStarts(std::move(start));
  return ticket;
}

void Admission::Cancel(uint64_t id) {
  DropFn drop;
  absl::Time enqueued;
  {
    absl::MutexLock lock(&mu_);
    auto it = queue_.find(id);
    if (it == queue_.end()) return;
    drop = std::move(it->second.drop);
    enqueued = it->second.enqueued;
    deadlines_.erase({it->second.deadline, id});
    queue_.erase(it);
    NotifyWaitedLocked(absl::Now() - enqueued);
    NotifyCountsLocked();
  }
  drop(absl::CancelledError(absl::StrCat("cancelled by the client after ",
                                         WaitedMs(enqueued, absl::Now()),
                                         " ms in the router's queue")));
}

void Admission::Release() {
  StartFn next;
  {
    absl::MutexLock lock(&mu_);
    --running_;
    const absl::Time now = absl::Now();
    completions_.push_back(now);
    if (completions_.size() > kRateWindow) completions_.pop_front();
    next = TakeNextLocked();
    NotifyCountsLocked();
  }
  if (next) RunStarts(std::move(next));
}

int Admission::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

int Admission::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

int64_t Admission::RetryAfterMs(int queued, int completions, absl::Duration span) {
  if (completions <= 0) return kMaxRetryAfterMs;
  const double ms = absl::ToDoubleMilliseconds(span) * (queued + 1.0) / completions;
  if (!(ms >= kMinRetryAfterMs)) return kMinRetryAfterMs;  // also NaN
  if (ms >= kMaxRetryAfterMs) return kMaxRetryAfterMs;
  return static_cast<int64_t>(std::ceil(ms));
}

Admission::StartFn Admission::TakeNextLocked() {
  if (queue_.empty() || running_ >= options_.max_inflight) return nullptr;
  auto it = queue_.begin();
  StartFn start = std::move(it->second.start);
  NotifyWaitedLocked(absl::Now() - it->second.enqueued);
  deadlines_.erase({it->second.deadline, it->first});
  queue_.erase(it);
  ++running_;
  return start;
}

void Admission::RunStarts(StartFn start) {
  if (tls_starting == this) {
    tls_deferred->push_back(std::move(start));
    return;
  }
  std::deque<StartFn> deferred;
  const Admission* outer = tls_starting;
  std::deque<StartFn>* outer_deferred = tls_deferred;
  tls_starting = this;
  tls_deferred = &deferred;
  start();
  while (!deferred.empty()) {
    StartFn next = std::move(deferred.front());
    deferred.pop_front();
    next();
  }
  tls_starting = outer;
  tls_deferred = outer_deferred;
}

void Admission::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    std::vector<std::pair<DropFn, absl::Status>> expired;
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const uint64_t id = deadlines_.begin()->second;
      deadlines_.erase(deadlines_.begin());
      auto it = queue_.find(id);
      expired.emplace_back(std::move(it->second.drop),
                           absl::DeadlineExceededError(absl::StrCat(
                               "deadline passed after ", WaitedMs(it->second.enqueued, now),
                               " ms in the router's queue: all router.max_inflight = ",
                               options_.max_inflight, " slots stayed busy")));
      NotifyWaitedLocked(now - it->second.enqueued);
      queue_.erase(it);
    }
    if (!expired.empty()) NotifyCountsLocked();
    if (!expired.empty()) {
      mu_.Unlock();
      for (auto& [drop, status] : expired) drop(std::move(status));
      mu_.Lock();
      continue;
    }
    if (deadlines_.empty()) {
      timer_cv_.Wait(&mu_);
    } else {
      timer_cv_.WaitWithDeadline(&mu_, deadlines_.begin()->first);
    }
  }
}

void Admission::NotifyCountsLocked() {
  if (observer_.on_counts) observer_.on_counts(running_, static_cast<int>(queue_.size()));
}

void Admission::NotifyWaitedLocked(absl::Duration waited) {
  if (observer_.on_waited) observer_.on_waited(waited);
}

int64_t Admission::RetryAfterLocked(absl::Time now) {
  while (!completions_.empty() && completions_.front() < now - kRateHorizon) {
    completions_.pop_front();
  }
  const absl::Duration span =
      completions_.empty() ? absl::ZeroDuration() : now - completions_.front();
  return RetryAfterMs(static_cast<int>(queue_.size()), static_cast<int>(completions_.size()), span);
}

}  // namespace tandem::router
