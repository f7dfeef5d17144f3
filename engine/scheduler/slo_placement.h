// Placement by predicted cost (conditional.placement slo) and the
// TPOT-bounded prefill chunk (issue #34), both read from a worker's
// StepModel.
//
// Placement: a decode worker D weighs prefilling a prompt itself against a
// prefill worker P (Mooncake's Conductor places by predicted TTFT and TBT;
// Dynamo's conditional disaggregation looks at the prefill queue):
//   local  TTFT = the steps D needs for the prefill tokens queued ahead of
//                 this prompt, then for the prompt's own chunks, each step
//                 with D's running decodes (chunks TPOT-bounded when
//                 slo.tpot_ms is set);
//          TPOT = the step time D's running decodes see meanwhile (0 when
//                 none run);
//   remote TTFT = P's queue wait + P's prefill of the prompt (the router's
//                 PrefillEstimate): Tandem streams token 0 from P's reply,
//                 so the transfer is not on the first token's path;
//          TPOT = the new sequence's first gap: the transfer's tail beyond
//                 P's prefill (bytes / measured link rate - prefill time,
//                 >= 0) + D's first decode step with it.
// Each option's miss is max(TTFT / slo.ttft_ms, TPOT / slo.tpot_ms) over
// the SLOs set (<= 1: meets them). The option that meets the SLOs wins;
// when both do, the one with the earlier predicted first token (so prefill
// load splits between D and P by predicted TTFT); when neither does, the
// one that misses by less. A tie stays local.
//
// Owns: these two decisions. Does not touch: queues, KV memory. Threads:
// pure functions.
#ifndef TANDEM_ENGINE_SCHEDULER_SLO_PLACEMENT_H_
#define TANDEM_ENGINE_SCHEDULER_SLO_PLACEMENT_H_

#include <cstdint>

#include "engine/scheduler/step_model.h"

namespace tandem::scheduler {

// The floor that keeps prefill advancing however tight slo.tpot_ms is: the
// first prefill chunk of a step whose decodes alone exceed tpot_ms.
inline constexpr int32_t kMinTpotChunkTokens = 16;

// The largest prefill chunk of at most `max_count` tokens at [start, ...)
// that keeps a step of `planned` plus that chunk within `tpot_ms` by the
// model's prediction. When not even one token fits: the floor,
// min(kMinTpotChunkTokens, max_count), if `planned` has no prefill tokens
// yet, else 0. Returns max_count when tpot_ms <= 0 or the model has no
// samples.
int32_t TpotChunkTokens(const StepModel& model, const StepShape& planned, int32_t start,
                        int32_t max_count, double tpot_ms);

// What D knows when it places a prompt.
struct PlacementInputs {
  double slo_ttft_ms = 0;  // 0 = not set
  double slo_tpot_ms = 0;  // 0 = not set
  // D now: its running decodes, and the prefill tokens queued ahead of the
  // prompt (waiting prompts and running prefills, not yet computed).
  int32_t decode_seqs = 0;
  int64_t decode_context = 0;
  int64_t queued_prefill_tokens = 0;
  // A step's prefill tokens before any TPOT bound: min(prefill_chunk_tokens,
  // max_num_batched_tokens - decode_seqs), >= 1.
  int32_t step_prefill_tokens = 1;
  // The prompt: L (BOS included) and its local prefix-cache hit.
  int32_t prompt_tokens = 0;
  int32_t local_hit_tokens = 0;
  // The router's PrefillEstimate and the transfer time of the prompt's K/V
  // at the measured link rate (0 when not measured), ms.
  double remote_queue_ms = 0;
  double remote_prefill_ms = 0;
  double kv_transfer_ms = 0;
};

// The decision and the predictions behind it, ms.
struct PlacementPrediction {
  bool remote = false;
  double ttft_local_ms = 0;
  double ttft_remote_ms = 0;
  double tpot_local_ms = 0;
  double tpot_remote_ms = 0;
};

// Places one prompt by predicted SLO miss (see the file comment). `model`
// should have samples (without, every prediction is 0 and it stays local).
PlacementPrediction PlaceBySlo(const StepModel& model, const PlacementInputs& in);

}  // namespace tandem::scheduler

#endif  // TANDEM_ENGINE_SCHEDULER_SLO_PLACEMENT_H_
