// One public Generate request inside the router: pick D, call
// D.Generate; if D asks for remote prefill, pick P and call P.Prefill;
// merge P's token 0 and D's tokens in index order; detokenize; stream to
// the client (DESIGN.md, Request flow).
//
// Owns: the request's client contexts (to D and P), ordering and
// detokenization state. Does not touch: worker selection policy (the
// registry), engine state. Threads: Run() on its own thread; the prefill
// call on a second one; Cancel() from a gRPC thread.
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
#include "engine/tokenizer/tokenizer.h"
#include "router/worker_registry.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::router {

class GenerateCall : public std::enable_shared_from_this<GenerateCall> {
 public:
  using Sink = rpc::StreamSink<v1::GenerateResponse>;
  struct Params {
    std::string request_id;
    std::vector<int32_t> prompt;  // tokenized, BOS included
    v1::GenerateRequest request;  // validated; sampling.seed set
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
  // Runs P.Prefill; on success streams token 0, on failure records the
  // error and cancels D.
  void RunPrefill(std::shared_ptr<WorkerHandle> prefill, const v1::NeedRemotePrefill& need);
  // Buffers `token` and emits every token that is next in index order.
  void Deliver(const v1::TokenOutput& token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmitHeader() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Params params_;
  const WorkerRegistry* const registry_;
  const tokenizer::Tokenizer* const tokenizer_;
  const std::shared_ptr<Sink> sink_;
  grpc::ClientContext decode_ctx_;
  grpc::ClientContext prefill_ctx_;

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status lost_error_ ABSL_GUARDED_BY(mu_);  // a worker became unhealthy
  bool header_sent_ ABSL_GUARDED_BY(mu_) = false;
  std::string route_ ABSL_GUARDED_BY(mu_) = "local";
  std::string decode_name_ ABSL_GUARDED_BY(mu_);
  std::string prefill_name_ ABSL_GUARDED_BY(mu_);
  uint32_t next_index_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, v1::TokenOutput> pending_ ABSL_GUARDED_BY(mu_);
  tokenizer::IncrementalDecoder decoder_ ABSL_GUARDED_BY(mu_);
  grpc::Status prefill_error_ ABSL_GUARDED_BY(mu_);
  // Prompt tokens the prefilling worker did not compute (prefix-cache hit).
  uint32_t cached_prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_GENERATE_CALL_H_
