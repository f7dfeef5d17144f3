// A KV transfer that stalls mid-way ends within kv.transfer_timeout_ms with
// UNAVAILABLE and frees the decode worker's blocks (DESIGN.md: D owns its
// reservation and its clocks; never a hang).
//
// The prefill worker runs with --fault-stall-after-frames 2: it sends two
// KV frames (layers 0 and 1 of the 313-token prompt), then holds the
// connection open and sends nothing. The test also SIGSTOPs it once the
// transfer is seen, so not even its gRPC side answers.
#include <signal.h>

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/generate_client.h"

namespace tandem::testing {
namespace {

constexpr int32_t kTransferTimeoutMs = 1500;
// Slack on top of the transfer timeout for the failure to reach the client.
constexpr absl::Duration kSlack = absl::Seconds(1);

class StallTest : public ClusterSuite {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions options;
    options.transfer_timeout_ms = kTransferTimeoutMs;
    options.handshake_timeout_ms = kTransferTimeoutMs;
    options.prefill_fault_stall_after_frames = 2;
    StartSuiteCluster(options);
  }
};

TEST_F(StallTest, StalledTransferEndsUnavailableWithinTimeoutAndFreesBlocks) {
  const GoldenCase& g = Golden("long_repeated_313tok");
  absl::StatusOr<v1::WorkerStatus> d0 = cluster().DecodeStatus();
  ASSERT_TRUE(d0.ok()) << d0.status();
  const uint64_t base_bytes = d0->kv_bytes_received_total();

  // The call runs on its own thread; this one watches the decode worker.
  const absl::Time request_start = absl::Now();
  std::atomic<bool> done{false};
  absl::Time end;
  StreamResult result;
  std::thread client([&] {
    result = RunGenerate(cluster().stub(), MakeRequest(g.prompt, kGoldenMaxTokens),
                         absl::Seconds(30));
    end = absl::Now();
    done = true;
  });
  // Joined on every path out of the test (the call has its own deadline).
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();
    }
  } joiner{client};

  // (time, bytes received so far) samples of the decode worker, taken
  // straight from it: the router's GetStatus would wait on the stopped
  // prefill worker for up to rpc_timeout_ms.
  std::vector<std::pair<absl::Time, uint64_t>> samples;
  auto sample = [&]() -> absl::StatusOr<v1::WorkerStatus> {
    const absl::Time t = absl::Now();
    absl::StatusOr<v1::WorkerStatus> s = cluster().DecodeStatus(absl::Seconds(1));
    if (s.ok()) samples.emplace_back(t, s->kv_bytes_received_total() - base_bytes);
    return s;
  };
  const bool transfer_seen = PollUntil(
      absl::Seconds(10),
      [&] {
        absl::StatusOr<v1::WorkerStatus> s = sample();
        // Bytes, not transfers_in_flight: that counts a reservation still
        // waiting for HELLO, and stopping the prefill worker then would
        // test the handshake timeout instead.
        return done || (s.ok() && s->kv_bytes_received_total() > base_bytes);
      },
      absl::Milliseconds(1));
  ASSERT_TRUE(transfer_seen) << "the decode worker never showed the transfer";
  ASSERT_FALSE(done) << "the call ended before the stall: " << result.status.error_message();
  ASSERT_EQ(kill(cluster().prefill_pid(), SIGSTOP), 0);
  while (!done) {
    (void)sample();
    absl::SleepFor(absl::Milliseconds(5));
  }
  client.join();

  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << result.status.error_message();
  EXPECT_TRUE(result.token_ids.empty());
  // The stall began when the decode worker received its last frame. Every
  // sample still below the final byte count was taken before that, so the
  // latest such sample (or the request start) is a lower bound of the stall
  // start: measuring from it can only make the check stricter.
  ASSERT_FALSE(samples.empty());
  const uint64_t final_bytes = samples.back().second;
  EXPECT_GT(final_bytes, 0u);
  absl::Time stall_lower_bound = request_start;
  for (const auto& [t, bytes] : samples) {
    if (bytes < final_bytes) stall_lower_bound = std::max(stall_lower_bound, t);
  }
  EXPECT_LE(end - stall_lower_bound, absl::Milliseconds(kTransferTimeoutMs) + kSlack)
      << "the call ended " << absl::FormatDuration(end - stall_lower_bound)
      << " after the stall began";
  // And not before the timeout could have fired.
  EXPECT_GE(end - request_start, absl::Milliseconds(kTransferTimeoutMs))
      << "the call ended after only " << absl::FormatDuration(end - request_start);

  absl::StatusOr<v1::WorkerStatus> last;
  EXPECT_TRUE(PollUntil(absl::Seconds(2), [&] {
    last = cluster().DecodeStatus(absl::Seconds(1));
    return last.ok() && last->kv_blocks_in_use() == 0 && last->transfers_in_flight() == 0;
  })) << "decode worker still holds KV 2 s after the failure: "
      << (last.ok() ? last->DebugString() : last.status().ToString());

  ASSERT_EQ(kill(cluster().prefill_pid(), SIGCONT), 0);
  // Resumed, the prefill worker sees the router's cancel and lets go too.
  absl::StatusOr<v1::WorkerStatus> p;
  EXPECT_TRUE(PollUntil(absl::Seconds(5), [&] {
    p = cluster().PrefillStatus(absl::Seconds(1));
    return p.ok() && p->kv_blocks_in_use() == 0 && p->transfers_in_flight() == 0 &&
           p->running_requests() == 0;
  })) << "prefill worker still busy after SIGCONT: "
      << (p.ok() ? p->DebugString() : p.status().ToString());
  // The cluster still serves (locally: every remote prefill stalls here).
  const GoldenCase& next = Golden("once_upon_a_time");
  ExpectGolden(RunGenerate(cluster().stub(), MakeRequest(next.prompt, kGoldenMaxTokens)), next,
               "local");
}

}  // namespace
}  // namespace tandem::testing
