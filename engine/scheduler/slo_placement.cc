#include "engine/scheduler/slo_placement.h"

#include <algorithm>
#include <cmath>

namespace tandem::scheduler {

int32_t TpotChunkTokens(const StepModel& model, const StepShape& planned, int32_t start,
                        int32_t max_count, double tpot_ms) {
  if (max_count <= 0) return 0;
  if (!(tpot_ms > 0) || !model.ready()) return max_count;
  const auto fits = [&](int32_t count) {
    StepShape shape = planned;
    shape.AddChunk(start, count);
    return model.PredictMs(shape) <= tpot_ms;
  };
  if (fits(max_count)) return max_count;
  // The predicted time grows with the chunk: binary search the largest
  // count in [1, max_count) that fits.
  int32_t lo = 0;          // fits (no chunk)
  int32_t hi = max_count;  // does not fit
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  if (lo > 0) return lo;
  // Not even one token fits (the decodes alone exceed tpot_ms): the
  // step's first prefill chunk still takes the floor.
  return planned.prefill_tokens == 0 ? std::min(kMinTpotChunkTokens, max_count) : 0;
}

namespace {

// Miss ratio of one option over the SLOs that are set (0 when none is):
// <= 1 meets them all.
double Miss(double ttft_ms, double tpot_ms, const PlacementInputs& in) {
  double miss = 0;
  if (in.slo_ttft_ms > 0) miss = std::max(miss, ttft_ms / in.slo_ttft_ms);
  if (in.slo_tpot_ms > 0) miss = std::max(miss, tpot_ms / in.slo_tpot_ms);
  return miss;
}

// a < b beyond rounding (a tie is not less).
bool Less(double a, double b) { return a < b * (1 - 1e-9); }

}  // namespace

PlacementPrediction PlaceBySlo(const StepModel& model, const PlacementInputs& in) {
  PlacementPrediction p;
  StepShape decodes;
  decodes.decode_seqs = in.decode_seqs;
  decodes.decode_context = in.decode_context;
  const int32_t hit = std::clamp(in.local_hit_tokens, 0, in.prompt_tokens);
  const int32_t own_tokens = in.prompt_tokens - hit;
  const int32_t step_tokens = std::max(in.step_prefill_tokens, 1);

  // Local: the queue ahead in steps of `ahead_chunk` (each from position 0,
  // an average prompt's attention cost is not known), then the prompt's own
  // chunks at their positions.
  const int32_t ahead_chunk =
      std::max(TpotChunkTokens(model, decodes, 0, step_tokens, in.slo_tpot_ms), 1);
  StepShape ahead_step = decodes;
  ahead_step.AddChunk(0, ahead_chunk);
  p.ttft_local_ms =
      static_cast<double>(in.queued_prefill_tokens) / ahead_chunk * model.PredictMs(ahead_step);
  double worst_step_ms = 0;
  for (int32_t start = hit; start < in.prompt_tokens;) {
    const int32_t count =
        std::max(TpotChunkTokens(model, decodes, start,
                                 std::min(step_tokens, in.prompt_tokens - start), in.slo_tpot_ms),
                 1);
    StepShape step = decodes;
    step.AddChunk(start, count);
    const double ms = model.PredictMs(step);
    p.ttft_local_ms += ms;
    worst_step_ms = std::max(worst_step_ms, ms);
    start += count;
  }
  if (own_tokens == 0) p.ttft_local_ms += model.PredictMs(decodes);
  p.tpot_local_ms = in.decode_seqs > 0 ? worst_step_ms : 0;

  // Remote: token 0 comes from P; the new sequence's first gap on D is the
  // transfer's tail plus one decode step with it.
  p.ttft_remote_ms = in.remote_queue_ms + in.remote_prefill_ms;
  StepShape with_new = decodes;
  with_new.AddChunk(in.prompt_tokens, 1);
  p.tpot_remote_ms =
      std::max(0.0, in.kv_transfer_ms - in.remote_prefill_ms) + model.PredictMs(with_new);

  const double local_miss = Miss(p.ttft_local_ms, p.tpot_local_ms, in);
  const double remote_miss = Miss(p.ttft_remote_ms, p.tpot_remote_ms, in);
  const bool local_meets = local_miss <= 1;
  const bool remote_meets = remote_miss <= 1;
  if (local_meets && remote_meets) {
    p.remote = Less(p.ttft_remote_ms, p.ttft_local_ms);  // the earlier first token
  } else if (local_meets != remote_meets) {
    p.remote = remote_meets;
  } else {
    p.remote = Less(remote_miss, local_miss);
  }
  return p;
}

}  // namespace tandem::scheduler
