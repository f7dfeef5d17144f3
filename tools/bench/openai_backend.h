// OpenAiBackend: `tandem bench --backend openai`. Each BenchRequest is one
// POST {base_url}/v1/completions with "stream": true to an OpenAI-compatible
// server (Tandem's router.http_listen, router/openai/, or vLLM), its
// server-sent events timed on a steady clock as vLLM's
// benchmarks/backend_request_func.py (async_request_openai_completions).
//
// Owns: one thread and one cpp-httplib connection per request in flight.
// Does not touch: the run's schedule (runner.h) or the statistics (metrics.h).
// Threads: Send() starts a detached thread per request (cpp-httplib's client
// is blocking; a thread per in-flight request is acceptable for a benchmark
// client whose concurrency is a few hundred streams); `done` runs on that
// thread. The destructor waits for every request thread to finish.
#ifndef TANDEM_TOOLS_BENCH_OPENAI_BACKEND_H_
#define TANDEM_TOOLS_BENCH_OPENAI_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "tools/bench/bench_types.h"

namespace tandem::bench {

struct OpenAiBackendOptions {
  std::string base_url = "http://127.0.0.1:8000";  // scheme://host:port (--base-url), no path
  std::string model;       // the request's "model" (--model): the server's served model name
  std::string api_key;     // sent as "Authorization: Bearer KEY"; "" = none
  int64_t timeout_ms = 0;  // per-request deadline (--timeout-ms); 0 = none
};

// One SSE "data:" payload of a /v1/completions stream, as the backend reads
// it: a chunk with a non-empty "choices" is token-bearing (vLLM counts every
// such chunk, even with empty text: a special token), except a bare finish
// (empty text and a finish_reason: Tandem's router sends one when the last
// message had no token); a chunk with "usage" gives
// completion_tokens / prompt_tokens; {"error": {...}} ends the stream as a
// failure. Exposed for tests.
struct SseChunk {
  bool has_choice = false;         // "choices" non-empty
  std::string text;                // choices[0].text
  bool finished = false;           // choices[0].finish_reason is not null
  int32_t completion_tokens = -1;  // usage.completion_tokens; -1 when absent
  int32_t prompt_tokens = -1;      // usage.prompt_tokens; -1 when absent
  std::string error;               // error.message ("" = none)
  bool done = false;               // the "[DONE]" sentinel

  bool token_bearing() const { return has_choice && !(text.empty() && finished); }
};
// Parses one payload; INVALID_ARGUMENT quoting (up to 200 bytes of) it when
// it is not JSON or not an object.
[[nodiscard]] absl::StatusOr<SseChunk> ParseSseChunk(const std::string& payload);

class OpenAiBackend final : public BenchBackend {
 public:
  // INVALID_ARGUMENT naming --base-url (not "http://host:port" with a port
  // in 1..65535; https is not supported), --model (empty) or --timeout-ms
  // (< 0).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<OpenAiBackend>> Create(
      const OpenAiBackendOptions& options);

  ~OpenAiBackend() override;  // waits for the requests in flight to end

  // POSTs {"model", "prompt": ids array (or text), "max_tokens": output_len,
  // "temperature": 0, "ignore_eos": true, "stream": true,
  // "stream_options": {"include_usage": true}}. `done` gets (seconds from
  // the call, steady clock): ttft_s at the first token-bearing chunk, one
  // itl_s gap per later one, latency_s after "[DONE]" / the body's end;
  // output_tokens = the usage chunk's completion_tokens when present, else
  // one per token-bearing chunk; prompt_len = usage.prompt_tokens when
  // present, else request.prompt_len. Failures (success false): "HTTP
  // <code>: <up to 200 bytes of the body>" for a non-200 answer,
  // "UNAVAILABLE: <cpp-httplib error>" when no answer came,
  // "DEADLINE_EXCEEDED: ..." past timeout_ms, "INTERNAL: <message>" for an
  // error event or a malformed chunk mid-stream, "DATA_LOSS: stream ended
  // before [DONE]", "RESOURCE_EXHAUSTED: cannot start a request thread: ..."
  // (then `done` runs on the caller's thread, before Send returns).
  void Send(const BenchRequest& request, std::function<void(RequestOutput)> done) override;

 private:
  explicit OpenAiBackend(const OpenAiBackendOptions& options) : options_(options) {}
  RequestOutput Run(const BenchRequest& request) const;  // on the request's thread

  const OpenAiBackendOptions options_;  // const after construction

  absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // request threads not yet finished
};

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_OPENAI_BACKEND_H_
