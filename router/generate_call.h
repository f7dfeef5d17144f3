// One public Generate request inside the router: pick D, call
// D.Generate; if D asks for remote prefill, pick P and call P.Prefill;
// hand P's token 0 and D's tokens to the per-sample output assembly
// (router/sample_output.h: index order, detokenization, stop strings and
// stop-token text, the one place for both routes); stream what it releases
// to the client (DESIGN.md, Request flow).
//
// Each of the request's n samples streams its own messages (sample_index)
// and ends with one message carrying its finish_reason, sent once the
// decode worker reported the sample's end and every token up to it was
// delivered. A stop string ends a sample at once: n = 1 cancels the calls
// to D and P, n > 1 asks D to end that sample (DecodeWorker.CancelSample).
// When every sample has ended the calls to D and P are cancelled.
//
// Failures (docs/architecture.md, Failures):
// - A Prefill call that fails (or whose worker the registry marks lost):
//   the router tells D (DecodeWorker.AbortTransfer(request_id, attempt,
//   reason)); D decides per conditional.on_prefill_failure and, under
//   retry, asks again with NeedRemotePrefill{attempt + 1}; the router then
//   picks a prefill worker that has not failed this request. No healthy
//   prefill worker: AbortTransfer with no_prefill_worker, D prefills itself
//   (unless route_override REMOTE).
// - D dies mid-stream (its stream breaks and a status probe to it fails,
//   or the registry marks it lost): up to max_migrations times, the router
//   re-issues {prompt, the k tokens already streamed, first_output_index =
//   k} to another healthy decode worker, which continues at index k; for
//   n > 1 every sample goes with its own tokens (migrated_samples: each
//   unfinished one continues at its own index, ended ones stay ended). The
//   client's stream goes on without a gap.
//
// Owns: the request's client calls (to D and P) and its samples' output
// state (a SampleOutputs). Does not touch: worker selection policy (the
// registry), engine state. Threads: none of its own (no thread per
// request): gRPC's callback threads run the reactors' callbacks; Cancel()
// and WorkerLost() come from gRPC/registry threads. Every state change is
// under mu_.
#ifndef TANDEM_ROUTER_GENERATE_CALL_H_
#define TANDEM_ROUTER_GENERATE_CALL_H_

#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "common/server/stream_sink.h"
#include "engine/tokenizer/tokenizer.h"
#include "router/request_timing.h"
#include "router/router_metrics.h"
#include "router/sample_output.h"
#include "router/worker_registry.h"
#include "tandem/v1/generation.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::router {

class GenerateCall : public std::enable_shared_from_this<GenerateCall> {
 public:
  using Sink = rpc::StreamSink<v1::GenerateResponse>;
  struct Params {
    std::string request_id;
    std::vector<int32_t> prompt;  // tokenized, BOS included
    v1::GenerateRequest request;  // validated; sampling.seed set
    v1::EngineControls controls;  // the request's, for the workers (n set)
    std::chrono::system_clock::time_point deadline;
    // Re-issues to another decode worker after D died (router.max_migrations).
    int32_t max_migrations = 0;
    // Deadline of the status probe that tells a dead D from a D that ended
    // the stream with an error of its own (router.rpc_timeout_ms), ms.
    int32_t probe_timeout_ms = 2000;
    // Runs (under the call's lock: must not call back into it) with the
    // number of tokens about to be written to the client, every sample's,
    // each token once (the API key's generated-token charge); may be empty.
    std::function<void(int64_t)> on_tokens_emitted;
    // The router's metrics (router/router_metrics.h: the request's token
    // times, its end and outcome); null: none recorded. `arrival`: when the
    // call reached the router (the start of TTFT and end-to-end latency).
    RouterMetrics* metrics = nullptr;
    absl::Time arrival;
    // The same instant on the steady clock: the start of each sample's
    // RequestTiming (router/request_timing.h).
    std::chrono::steady_clock::time_point steady_arrival;
  };

