// The records `tandem bench` passes between its parts: a dataset makes
// BenchRequests, a backend sends one and fills a RequestOutput, the metrics
// summarise the outputs. Field meanings follow vLLM's `bench serve`
// (benchmarks/backend_request_func.py: RequestFuncInput / RequestFuncOutput)
// so its JSON results read the same.
#ifndef TANDEM_TOOLS_BENCH_BENCH_TYPES_H_
#define TANDEM_TOOLS_BENCH_BENCH_TYPES_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tandem::bench {

// The latest send time a run may plan, seconds from its start (about 3
// years): a later one (a trace's far-off timestamp, a rate of 1e-9/s) is
// refused instead of overflowing the clock or waiting for ever.
inline constexpr double kMaxSendTimeS = 1e8;

// One request of a run. Exactly one of `prompt` (text: ShareGPT) and
// `prompt_token_ids` (random, prefix-repetition, Mooncake) is non-empty.
struct BenchRequest {
  std::string prompt;                     // UTF-8 text, tokenized by the server
  std::vector<int32_t> prompt_token_ids;  // exact ids, sent as GenerateRequest.prompt_token_ids
  int32_t prompt_len = 0;                 // tokens (the ids' count, or the text's tokenization)
  int32_t output_len = 0;                 // max_tokens, sent with ignore_eos: exactly this many
  // Send time in seconds from the run's start, from a trace (Mooncake's
  // `timestamp` / 1000); absent: the arrival process decides.
  std::optional<double> timestamp_s;
};

// What one request measured. Times are seconds on a steady clock.
struct RequestOutput {
  bool success = false;
  std::string error;          // "" on success, else "CODE: message" (gRPC) or "HTTP 503: ..."
  int32_t prompt_len = 0;     // prompt tokens (the server's count when it reports one)
  int32_t output_tokens = 0;  // tokens generated
  double start_s = 0;         // send time, from the run's start
  double ttft_s = 0;          // send -> first generated token
  double latency_s = 0;       // send -> end of the stream (E2EL)
  // Gaps between successive chunks that carried tokens (vLLM's `itl`): a
  // chunk of k > 1 tokens gives one gap, as in vLLM.
  std::vector<double> itl_s;
  std::string generated_text;
  // The server's placement of the prompt (gRPC: the last message's
  // Placement): "local" | "remote", "" when it reported none.
  std::string placement;
  // The TTFT the server predicted for the placement it chose (Placement's
  // ttft_remote_ms when remote, else ttft_local_ms), in seconds; absent when
  // it made no prediction (both predictions 0: placement threshold, a route
  // override, no prefill worker) or reported no placement.
  std::optional<double> predicted_ttft_s;
};

// Sends requests to a server. Implementations: GrpcBackend (the router's
// tandem.v1.Generation.Generate stream) and OpenAiBackend (POST
// /v1/completions with "stream": true).
class BenchBackend {
 public:
  virtual ~BenchBackend() = default;
  // Starts `request` now; calls `done` exactly once, from any thread, when
  // the stream ended (success or not). Never blocks for the stream.
  virtual void Send(const BenchRequest& request, std::function<void(RequestOutput)> done) = 0;
};

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_BENCH_TYPES_H_
