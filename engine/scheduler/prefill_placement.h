// Conditional disaggregation: where a new prompt is prefilled (DESIGN.md,
// request flow step 3), as one small named policy the scheduler calls at
// admission.
//
// Owns: the local/remote decision for one prompt. Does not touch: KV
// memory, the prefix cache (the scheduler looks the prompt up once and
// passes the hit in), transfers. Threads: pure functions.
#ifndef TANDEM_ENGINE_SCHEDULER_PREFILL_PLACEMENT_H_
#define TANDEM_ENGINE_SCHEDULER_PREFILL_PLACEMENT_H_

#include <cstdint>
#include <string>

namespace tandem::scheduler {

// Where the prompt is prefilled; values equal tandem.v1.RouteOverride.
enum class RouteChoice : uint32_t { kAuto = 0, kLocal = 1, kRemote = 2 };

// How a kAuto prompt above the local threshold is placed (the config's
// conditional.placement).
enum class PlacementPolicy { kThreshold, kSlo };

// The router's prediction of a remote prefill of one prompt
// (tandem.v1.PrefillEstimate), ms.
struct RemotePrefillEstimate {
  std::string prefill_worker;
  double queue_ms = 0;
  double prefill_ms = 0;
};

// Whether a prompt of `prompt_tokens` tokens (L, BOS included) goes to a
// prefill worker: always for kRemote, never for kLocal, and for kAuto when
// the tokens left to compute after the local prefix hit exceed the
// threshold: L - local_hit_tokens > max_local_prefill_tokens. INT32_MAX
// (the config's `unbounded`, colocated mode) never chooses remote under
// kAuto: 0 <= local_hit_tokens <= L, so the difference never overflows.
inline bool PrefillRemotely(RouteChoice route, int32_t prompt_tokens, int32_t local_hit_tokens,
                            int32_t max_local_prefill_tokens) {
  switch (route) {
    case RouteChoice::kLocal:
      return false;
    case RouteChoice::kRemote:
      return true;
    case RouteChoice::kAuto:
      return prompt_tokens - local_hit_tokens > max_local_prefill_tokens;
  }
  return false;
}

}  // namespace tandem::scheduler

#endif  // TANDEM_ENGINE_SCHEDULER_PREFILL_PLACEMENT_H_
