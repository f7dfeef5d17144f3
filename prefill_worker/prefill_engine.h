// The prefill worker's engine: computes a prompt's KV cache, streams it to
// the decode worker layer by layer, and samples token 0.
//
// Owns: its KV block pool, the prefill queue and the engine thread.
// Does not touch: gRPC, routing, the decode worker's memory (only the KV
// transfer protocol). Threads: one engine thread runs requests in FIFO
// order (v0: one request per forward; batching arrives with issue #3);
// Submit/Cancel/GetStats are thread-safe.
//
// Per request (DESIGN.md, steps 4-6): connect to D's KV endpoint (HELLO /
// ACCEPT), run the forward over [0, L) with a per-layer hook that sends
// frame (layer, [max(start, hit), end)) as soon as the layer's K/V is
// written, sample token 0 with output index 0, send FINAL, free blocks.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_ENGINE_H_
#define TANDEM_PREFILL_WORKER_PREFILL_ENGINE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/serving_types.h"
#include "engine/kv/block_pool.h"
#include "engine/model/llama_model.h"
#include "engine/sampling/sampler.h"

namespace tandem::prefill {

struct PrefillRequest {
  std::string request_id;
  std::vector<int32_t> prompt;  // BOS included
  int32_t max_tokens = 1;
  sampling::SamplingOptions sampling;
  std::string kv_endpoint;      // D's KV receiver
  uint32_t attempt = 1;
  uint32_t hit_tokens = 0;      // D_hit: send [hit_tokens, L)
};

struct PrefillResult {
  sampling::SampledToken first_token;
  FinishReason finish_reason = FinishReason::kNone;
  uint32_t prompt_tokens_computed = 0;
  uint64_t kv_bytes_sent = 0;
};

struct PrefillEngineOptions {
  int32_t block_size = 16;
  int32_t num_kv_blocks = 2048;
  int32_t transfer_timeout_ms = 5000;  // per KV send / handshake
  int32_t eos_token_id = 2;
  std::string model_fingerprint;
  // Fault injection for tests: after this many frames, stop sending (as if
  // the link stalled) until cancelled. < 0 = off.
  int32_t fault_stall_after_frames = -1;
};

struct PrefillStats {
  uint32_t running_requests = 0;
  uint32_t kv_blocks_in_use = 0;
  uint32_t kv_blocks_total = 0;
  uint32_t transfers_in_flight = 0;
  uint64_t prefill_tokens_computed_total = 0;
  uint64_t kv_bytes_sent_total = 0;
};

class PrefillEngine {
 public:
  using Done = std::function<void(absl::StatusOr<PrefillResult>)>;

  PrefillEngine(const PrefillEngineOptions& options, const model::LlamaModel* model);
  ~PrefillEngine();  // Shutdown(), joins the engine thread

  // Queues a request; `done` runs once on the engine thread. Validation
  // errors (INVALID_ARGUMENT, RESOURCE_EXHAUSTED) and KV transfer errors
  // (UNAVAILABLE, FAILED_PRECONDITION, DEADLINE_EXCEEDED) arrive via `done`.
  void Submit(PrefillRequest request, Done done);
  // The request ends with CANCELLED at its next frame boundary.
  void Cancel(const std::string& request_id);
  // Ends queued requests with UNAVAILABLE and stops the thread.
  void Shutdown();
  PrefillStats GetStats() const;

 private:
  struct Job {
    PrefillRequest request;
    Done done;
  };
  void Loop();
  absl::StatusOr<PrefillResult> Run(const PrefillRequest& request);
  bool IsCancelled(const std::string& request_id) const;

  const PrefillEngineOptions options_;
  const model::LlamaModel* const model_;
  kv::BlockPool pool_;  // engine thread only
  std::vector<float> logits_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> cancelled_ ABSL_GUARDED_BY(mu_);
  PrefillStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_PREFILL_ENGINE_H_
