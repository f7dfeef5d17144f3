// One public Generate request inside the router: pick D, call
// D.Generate; if D asks for remote prefill, pick P and call P.Prefill;
// merge P's token 0 and D's tokens in index order per sample; detokenize;
// match stop strings (router/stop_strings.h, the one place for both
// routes); stream to the client (DESIGN.md, Request flow).
//
// Each of the request's n samples streams its own messages (sample_index)
// and ends with one message carrying its finish_reason, sent once the
// decode worker reported the sample's end and every token up to it was
// delivered. A stop string ends a sample at once: n = 1 cancels the calls
// to D and P, n > 1 asks D to end that sample (DecodeWorker.CancelSample).
// When every sample has ended the calls to D and P are cancelled.
//
// Owns: the request's client contexts (to D and P), ordering,
// detokenization and stop-string state. Does not touch: worker selection
// policy (the registry), engine state. Threads: Run() on its own thread;
// the prefill call on a second one; Cancel() from a gRPC thread.
#ifndef TANDEM_ROUTER_GENERATE_CALL_H_
#define TANDEM_ROUTER_GENERATE_CALL_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "common/server/stream_sink.h"
#include "engine/core/stop_checker.h"
#include "engine/tokenizer/tokenizer.h"
#include "router/stop_strings.h"
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
    int32_t prefill_timeout_ms = 120000;
  };

  GenerateCall(Params params, const WorkerRegistry* registry,
               const tokenizer::Tokenizer* tokenizer, std::shared_ptr<Sink> sink);
  // Blocks until the request ends; finishes the sink exactly once.
  void Run();
  // Client went away: cancels the calls to D and P.
  void Cancel();
  // The registry marked a worker of this request unhealthy: the request
  // ends with UNAVAILABLE naming it.
  void WorkerLost(const std::string& name);

 private:
  // One sample's stream state.
  struct SampleStream {
    SampleStream(const tokenizer::Tokenizer& tokenizer, const StopStringMatcher& stops)
        : decoder(tokenizer), matcher(stops) {}
    tokenizer::IncrementalDecoder decoder;
    StopStringMatcher matcher;
    uint32_t next_index = 0;                      // next output index to emit
    std::map<uint32_t, v1::TokenOutput> pending;  // arrived early
    int32_t last_token = -1;
    v1::FinishReason finish = v1::FINISH_NONE;    // as the decode worker reported it
    bool done = false;                            // its last message was sent
  };

  // Runs P.Prefill; on success streams the samples' token 0, on failure
  // records the error and cancels D.
  void RunPrefill(std::shared_ptr<WorkerHandle> prefill, const v1::NeedRemotePrefill& need);
  // Buffers `token` and emits every token of its sample that is next in
  // index order (ending the sample if a stop string matches).
  void Deliver(const v1::TokenOutput& token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The decode worker ended sample `sample_index` with `reason`.
  void SampleFinished(uint32_t sample_index, v1::FinishReason reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends sample s's last message once its end is known and every token up
  // to it was emitted.
  void MaybeEndSample(uint32_t s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends sample s's last message (text: `text`) and, with the last sample,
  // cancels the calls to the workers.
  // `with` (may be null): a message whose tokens end the sample, sent as
  // the last one.
  void EndSample(uint32_t s, std::string text, v1::FinishReason reason,
                 const v1::StopReason* stop_reason, v1::GenerateResponse* with)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmitHeader() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Params params_;
  const WorkerRegistry* const registry_;
  const tokenizer::Tokenizer* const tokenizer_;
  const std::shared_ptr<Sink> sink_;
  // The request's stop-token rule (core::CheckStop's kStop part), to leave
  // a stop token's text out as vLLM does.
  core::StopCriteria stop_criteria_;
  std::vector<int32_t> stop_token_ids_;  // sorted
  grpc::ClientContext decode_ctx_;
  grpc::ClientContext prefill_ctx_;

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status lost_error_ ABSL_GUARDED_BY(mu_);  // a worker became unhealthy
  bool header_sent_ ABSL_GUARDED_BY(mu_) = false;
  std::string route_ ABSL_GUARDED_BY(mu_) = "local";
  std::shared_ptr<WorkerHandle> decode_ ABSL_GUARDED_BY(mu_);
  std::string prefill_name_ ABSL_GUARDED_BY(mu_);
  std::vector<SampleStream> samples_ ABSL_GUARDED_BY(mu_);
  uint32_t samples_left_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Status prefill_error_ ABSL_GUARDED_BY(mu_);
  // Prompt tokens the prefilling worker did not compute (prefix-cache hit).
  uint32_t cached_prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_GENERATE_CALL_H_
