#include "tools/bench/runner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "tools/bench/clock.h"

namespace tandem::bench {
namespace {

constexpr int kBarCells = 30;

[[nodiscard]] absl::Status CheckOptions(const std::vector<BenchRequest>& requests,
                                        const RunOptions& o) {
  if (!o.send_times_s.empty()) {
    if (o.send_times_s.size() != requests.size()) {
      return absl::InvalidArgumentError(absl::StrCat("send_times_s: ", o.send_times_s.size(),
                                                     " times for ", requests.size(), " requests"));
    }
    for (size_t i = 0; i < o.send_times_s.size(); ++i) {
      if (!std::isfinite(o.send_times_s[i]) || o.send_times_s[i] < 0 ||
          o.send_times_s[i] > kMaxSendTimeS) {
        return absl::InvalidArgumentError(absl::StrCat("send_times_s[", i, "]: must be in [0, ",
                                                       kMaxSendTimeS, "] s, got ",
                                                       o.send_times_s[i]));
      }
    }
  }
  for (size_t i = 0; o.send_times_s.empty() && i < requests.size(); ++i) {
    const std::optional<double>& t = requests[i].timestamp_s;
    if (t.has_value() && (!std::isfinite(*t) || *t < 0 || *t > kMaxSendTimeS)) {
      return absl::InvalidArgumentError(absl::StrCat("request ", i, " timestamp_s: must be in [0, ",
                                                     kMaxSendTimeS, "] s, got ", *t));
    }
  }
  if (o.max_concurrency < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-concurrency: must be >= 0, got ", o.max_concurrency));
  }
  if (o.num_warmups < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num-warmups: must be >= 0, got ", o.num_warmups));
  }
  return absl::OkStatus();
}

// The run's shared state: what the `done` callbacks write.
class RunState {
 public:
  RunState(size_t n, bool progress, Clock::time_point t0)
      : t0_(t0), outputs_(n), progress_(progress), tty_(progress && isatty(STDERR_FILENO) == 1) {}

  // Blocks until fewer than `limit` requests are in flight (0 = no limit),
  // then takes a slot.
  void AcquireSlot(int32_t limit) {
    absl::MutexLock lock(&mu_);
    while (limit > 0 && in_flight_ >= limit) cv_.Wait(&mu_);
    ++in_flight_;
  }

  void Complete(size_t i, RequestOutput output) {
    const Clock::time_point end = Clock::now();
    absl::MutexLock lock(&mu_);
    outputs_[i] = std::move(output);
    --in_flight_;
    ++completed_;
    last_end_ = std::max(last_end_, end);
    ShowProgressLocked(end);
    cv_.SignalAll();
  }

  // Waits for every request; returns the outputs and the last completion.
  std::vector<RequestOutput> Wait(Clock::time_point* last_end) {
    absl::MutexLock lock(&mu_);
    while (completed_ < outputs_.size()) cv_.Wait(&mu_);
    if (tty_ && !outputs_.empty()) std::fputc('\n', stderr);
    *last_end = last_end_;
    return std::move(outputs_);
  }

 private:
  void ShowProgressLocked(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!progress_) return;
    const int64_t total = static_cast<int64_t>(outputs_.size());
    const int64_t done = static_cast<int64_t>(completed_);
    const std::string bar = ProgressBar(done, total, SecondsBetween(t0_, now));
    if (tty_) {
      std::fprintf(stderr, "\r%s", bar.c_str());
    } else if (const int64_t tenth = done * 10 / total; tenth > last_tenth_) {
      last_tenth_ = tenth;
      std::fprintf(stderr, "%s\n", bar.c_str());
    }
    std::fflush(stderr);
  }

  const Clock::time_point t0_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<RequestOutput> outputs_ ABSL_GUARDED_BY(mu_);
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  size_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  Clock::time_point last_end_ ABSL_GUARDED_BY(mu_);
  const bool progress_;
  const bool tty_;
  int64_t last_tenth_ ABSL_GUARDED_BY(mu_) = 0;
};

// Sends `request` and waits for it (a warm-up).
RequestOutput SendAndWait(BenchBackend& backend, const BenchRequest& request) {
  absl::Mutex mu;
  absl::CondVar cv;
  std::optional<RequestOutput> result;
  backend.Send(request, [&](RequestOutput o) {
    absl::MutexLock lock(&mu);
    result = std::move(o);
    cv.Signal();
  });
  absl::MutexLock lock(&mu);
  while (!result.has_value()) cv.Wait(&mu);
  return std::move(*result);
}

}  // namespace

std::string ProgressBar(int64_t done, int64_t total, double elapsed_s) {
  const int64_t filled = total > 0 ? kBarCells * done / total : kBarCells;
  const int width = static_cast<int>(absl::StrCat(total).size());
  const int64_t secs = static_cast<int64_t>(std::max(0.0, elapsed_s));
  const std::string clock =
      secs >= 3600 ? absl::StrFormat("%02d:%02d:%02d", secs / 3600, secs / 60 % 60, secs % 60)
                   : absl::StrFormat("%02d:%02d", secs / 60, secs % 60);
  return absl::StrFormat("  %*d/%d [%s%s] %s", width, done, total, std::string(filled, '#'),
                         std::string(kBarCells - filled, '.'), clock);
}

absl::StatusOr<RunResult> RunBenchmark(BenchBackend& backend,
                                       const std::vector<BenchRequest>& requests,
                                       const RunOptions& options) {
  if (absl::Status s = CheckOptions(requests, options); !s.ok()) return s;
  RunResult result;
  if (requests.empty()) return result;
  for (int32_t w = 0; w < options.num_warmups; ++w) {
    RequestOutput o = SendAndWait(backend, requests[0]);
    if (!o.success)
      return absl::UnavailableError(absl::StrCat("warm-up request failed: ", o.error));
  }

  const Clock::time_point t0 = Clock::now();
  RunState state(requests.size(), options.progress, t0);
  std::optional<Clock::time_point> first_start;
  for (size_t i = 0; i < requests.size(); ++i) {
    const double at = !options.send_times_s.empty() ? options.send_times_s[i]
                                                    : requests[i].timestamp_s.value_or(0.0);
    std::this_thread::sleep_until(
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at)));
    state.AcquireSlot(options.max_concurrency);
    const Clock::time_point start = Clock::now();
    if (!first_start.has_value()) first_start = start;
    const double start_s = SecondsBetween(t0, start);
    backend.Send(requests[i], [&state, i, start_s](RequestOutput o) {
      o.start_s = start_s;
      state.Complete(i, std::move(o));
    });
  }
  Clock::time_point last_end;
  result.outputs = state.Wait(&last_end);
  result.duration_s = std::max(0.0, SecondsBetween(*first_start, last_end));
  return result;
}

}  // namespace tandem::bench
