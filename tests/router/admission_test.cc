// router::Admission alone: slots, FIFO order, refusal, cancel and deadline
// of queued requests, the retry-after formula.
#include "router/admission.h"

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Records which requests started and which were dropped, by name.
class Recorder {
 public:
  Admission::StartFn Start(std::string name) {
    return [this, name] {
      absl::MutexLock lock(&mu_);
      started_.push_back(name);
    };
  }
  Admission::DropFn Drop(std::string name) {
    return [this, name](absl::Status s) {
      absl::MutexLock lock(&mu_);
      dropped_.push_back(name);
      drop_status_.push_back(s);
    };
  }
  std::vector<std::string> started() {
    absl::MutexLock lock(&mu_);
    return started_;
  }
  std::vector<std::string> dropped() {
    absl::MutexLock lock(&mu_);
    return dropped_;
  }
  std::vector<absl::Status> drop_status() {
    absl::MutexLock lock(&mu_);
    return drop_status_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> started_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> dropped_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> drop_status_ ABSL_GUARDED_BY(mu_);
};

absl::Time Later() { return absl::Now() + absl::Hours(1); }

Admission::Options Opts(int inflight, int queued) {
  Admission::Options o;
  o.max_inflight = inflight;
  o.max_queued = queued;
  return o;
}

TEST(AdmissionTest, StartsUpToMaxInflightThenQueuesInFifoOrder) {
  Admission admission(Opts(2, 3));
  Recorder r;
  for (const char* name : {"a", "b", "c", "d", "e"}) {
    Admission::Ticket t = admission.Submit(Later(), r.Start(name), r.Drop(name));
    ASSERT_TRUE(t.status.ok()) << name << ": " << t.status;
  }
  EXPECT_THAT(r.started(), ElementsAre("a", "b"));
  EXPECT_EQ(admission.running(), 2);
  EXPECT_EQ(admission.queued(), 3);

  admission.Release();
  EXPECT_THAT(r.started(), ElementsAre("a", "b", "c"));
  admission.Release();
  admission.Release();
  EXPECT_THAT(r.started(), ElementsAre("a", "b", "c", "d", "e"));
  EXPECT_EQ(admission.running(), 2);
  EXPECT_EQ(admission.queued(), 0);
  admission.Release();
  admission.Release();
  EXPECT_EQ(admission.running(), 0);
  EXPECT_TRUE(r.dropped().empty());
}

TEST(AdmissionTest, TicketSaysStartedOrQueued) {
  Admission admission(Opts(1, 1));
  Recorder r;
  Admission::Ticket first = admission.Submit(Later(), r.Start("a"), r.Drop("a"));
  Admission::Ticket second = admission.Submit(Later(), r.Start("b"), r.Drop("b"));
  EXPECT_TRUE(first.status.ok());
  EXPECT_FALSE(first.queued);
  EXPECT_TRUE(second.status.ok());
  EXPECT_TRUE(second.queued);
  EXPECT_NE(first.id, second.id);
}

TEST(AdmissionTest, RefusesBeyondCapacityWithoutCallingBack) {
  Admission admission(Opts(1, 1));
  Recorder r;
  admission.Submit(Later(), r.Start("a"), r.Drop("a"));
  admission.Submit(Later(), r.Start("b"), r.Drop("b"));
  Admission::Ticket t = admission.Submit(Later(), r.Start("c"), r.Drop("c"));
  EXPECT_EQ(t.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t.status.message(),
            "router at capacity: 1 running, 1 queued (router.max_inflight, router.max_queued)");
  // Nothing completed yet: the longest hint.
  EXPECT_EQ(t.retry_after_ms, Admission::kMaxRetryAfterMs);
  EXPECT_THAT(r.started(), ElementsAre("a"));
  EXPECT_TRUE(r.dropped().empty());
  EXPECT_EQ(admission.queued(), 1);

  // A freed slot admits "b" from the queue, which makes room for one more.
  admission.Release();
  EXPECT_THAT(r.started(), ElementsAre("a", "b"));
  EXPECT_TRUE(admission.Submit(Later(), r.Start("d"), r.Drop("d")).status.ok());
  EXPECT_EQ(admission.Submit(Later(), r.Start("e"), r.Drop("e")).status.code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(AdmissionTest, ZeroQueueRefusesAsSoonAsSlotsAreFull) {
  Admission admission(Opts(1, 0));
  Recorder r;
  EXPECT_TRUE(admission.Submit(Later(), r.Start("a"), r.Drop("a")).status.ok());
  Admission::Ticket t = admission.Submit(Later(), r.Start("b"), r.Drop("b"));
  EXPECT_EQ(t.status.message(),
            "router at capacity: 1 running, 0 queued (router.max_inflight, router.max_queued)");
}

TEST(AdmissionTest, CancelRemovesAQueuedRequestAtOnceAndFreesItsPlace) {
  Admission admission(Opts(1, 2));
  Recorder r;
  admission.Submit(Later(), r.Start("a"), r.Drop("a"));
  Admission::Ticket b = admission.Submit(Later(), r.Start("b"), r.Drop("b"));
  admission.Submit(Later(), r.Start("c"), r.Drop("c"));
  ASSERT_EQ(admission.Submit(Later(), r.Start("x"), r.Drop("x")).status.code(),
            absl::StatusCode::kResourceExhausted);

  admission.Cancel(b.id);
  EXPECT_THAT(r.dropped(), ElementsAre("b"));
  ASSERT_EQ(r.drop_status().size(), 1u);
  EXPECT_EQ(r.drop_status()[0].code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(r.drop_status()[0].message(), HasSubstr("cancelled by the client after"));
  EXPECT_EQ(admission.queued(), 1);
  // Its place is free: "d" queues behind "c", and "c" is next.
  EXPECT_TRUE(admission.Submit(Later(), r.Start("d"), r.Drop("d")).status.ok());
  admission.Release();
  admission.Release();
  EXPECT_THAT(r.started(), ElementsAre("a", "c", "d"));
  EXPECT_THAT(r.dropped(), ElementsAre("b"));
}

TEST(AdmissionTest, CancelOfARunningOrUnknownRequestDoesNothing) {
  Admission admission(Opts(1, 1));
  Recorder r;
  Admission::Ticket a = admission.Submit(Later(), r.Start("a"), r.Drop("a"));
  admission.Submit(Later(), r.Start("b"), r.Drop("b"));
  admission.Cancel(a.id);
  admission.Cancel(12345);
  EXPECT_TRUE(r.dropped().empty());
  EXPECT_EQ(admission.running(), 1);
  EXPECT_EQ(admission.queued(), 1);
}

TEST(AdmissionTest, DeadlineDropsAQueuedRequestAndTheNextOneKeepsItsPlace) {
  Admission admission(Opts(1, 2));
  Recorder r;
  absl::Notification expired;
  admission.Submit(Later(), r.Start("a"), r.Drop("a"));
  const absl::Time submitted = absl::Now();
  admission.Submit(submitted + absl::Milliseconds(50), r.Start("b"), [&](absl::Status s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(s.message(), HasSubstr("in the router's queue: all router.max_inflight = 1 "
                                       "slots stayed busy"));
    expired.Notify();
  });
  admission.Submit(Later(), r.Start("c"), r.Drop("c"));
  ASSERT_TRUE(expired.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // The timer waited for the deadline, not less.
  EXPECT_GE(absl::Now() - submitted, absl::Milliseconds(50));
  EXPECT_EQ(admission.queued(), 1);
  admission.Release();
  EXPECT_THAT(r.started(), ElementsAre("a", "c"));
  EXPECT_TRUE(r.dropped().empty());
}

TEST(AdmissionTest, EarlierDeadlineQueuedLaterExpiresFirst) {
  Admission admission(Opts(1, 2));
  Recorder r;
  absl::Notification expired;
  admission.Submit(Later(), r.Start("a"), r.Drop("a"));
  admission.Submit(Later(), r.Start("late"), r.Drop("late"));
  // The timer was sleeping until "late"'s deadline; this one must wake it.
  admission.Submit(absl::Now() + absl::Milliseconds(20), r.Start("soon"),
                   [&](absl::Status) { expired.Notify(); });
  ASSERT_TRUE(expired.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(admission.queued(), 1);
  admission.Release();
  EXPECT_THAT(r.started(), ElementsAre("a", "late"));
}

TEST(AdmissionTest, ReleaseFromStartDoesNotRecurse) {
  // Every request fails at once (Release inside its start): 1,000 queued
  // requests must all start, one after the other, on a flat stack.
  Admission admission(Opts(1, 1000));
  std::set<uintptr_t> frames;  // a local's address in each start
  int started = 0;
  admission.Submit(Later(), [] {}, [](absl::Status) {});  // holds the slot
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(admission.Submit(Later(),
                                 [&] {
                                   int local = 0;
                                   frames.insert(reinterpret_cast<uintptr_t>(&local));
                                   ++started;
                                   admission.Release();
                                 },
                                 [](absl::Status) {})
                    .status.ok());
  }
  admission.Release();
  EXPECT_EQ(started, 1000);
  // The first start and the deferred ones run at the same depth.
  EXPECT_LE(frames.size(), 2u);
  EXPECT_EQ(admission.running(), 0);
  EXPECT_EQ(admission.queued(), 0);
}

TEST(AdmissionTest, RetryAfterFormulaAndClamping) {
  // (queued + 1) * span / completions.
  EXPECT_EQ(Admission::RetryAfterMs(3, 8, absl::Seconds(2)), 1000);
  EXPECT_EQ(Admission::RetryAfterMs(0, 4, absl::Milliseconds(1000)), 250);
  // Clamped below and above.
  EXPECT_EQ(Admission::RetryAfterMs(0, 32, absl::Milliseconds(100)), 100);
  EXPECT_EQ(Admission::RetryAfterMs(0, 1, absl::ZeroDuration()), 100);
  EXPECT_EQ(Admission::RetryAfterMs(511, 32, absl::Seconds(10)), 10000);
  // No completion to estimate from: the longest.
  EXPECT_EQ(Admission::RetryAfterMs(5, 0, absl::ZeroDuration()), 10000);
}

TEST(AdmissionTest, RetryAfterUsesRecentCompletions) {
  Admission admission(Opts(1, 0));
  Recorder r;
  admission.Submit(Later(), r.Start("a"), r.Drop("a"));
  admission.Release();  // one completion just now: span ~0 -> the minimum
  admission.Submit(Later(), r.Start("b"), r.Drop("b"));
  Admission::Ticket t = admission.Submit(Later(), r.Start("c"), r.Drop("c"));
  ASSERT_EQ(t.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(t.retry_after_ms, Admission::kMinRetryAfterMs);
}

TEST(AdmissionTest, ObserverSeesEveryCountChangeAndEachWait) {
  // The router's gauges and queue-time histogram (router/router_metrics.h)
  // are fed from here: every change of (running, queued) in order, one
  // wait per request that started or left the queue, none for a refusal.
  std::vector<std::pair<int, int>> counts;
  std::vector<absl::Duration> waits;
  Admission::Observer observer;
  observer.on_counts = [&](int running, int queued) { counts.emplace_back(running, queued); };
  observer.on_waited = [&](absl::Duration waited) { waits.push_back(waited); };
  Admission admission(Opts(1, 2), observer);
  Recorder r;
  admission.Submit(Later(), r.Start("a"), r.Drop("a"));                  // runs: (1, 0)
  admission.Submit(Later(), r.Start("b"), r.Drop("b"));                  // (1, 1)
  Admission::Ticket c = admission.Submit(Later(), r.Start("c"), r.Drop("c"));  // (1, 2)
  ASSERT_EQ(admission.Submit(Later(), r.Start("x"), r.Drop("x")).status.code(),
            absl::StatusCode::kResourceExhausted);  // refused: no change, no wait
  admission.Cancel(c.id);  // (1, 1), c waited
  admission.Release();     // a ends, b starts: (1, 0), b waited
  admission.Release();     // (0, 0)
  using P = std::pair<int, int>;
  EXPECT_THAT(counts, ElementsAre(P(1, 0), P(1, 1), P(1, 2), P(1, 1), P(1, 0), P(0, 0)));
  ASSERT_EQ(waits.size(), 3u);  // a (at once), c (cancelled), b (started)
  EXPECT_EQ(waits[0], absl::ZeroDuration());
  EXPECT_GE(waits[1], absl::ZeroDuration());
  EXPECT_GE(waits[2], waits[1]);  // b was queued before c and left after it
  EXPECT_THAT(r.started(), ElementsAre("a", "b"));
}

TEST(AdmissionTest, ValidateOptionsNamesTheKey) {
  EXPECT_EQ(Admission::ValidateOptions(Opts(0, 1)).message(),
            "router.max_inflight must be >= 1, got 0");
  EXPECT_EQ(Admission::ValidateOptions(Opts(1, -1)).message(),
            "router.max_queued must be >= 0, got -1");
  EXPECT_TRUE(Admission::ValidateOptions(Opts(1, 0)).ok());
}

}  // namespace
}  // namespace tandem::router