  GenerateCall(Params params, WorkerRegistry* registry, const tokenizer::Tokenizer* tokenizer,
               std::shared_ptr<Sink> sink);
  ~GenerateCall();

  // Starts the request without blocking. `on_done` runs exactly once, on a
  // gRPC or the calling thread, after the sink was finished and every call
  // to a worker has ended (so the caller may count the request as gone).
  void Start(std::function<void()> on_done);
  // Client went away: cancels the calls to D and P; the sink finishes
  // with CANCELLED.
  void Cancel();
  // The registry marked worker `name` unhealthy: a prefill call to it is
  // treated as failed (failover), a decode stream on it migrates or ends
  // with UNAVAILABLE naming it.
  void WorkerLost(const std::string& name);

 private:
  class DecodeStream;
  struct PrefillCall;

  // Starts a D.Generate stream on `decode` (a migration when the samples
  // already hold tokens); the call starts from RunDeferred.
  void StartDecode(std::shared_ptr<WorkerHandle> decode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // D's stream callbacks (reactor threads).
  void OnDecodeMessage(DecodeStream* stream, const v1::DecodeGenerateResponse& msg);
  void OnDecodeDone(DecodeStream* stream, const grpc::Status& status);
  // The status probe after D's stream broke: answered and ready -> the
  // error was D's own; answered but not ready (draining, device lost) or
  // failed -> D is going or gone, and the stream moves on if it can.
  void OnProbeDone(std::shared_ptr<WorkerHandle> decode, grpc::Status stream_status, bool received,
                   bool decode_alive, bool decode_ready);
  // D asked for a remote prefill (attempt need.attempt()).
  void StartPrefill(const v1::NeedRemotePrefill& need) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnPrefillDone(const std::shared_ptr<PrefillCall>& call, const grpc::Status& status);
  // Tells D that remote prefill attempt `attempt` failed (fire and forget:
  // D may already have seen the failure itself).
  void AbortTransfer(uint32_t attempt, std::string reason, bool no_prefill_worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // No decode stream follows: records how the last one ended, stops P's
  // work if D failed, and finishes when nothing else is outstanding.
  void DecodeEnded(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How every log line names this request: "request <id>", plus
  // " (client <client_request_id>)" when the client gave one (HTTP:
  // X-Request-Id), so a client's id finds every line about its request.
  std::string LogTag() const;
  // The worker of `role` router.policy chooses for this request's prompt,
  // skipping `avoid` (workers that failed it) and, when `kv_layout_id` is
  // not empty, workers registered with another KV layout id (a P for D:
  // KV moves only between equal layouts), or null; logs "request <id>:
  // decode worker <name> (<score and its inputs>)" for a choice.
  // A prefill pick skips workers whose queue outlasts `max_queue_wait_s`;
  // when that leaves none, *why_none (if given) says so.
  std::shared_ptr<WorkerHandle> PickWorker(
      v1::WorkerRole role, std::vector<std::string> avoid, const std::string& kv_layout_id = "",
      double max_queue_wait_s = std::numeric_limits<double>::infinity(),
      std::string* why_none = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a dead D may be replaced (router.max_migrations left, not
  // route_override REMOTE, the request still running).
  bool CanMigrate() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After D's stream failed because D is gone: a stream that `received`
  // nothing is sent to another healthy decode worker (routing, no budget);
  // one that did migrates if CanMigrate(). Skips workers that failed this
  // request. True if a new stream started; `why` is logged.
  bool MoveOn(bool received, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the actions queued in deferred_ (starting calls, on_done) outside
  // mu_: gRPC may run a reactor's callback on the starting thread, and the
  // registry's lost callbacks take the handle's lock before mu_.
  void RunDeferred() ABSL_LOCKS_EXCLUDED(mu_);
  // Finishes the sink with the request's outcome once D's stream ended
  // and no prefill call is outstanding; runs on_done when nothing is left.
  void MaybeFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // D ended OK but a failed prefill call took token 0 with it (nothing was
  // streamed yet): starts the request again on a decode worker, once. True
  // if it did.
  bool RestartAfterLostFirstToken() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels the decode stream and every prefill call.
  void CancelCalls() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels every outstanding prefill call (marked superseded: its
  // failure is not a failover).
  void CancelPrefillCalls() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Hands `token` to the samples' output and sends what it releases.
  void Deliver(const v1::TokenOutput& token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends one emission of the samples' output: a message with its tokens
  // and text, or the sample's last message (route, prefill_worker and
  // decode_worker: the workers that served the request, after any retry
  // or migration), with the request's placement and timing
  // (router/request_timing.h; sample 0's phases go to the metrics). A
  // stop string's early end asks D to drop the sample
  // (n > 1, others left); with the last sample, cancels the calls to the
  // workers.
  void Send(SampleOutputs<v1::TokenOutput>::Emission emission) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks D to end sample `s` now (DecodeWorker.CancelSample, fire and
  // forget): a stop string ended it, the other samples go on.
  void CancelSample(uint32_t s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmitHeader() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `n` tokens of sample `s` are about to be written to the client: the
  // API key's charge (on_tokens_emitted) and the request's timer.
  void TokensEmitted(uint32_t s, int64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Params params_;
  WorkerRegistry* const registry_;
  const tokenizer::Tokenizer* const tokenizer_;
  const std::shared_ptr<Sink> sink_;

  absl::Mutex mu_;
  std::function<void()> on_done_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> deferred_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;    // the sink was finished
  grpc::Status lost_error_ ABSL_GUARDED_BY(mu_);  // a worker became unhealthy
  bool header_sent_ ABSL_GUARDED_BY(mu_) = false;
  std::string route_ ABSL_GUARDED_BY(mu_) = "local";
  // The current decode stream (null between streams: probing, migrating,
  // or ended) and its worker.
  DecodeStream* decode_stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::shared_ptr<WorkerHandle> decode_ ABSL_GUARDED_BY(mu_);
  bool decode_ended_ ABSL_GUARDED_BY(mu_) = false;   // no stream will follow
  grpc::Status decode_status_ ABSL_GUARDED_BY(mu_);  // how the last one ended
  int32_t migrations_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t decode_streams_ ABSL_GUARDED_BY(mu_) = 0;  // started so far
  bool restarted_ ABSL_GUARDED_BY(mu_) = false;      // RestartAfterLostFirstToken ran
  // The request's id on the workers: params_.request_id for the first
  // decode stream, "<id>.<n>" for the n-th after it.
  std::string worker_request_id_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> failed_decode_ ABSL_GUARDED_BY(mu_);  // died under us
  // Prefill calls not yet answered (every attempt's; a superseded one is
  // cancelled but still counted until its callback runs).
  std::vector<std::shared_ptr<PrefillCall>> prefill_calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> failed_prefill_ ABSL_GUARDED_BY(mu_);  // failed this request
  std::string prefill_name_ ABSL_GUARDED_BY(mu_);                 // first prefill worker (header)
  // The prefill worker whose Prefill call delivered token 0 (empty: the
  // prompt was prefilled by a decode worker): with decode_'s name, what
  // each sample's last message reports as the workers that served it.
  std::string served_prefill_ ABSL_GUARDED_BY(mu_);
  int32_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // streams, calls and probes running
  // Every sample's ordering, text, stop state and end.
  SampleOutputs<v1::TokenOutput> samples_ ABSL_GUARDED_BY(mu_);
  grpc::Status prefill_error_ ABSL_GUARDED_BY(mu_);
  // Prompt tokens the prefilling worker did not compute (prefix-cache hit).
  uint32_t cached_prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  RequestTimer timer_ ABSL_GUARDED_BY(mu_);  // params_.metrics' view of this request
  // Where the first token's time went (each sample's last message).
  RequestTimingRecorder timing_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_GENERATE_CALL_H_
