// The router's OpenAI-compatible HTTP front door (router.http_listen):
//   POST /v1/completions, POST /v1/chat/completions (stream or not),
//   GET /v1/models, GET /v1/models/{served name}, GET /health (liveness),
//   GET /ready (readiness);
//   GET /metrics is added by the caller (HandleBehindKeys with
//   common/metrics' handler).
//
// Each generation request is handed from the HTTP loop thread to a small
// fixed pool (WorkQueue, Options::request_threads), where it is parsed
// (openai_protocol.h), a chat without max_tokens rendered and tokenized,
// and then run as a
// gRPC Generate call on the router's own Generation service through an
// in-process channel (grpc::Server::InProcessChannel: no socket, no
// copy of the rules), so HTTP and gRPC clients get the same validation,
// API keys (the Authorization header becomes the call's metadata),
// admission, routing, stop strings and metrics. The call is a client
// callback reactor: no thread per request or stream.
//
// Streams (stream: true) answer 200 with server-sent events once the first
// message arrives or after keepalive_ms, whichever comes first (an error
// before then gets its own HTTP status); then one `data: {json}` event per
// chunk, `data: [DONE]` at the end, `: keep-alive` comments every
// keepalive_ms while nothing else is sent (a client that went away is
// found by the failed write), and an error after the 200 as one
// `data: {"error": ...}` event before the stream ends. A client that goes
// away cancels the gRPC call, which cancels the request on P and D.
//
// Request ids: X-Request-Id in (visible ASCII, <= 128 bytes) becomes
// GenerateRequest.client_request_id (the router logs it with its own
// id); X-Request-Id out is the client's id, or the router's request id.
//
// Owns: the HTTP routes and the HTTP <-> gRPC mapping of one request.
// Does not touch: generation rules (RouterService), JSON shapes
// (openai_protocol), sockets (common/http).
// Threads: the HTTP loop thread (handlers: cheap routes answered there,
// generation requests queued), request_threads workers (parse, tokenize,
// start the call), gRPC callback threads (the reactors), and one
// keep-alive thread for all streams.
#ifndef TANDEM_ROUTER_OPENAI_OPENAI_FRONTEND_H_
#define TANDEM_ROUTER_OPENAI_OPENAI_FRONTEND_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/http/http_server.h"
#include "router/openai/openai_protocol.h"
#include "router/openai/work_queue.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem::router::openai {

class OpenAiFrontend {
 public:
  struct Options {
    ModelLimits limits;              // served model name, context length, vocabulary size
    http::HttpServer::Options http;  // max_streams: also this front end's SSE limit (503)
    int keepalive_ms = 2000;         // SSE comment period while a stream is quiet
    // Threads that parse, render and tokenize generation requests (and
    // start their gRPC calls), so the HTTP loop never does: a 7 MB body
    // takes seconds. More requests wait in their queue, first come first
    // served.
    int request_threads = 2;
  };
  // What the front end needs from the router process.
  struct Router {
    // An in-process channel to the router's Generation service.
    std::shared_ptr<grpc::Channel> channel;
    // A token's bytes (Tokenizer::TokenBytes).
    TokenBytes token_bytes;
    // The prompt ids of a request (RouterService::PromptTokens: its
    // tokenizer and chat template), for chat requests without max_tokens;
    // its errors as the gRPC call would give them.
    std::function<absl::StatusOr<std::vector<int32_t>>(const v1::GenerateRequest&)> prompt_tokens;
    // Readiness: "" when the router accepts requests and the cluster can
    // serve (>= 1 healthy decode worker), else why not ("shutting down",
    // "no healthy decode worker").
    std::function<std::string()> not_ready;
    // API keys: OK or UNAUTHENTICATED for an Authorization header value
    // (nullptr: absent); for routes that make no gRPC call (/v1/models).
    std::function<absl::Status(const std::string* authorization)> authenticate;
    // A generation request this front end refused before any gRPC call
    // (bad JSON, unknown model, ...), with its gRPC-equivalent code, for
    // the router's request counters (RouterMetrics::RequestRefused).
    std::function<void(absl::StatusCode)> refused;
  };

  OpenAiFrontend(Options options, Router router);
  ~OpenAiFrontend();  // Stop()s

  // The HTTP server, to add open routes before Start.
  http::HttpServer& server() { return *server_; }
  // Adds a route behind the API keys, as /v1/models (before Start): with
  // keys configured, a request without a valid `Authorization: Bearer`
  // key gets 401 in OpenAI's shape and `handler` never runs.
  void HandleBehindKeys(const std::string& method, const std::string& path, http::Handler handler);

  // Binds host:port (0: any) and serves. Returns the bound port; errors
  // as http::HttpServer::Start.
  [[nodiscard]] absl::StatusOr<int> Start(const std::string& host, int port);
  // Stops serving: requests still running are cancelled and answered 503
  // "router is shutting down" (an open stream gets it as its error event),
  // then every connection is closed. Call after the router's drain.
  void Stop();

  // Streams open now (for tests and status).
  int open_streams() const { return open_streams_->load(); }

 private:
  class Call;

  // On the loop thread: queues HandleGenerate for a worker (503 once
  // stopping).
  void QueueGenerate(Endpoint endpoint, std::shared_ptr<http::Exchange> exchange);
  // On a worker: parse, validate, tokenize a chat without max_tokens,
  // start the gRPC call.
  void HandleGenerate(Endpoint endpoint, std::shared_ptr<http::Exchange> exchange);
  // GET /v1/models (the list) or, `one`, GET /v1/models/{served name}.
  void HandleModels(std::shared_ptr<http::Exchange> exchange, bool one);
  // OK, or answers 401 (RespondError) and returns false.
  bool Authenticated(http::Exchange& exchange);
  // Answers a generation request refused here (RespondError) and counts it.
  void Refuse(http::Exchange& exchange, const ApiError& error, const std::string& client_id);
  // Refuses with 503 "router is shutting down".
  void RefuseShuttingDown(http::Exchange& exchange, const std::string& client_id);
  void KeepAliveLoop();

  const Options options_;
  const Router router_;
  const int64_t started_s_;  // Unix seconds (GET /v1/models `created`)
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::unique_ptr<http::HttpServer> server_;
  // Shared with calls, which may end after this object: SSE streams open
  // (<= options.http.max_streams) and gRPC calls in flight.
  const std::shared_ptr<std::atomic<int>> open_streams_;
  const std::shared_ptr<std::atomic<int>> calls_;
  std::unique_ptr<WorkQueue> workers_;  // joined by Stop

  absl::Mutex mu_;
  // Every call started (pruned as they end): keep-alives for the streams,
  // and Stop's cancel.
  std::vector<std::weak_ptr<Call>> live_calls_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread keepalive_;
};

}  // namespace tandem::router::openai

#endif  // TANDEM_ROUTER_OPENAI_OPENAI_FRONTEND_H_
