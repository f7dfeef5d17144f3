// Each worker's own speed: an online model of one engine step's wall time
// from the step's shape, and the measured KV transfer rate per prefill
// worker (issue #34; the cost model behind Mooncake's Conductor, Qin et al.
// 2024, and Sarathi-Serve's TPOT-bounded token budget, Agrawal et al.
// 2024).
//
// A step's predicted time is linear in five features:
//   t_ms = base + a x prefill tokens + b x prefill (query, key) pairs / 1000
//        + c x decode sequences + d x decode context tokens / 1000
// The pairs term is attention's quadratic cost of a chunk of `count` tokens
// starting at `start`: count x (start + (count + 1) / 2). The coefficients
// are the least-squares fit (each >= 0: an active-set refit drops any
// that comes out negative) over exponentially weighted steps (forgetting
// factor 0.99 per step: about the last 100 steps count) plus the warm-up
// steps, which are never forgotten, so a feature unseen for a while (no
// prefill for minutes) keeps its warm-up cost instead of drifting to 0.
//
// Owns: the fit, its predictions, the link rates. Does not touch: clocks
// (callers pass measured times), scheduling. Threads: not thread-safe; the
// engine-loop thread observes and predicts, and copies a Snapshot for
// other threads.
#ifndef TANDEM_ENGINE_SCHEDULER_STEP_MODEL_H_
#define TANDEM_ENGINE_SCHEDULER_STEP_MODEL_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace tandem::scheduler {

struct StepPlan;

// What one engine step computes: the inputs of StepModel.
struct StepShape {
  int32_t prefill_tokens = 0;  // tokens of chunks longer than one token
  double prefill_pairs = 0;    // sum of ChunkPairs over those chunks
  int32_t decode_seqs = 0;     // one-token chunks (decodes)
  int64_t decode_context = 0;  // sum over decodes of the context they attend to (start + 1)

  // Attention's (query, key) pairs of `count` tokens at [start, start + count).
  static double ChunkPairs(int32_t start, int32_t count) {
    return static_cast<double>(count) * (start + (count + 1) / 2.0);
  }
  // Adds a chunk of `count` tokens at `start`: a decode when count == 1
  // (a prompt's last single-token chunk costs what a decode costs).
  void AddChunk(int32_t start, int32_t count);
};

// The shape of a scheduled step.
StepShape ShapeOf(const StepPlan& plan);

// The fitted coefficients, ms (the proto tandem.v1.StepModel's fields).
struct StepCoefficients {
  double base_ms = 0;
  double prefill_ms_per_token = 0;
  double prefill_ms_per_kilo_pair = 0;
  double decode_ms_per_seq = 0;
  double decode_ms_per_kilo_context = 0;
};

// A copy of the model for reporting (GetStatus, /metrics).
struct StepModelSnapshot {
  uint64_t samples = 0;  // steps fitted, warm-up included
  StepCoefficients coefficients;
  // Prompt tokens/s of one prefill chunk of `reference_chunk_tokens`
  // (Snapshot's argument) from position 0 with no decodes; 0 before any
  // sample.
  double prefill_tokens_per_s = 0;
  double decode_step_ms = 0;     // one decode of 1 sequence at 512 tokens of context
  double mean_abs_error_ms = 0;  // of recent non-anchor steps' predictions
  std::map<std::string, double> kv_link_bytes_per_s;  // per prefill worker
};

class StepModel {
 public:
  static constexpr int kFeatures = 5;
  static constexpr double kForgetting = 0.99;      // per observed step
  static constexpr double kErrorSmoothing = 0.05;  // EWMA weight of the newest error
  static constexpr double kLinkSmoothing = 0.3;    // EWMA weight of the newest transfer

  // One step that took `ms`. `anchor`: a warm-up step, kept at full weight
  // for good. Non-finite or negative times are ignored.
  void Observe(const StepShape& shape, double ms, bool anchor = false);
  // Predicted wall time of a step of `shape`, ms (0 before any sample).
  double PredictMs(const StepShape& shape) const;
  // Whether any step was observed (warm-up included).
  bool ready() const { return samples_ > 0; }
  uint64_t samples() const { return samples_; }
  const StepCoefficients& coefficients() const { return coefficients_; }

  // A finished KV load from prefill worker `peer`: `bytes` of payload in
  // `seconds` (its first frame to its FINAL). Ignored when either is <= 0.
  void ObserveTransfer(const std::string& peer, uint64_t bytes, double seconds);
  // The link rate to `peer`, bytes/s: its own when measured, else the
  // mean over measured peers, else nullopt.
  std::optional<double> LinkBytesPerSecond(const std::string& peer) const;

  StepModelSnapshot Snapshot(int32_t reference_chunk_tokens) const;

 private:
  using Vector = std::array<double, kFeatures>;
  using Matrix = std::array<Vector, kFeatures>;
  static Vector Features(const StepShape& shape);
  // Least squares over decayed + anchor sums, with every coefficient >= 0.
  void Refit();

  Matrix xtx_{};  // decayed sums of x x^T
  Vector xty_{};  // decayed sums of x y
  Matrix anchor_xtx_{};
  Vector anchor_xty_{};
  Vector theta_{};
  StepCoefficients coefficients_;
  uint64_t samples_ = 0;
  double mean_abs_error_ms_ = 0;
  std::map<std::string, double> link_bytes_per_s_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_ENGINE_SCHEDULER_STEP_MODEL_H_
