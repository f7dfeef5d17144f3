// planner: the router's role planner (router/planner.h; issue #35), read
// from the cluster config's top-level `planner` mapping:
//
//   planner: {mode: off,                # off | load | slo
//             interval_s: 5,            # seconds between decisions, > 0
//             cooldown_s: 30,           # seconds, > 0: at most one flip per
//                                       # cooldown, none in the first one
//                                       # after start or a manual flip
//             min_prefill_workers: 1,   # integer >= 0
//             min_decode_workers: 1,    # integer >= 1
//             flip_roles: true}         # false: only export the wanted split
//
// Owns: the planner's settings and their parsing. Does not touch: the
// planner itself. Threads: pure functions.
#ifndef TANDEM_COMMON_PLANNER_CONFIG_H_
#define TANDEM_COMMON_PLANNER_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace tandem {

enum class PlannerMode {
  kOff,   // no planner: roles change only by `tandem role`
  kLoad,  // thresholds on P's queued prefill and D's KV use and batch
          // (Dynamo's load mode)
  kSlo,   // the split the workers' step models predict maximises goodput
          // under the config's `slo` (needs slo.ttft_ms or slo.tpot_ms)
};

// "off", "load" or "slo" (as planner.mode spells it).
const char* PlannerModeName(PlannerMode mode);

struct PlannerConfig {
  PlannerMode mode = PlannerMode::kOff;
  double interval_s = 5;
  double cooldown_s = 30;
  // Bind the planner only: a manual `tandem role` may go below them (down
  // to the router's own rule: never zero decode workers).
  int32_t min_prefill_workers = 1;
  int32_t min_decode_workers = 1;
  // true: the planner flips workers' roles itself (one router per
  // cluster). false: it only exports tandem_planner_desired_workers{role}
  // for an autoscaler (deploy/k8s/overlays/autoscaling), as several
  // router replicas each run a planner.
  bool flip_roles = true;
};

// Parses the `planner` mapping into *out. Errors: INVALID_ARGUMENT naming
// the key ("planner.mode: expected off, load or slo, got 'fast'",
// "planner.interval_s: expected a number > 0, got '0'", "unknown key
// 'planner.foo'"). planner.mode slo without an `slo` is refused by
// ParseClusterConfig ("planner.mode: slo needs slo.ttft_ms or slo.tpot_ms").
// Must run inside ParseClusterConfig's try-block (yaml-cpp may throw).
[[nodiscard]] absl::Status ParsePlanner(const YAML::Node& node, PlannerConfig* out);

}  // namespace tandem

#endif  // TANDEM_COMMON_PLANNER_CONFIG_H_
