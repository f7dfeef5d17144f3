// Placement by predicted SLO miss and the TPOT-bounded chunk, from a step
// model fitted to known step times: base 1 ms + 0.01 ms per prefill token
// + 0.5 ms per decode sequence (no attention terms). Each case's expected
// numbers are worked out by hand in its comment.
#include "engine/scheduler/slo_placement.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/scheduler/known_step_model.h"

namespace tandem::scheduler {
namespace {

TEST(SloPlacementTest, KnownModelFitsExactly) {
  const StepModel model = KnownStepModel();
  StepShape shape;
  shape.AddChunk(0, 100);
  shape.AddChunk(500, 1);
  EXPECT_NEAR(model.PredictMs(shape), 1.0 + 1.0 + 0.5, 1e-3);
}

struct PlacementCase {
  std::string name;
  PlacementInputs in;
  bool remote;
  double ttft_local_ms;
  double ttft_remote_ms;
  double tpot_local_ms;
  double tpot_remote_ms;
};

PlacementInputs Inputs(double ttft, double tpot, int32_t decodes, int64_t queued, int32_t prompt,
                       double remote_queue, double remote_prefill, double transfer = 0) {
  PlacementInputs in;
  in.slo_ttft_ms = ttft;
  in.slo_tpot_ms = tpot;
  in.decode_seqs = decodes;
  in.decode_context = 100 * decodes;
  in.queued_prefill_tokens = queued;
  in.step_prefill_tokens = 512;
  in.prompt_tokens = prompt;
  in.remote_queue_ms = remote_queue;
  in.remote_prefill_ms = remote_prefill;
  in.kv_transfer_ms = transfer;
  return in;
}

TEST(SloPlacementTest, Table) {
  const StepModel model = KnownStepModel();
  const std::vector<PlacementCase> cases = {
      // D idle: 1000 tokens in chunks 512 + 488 = (1 + 5.12) + (1 + 4.88)
      // = 12 ms; P needs 20 ms: local is faster.
      {"idle decode worker prefills itself", Inputs(2000, 0, 0, 0, 1000, 0, 20), false, 12, 20, 0,
       1.5},
      // 10240 tokens queued on D: 20 steps of 512 (6.12 ms each) = 122.4
      // ms before its own 12 ms; P is idle (20 ms).
      {"queued decode worker sends it to an idle prefill worker",
       Inputs(2000, 0, 0, 10240, 1000, 0, 20), true, 134.4, 20, 0, 1.5},
      // P is busy for 5 s (TTFT SLO 1 s): local (12 ms) even though D has
      // 10240 tokens queued (134.4 ms).
      {"busy prefill worker: local", Inputs(1000, 0, 0, 10240, 1000, 5000, 20), false, 134.4, 5020,
       0, 1.5},
      // 8 decodes run on D, TPOT SLO 8.001 ms: decode-only steps take 5 ms,
      // so chunks are bounded to 300 tokens (5 + 3 = 8 ms): 300 x 3 + 100 ->
      // 3 x 8 + 6 = 30 ms, within both SLOs. Remote meets them too (20 ms,
      // its first decode step 1 + 9 x 0.5 = 5.5 ms) and its first token
      // comes earlier.
      {"both meet the SLOs: the earlier first token",
       Inputs(2000, 8.001, 8, 0, 1000, 0, 20), true, 30, 20, 8, 5.5},
      // Same, but the KV transfer runs 100 ms against P's 20 ms prefill:
      // the new sequence's first gap is 80 + 5.5 = 85.5 ms: only local
      // meets the SLOs.
      {"slow link: the transfer's tail breaks TPOT, local wins",
       Inputs(2000, 8.001, 8, 0, 1000, 0, 20, 100), false, 30, 20, 8, 85.5},
      // Both miss the 10 ms TTFT: local 12 ms (1.2), remote 5000 + 20 ms:
      // the smaller miss.
      {"both miss: the smaller miss", Inputs(10, 0, 0, 0, 1000, 5000, 20), false, 12, 5020, 0,
       1.5},
      // A tie (12 ms each way) stays local.
      {"tie stays local", Inputs(2000, 0, 0, 0, 1000, 2, 10), false, 12, 12, 0, 1.5},
  };
  for (const PlacementCase& c : cases) {
    SCOPED_TRACE(c.name);
    const PlacementPrediction p = PlaceBySlo(model, c.in);
    EXPECT_EQ(p.remote, c.remote);
    EXPECT_NEAR(p.ttft_local_ms, c.ttft_local_ms, 1e-3);
    EXPECT_NEAR(p.ttft_remote_ms, c.ttft_remote_ms, 1e-3);
    EXPECT_NEAR(p.tpot_local_ms, c.tpot_local_ms, 1e-3);
    EXPECT_NEAR(p.tpot_remote_ms, c.tpot_remote_ms, 1e-3);
  }
}

TEST(SloPlacementTest, CachedPrefixShortensTheLocalPrefill) {
  const StepModel model = KnownStepModel();
  PlacementInputs in = Inputs(2000, 0, 0, 0, 1000, 0, 5);
  in.local_hit_tokens = 992;  // 8 tokens left: 1 + 0.08 ms against P's 5 ms
  const PlacementPrediction p = PlaceBySlo(model, in);
  EXPECT_FALSE(p.remote);
  EXPECT_NEAR(p.ttft_local_ms, 1.08, 1e-3);
}

TEST(TpotChunkTokensTest, BoundsTheChunk) {
  const StepModel model = KnownStepModel();
  StepShape decodes;
  for (int d = 0; d < 8; ++d) decodes.AddChunk(100, 1);  // 5 ms
  // 5 + 0.01 c <= 8.001 -> c = 300.
  EXPECT_EQ(TpotChunkTokens(model, decodes, 0, 512, 8.001), 300);
  // Room for the whole chunk.
  EXPECT_EQ(TpotChunkTokens(model, decodes, 0, 512, 100), 512);
  // No SLO: unbounded.
  EXPECT_EQ(TpotChunkTokens(model, decodes, 0, 512, 0), 512);
  // 6 tokens fit (5.06 ms): 6, not the floor (which is for no fit at all).
  EXPECT_EQ(TpotChunkTokens(model, decodes, 0, 512, 5.061), 6);
  // The SLO is below the decode-only step: the floor keeps prefill going.
  EXPECT_EQ(TpotChunkTokens(model, decodes, 0, 512, 4), kMinTpotChunkTokens);
  EXPECT_EQ(TpotChunkTokens(model, decodes, 0, 5, 4), 5);
  // Another prefill chunk is already in the step: no floor.
  StepShape with_prefill = decodes;
  with_prefill.AddChunk(0, 300);
  EXPECT_EQ(TpotChunkTokens(model, with_prefill, 0, 512, 8), 0);
  // Without samples the model bounds nothing.
  EXPECT_EQ(TpotChunkTokens(StepModel(), decodes, 0, 512, 8), 512);
}

}  // namespace
}  // namespace tandem::scheduler
