// The end of every server main (router, workers): wait for SIGINT/SIGTERM,
// then drain in one fixed order: stop accepting, let running requests end
// within the grace period, shut the rest down.
//
// Threads: the main thread (after rpc::BlockTerminationSignals).
#ifndef TANDEM_COMMON_SERVER_DRAIN_H_
#define TANDEM_COMMON_SERVER_DRAIN_H_

#include <cstdint>
#include <functional>

#include "absl/time/time.h"

namespace tandem::rpc {

// The steps ServeUntilDrained runs after the signal.
struct DrainPlan {
  // Right after the signal (its number): readiness NOT_SERVING, refuse new
  // requests, say so in the log.
  std::function<void(int signal)> stop_accepting;
  // How many requests still run; waited for (every 20 ms) until 0 or
  // `grace_s` seconds (cluster `shutdown_grace_s`) have passed.
  std::function<int64_t()> running;
  int32_t grace_s = 5;
  // After that wait: end what remains and stop the servers.
  std::function<void()> shut_down;
};

// Blocks until a termination signal, runs `plan`, logs "stopped", and
// returns the signal's number.
int ServeUntilDrained(const DrainPlan& plan);

// Sleeps in steps of `poll` until `done()` is true or `timeout` has passed.
void WaitUntil(absl::Duration timeout, absl::Duration poll, const std::function<bool()>& done);

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_SERVER_DRAIN_H_
