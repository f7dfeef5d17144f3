// GrpcBackend: `tandem bench --backend tandem`. Each BenchRequest is one
// tandem.v1.Generation.Generate server stream to the router (the public
// API, proto/tandem/v1/generation.proto), timed on a steady clock.
//
// Owns: one channel and stub to the router; one reactor per stream.
// Does not touch: the run's schedule (runner.h) or the statistics (metrics.h).
// Threads: Send() may be called from any thread; each stream is a gRPC
// callback reactor (grpc::ClientReadReactor), so no thread is held per
// stream and `done` runs on a gRPC callback thread. The destructor waits
// for every stream it started to end (each has the request's deadline).
#ifndef TANDEM_TOOLS_BENCH_GRPC_BACKEND_H_
#define TANDEM_TOOLS_BENCH_GRPC_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tools/bench/bench_types.h"

namespace tandem::bench {

struct GrpcBackendOptions {
  std::string router = "127.0.0.1:50051";  // host:port of the router (--router)
  std::string api_key;                     // sent as "authorization: Bearer KEY"; "" = none
  int64_t timeout_ms = 0;                  // per-stream deadline (--timeout-ms); 0 = none
};

class GrpcBackend final : public BenchBackend {
 public:
  // INVALID_ARGUMENT naming --router for an address that is not host:port
  // with a port in 1..65535 (tools/router_client.h's CheckRouterAddress),
  // or --timeout-ms < 0. Connects lazily: an unreachable router shows as
  // failed requests (UNAVAILABLE), not here.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GrpcBackend>> Create(
      const GrpcBackendOptions& options);

  ~GrpcBackend() override;  // waits for the streams in flight to end

  // Sends `request` as one GenerateRequest: prompt_token_ids (or prompt),
  // max_tokens = output_len, ignore_eos, greedy (temperature 0), with the
  // deadline. `done` gets (times in seconds from the call to Send, steady
  // clock): ttft_s at the first message carrying tokens, one itl_s gap per
  // later message carrying tokens, latency_s at the stream's end;
  // output_tokens = tokens received; prompt_len = the router's
  // prompt_tokens when it reports one, else request.prompt_len;
  // generated_text = the messages' text. A stream that ends with a non-OK
  // status: success false, error "CODE: message" ("UNAVAILABLE: ...",
  // "DEADLINE_EXCEEDED: ..."). start_s is left 0 (the runner sets it).
  void Send(const BenchRequest& request, std::function<void(RequestOutput)> done) override;

 private:
  class Call;
  explicit GrpcBackend(const GrpcBackendOptions& options);
  void CallEnded();  // the last thing a Call does

  // Const after construction.
  const GrpcBackendOptions options_;
  const std::unique_ptr<tandem::v1::Generation::Stub> stub_;

  absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // Calls started and not yet ended
};

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_GRPC_BACKEND_H_
