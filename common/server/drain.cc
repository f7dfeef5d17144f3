#include "common/server/drain.h"

#include "common/server/log.h"
#include "common/server/server_util.h"

namespace tandem::rpc {

void WaitUntil(absl::Duration timeout, absl::Duration poll, const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline && !done()) absl::SleepFor(poll);
}

int ServeUntilDrained(const DrainPlan& plan) {
  const int sig = WaitForTerminationSignal();
  plan.stop_accepting(sig);
  WaitUntil(absl::Seconds(plan.grace_s), absl::Milliseconds(20),
            [&plan] { return plan.running() <= 0; });
  plan.shut_down();
  Log("stopped");
  return sig;
}

}  // namespace tandem::rpc
