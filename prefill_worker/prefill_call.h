// One Prefill call without gRPC: a prefill-only request to the engine core
// whose KV goes to the decode worker through a SenderKvExport, and whose
// end (token 0 or an error) comes back as one PrefillResult.
//
// Owns: the mapping of a Prefill call onto core::EngineRequest. Does not
// touch: scheduling, sampling, stop decisions (the core), sockets (the
// export). Threads: SubmitPrefill from any thread; `done` runs once, on
// the core's loop thread (or inside SubmitPrefill when it is refused).
#ifndef TANDEM_PREFILL_WORKER_PREFILL_CALL_H_
#define TANDEM_PREFILL_WORKER_PREFILL_CALL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/core/engine_core.h"
#include "prefill_worker/kv_export.h"

namespace tandem::prefill {

struct PrefillRequest {
  std::string request_id;
  std::vector<int32_t> prompt;  // BOS included
  int64_t max_tokens = 1;
  sampling::SamplingOptions sampling;
  core::GenerationControls controls;
  // Where the KV goes: D's target as the router forwarded it
  // (PrefillRequest.kv_target; its request_id is D's, for logs only).
  core::KvTarget kv_target;
};

struct PrefillResult {
  // Token 0 of each sample, in sample order, and why it ends there (kNone:
  // D decodes on).
  std::vector<core::SampleStart> samples;
  uint32_t prompt_tokens_computed = 0;
  uint64_t kv_bytes_sent = 0;
  // This worker's queue and prefill time (RequestOutput::OnPhases).
  core::RequestPhases phases;
};

using PrefillDone = std::function<void(absl::StatusOr<PrefillResult>)>;

// Queues `request` on `core`. Errors reach `done`: INVALID_ARGUMENT for
// kv_target.hit_tokens beyond the prompt or any core::EngineCore::Submit
// error; FAILED_PRECONDITION when this worker and D's offer share no KV
// transport (naming both; from TransportOfferFromTarget,
// worker/kv_data_planes.h, or the export's Open); KV handshake and
// send errors (UNAVAILABLE, FAILED_PRECONDITION, DEADLINE_EXCEEDED, ...);
// CANCELLED after core.Cancel(request_id).
void SubmitPrefill(core::EngineCore& core, const KvSendOptions& send, PrefillRequest request,
                   PrefillDone done);

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_PREFILL_CALL_H_
