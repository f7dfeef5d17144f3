// An HTTP/1.1 server on libevent's evhttp: one event-loop thread serves
// every connection, so an open stream (server-sent events) holds a socket
// and a little memory, never a thread.
//
// Handlers run on the loop thread and must not block. A handler answers at
// once (Exchange::Respond) or keeps the Exchange (a shared_ptr) and answers
// later from any thread: Respond, or StartStream + Send... + EndStream for a
// chunked body. Calls from other threads are queued to the loop thread
// (event_active on a wake-up event); they never block on the network. Once
// the client has gone (connection closed, a write failed) every call is a
// no-op and the exchange's on_close callback runs once, on the loop thread.
//
// Limits (Options), none of which a handler sees: a request whose
// Content-Length is over max_body_bytes is answered 413 as soon as its
// headers are in, before any body byte is read (a chunked body growing
// over it gets libevent's own 413); headers over max_header_bytes 400; a
// request whose headers, or then whose body, take longer than
// read_timeout_ms to arrive 408. Those answers close the connection. More
// than max_streams open streams -> StartStream fails and the caller
// answers 503 (see Exchange::StartStream).
//
// Owns: sockets, HTTP parsing and framing. Does not touch: what the paths
// mean (router/openai, common/metrics register handlers).
// Threads: one loop thread (Start .. Stop), plus callers of Exchange.
#ifndef TANDEM_COMMON_HTTP_HTTP_SERVER_H_
#define TANDEM_COMMON_HTTP_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::http {

// (name, value) pairs; names as sent (compare case-insensitively).
using Headers = std::vector<std::pair<std::string, std::string>>;

// One request and its response. Thread-safe; see the file comment.
class Exchange {
 public:
  virtual ~Exchange() = default;

  // The request, fixed when the handler is called.
  virtual const std::string& method() const = 0;  // "GET", "POST", ...
  virtual const std::string& path() const = 0;    // without the query, e.g. "/v1/models"
  virtual const std::string& body() const = 0;    // bytes as received
  // The first header named `name` (case-insensitive), or "" when absent.
  virtual std::string header(const std::string& name) const = 0;
  virtual const std::string& peer() const = 0;  // "ip:port" of the client

  // A whole response with Content-Length. `status`: 100..599.
  virtual void Respond(int status, Headers headers, std::string body) = 0;

  // Starts a chunked response (Transfer-Encoding: chunked) with `status`.
  // Returns false, sending nothing, when the server already holds
  // Options::max_streams open streams (the caller answers 503 with
  // Respond) or the client has gone.
  virtual bool StartStream(int status, Headers headers) = 0;
  // One chunk of a started stream (e.g. an SSE event "data: ...\n\n").
  // False once the client has gone. Queued bytes are bounded by the
  // client's reading speed only: producers bound what they write.
  virtual bool Send(std::string chunk) = 0;
  // Ends a started stream (the terminating zero-length chunk).
  virtual void EndStream() = 0;

  // Runs `cb` once on the loop thread when the client goes away before the
  // response ended (closed connection, failed write); at once (on the
  // caller's thread) if it already has. Set at most once.
  virtual void OnClose(std::function<void()> cb) = 0;
  // False once the client has gone or the response ended.
  virtual bool open() const = 0;
};

// Called on the loop thread for a request whose (method, path) matched.
// A handler that neither answers nor keeps the Exchange gets a 500.
using Handler = std::function<void(std::shared_ptr<Exchange>)>;

class HttpServer {
 public:
  struct Options {
    int64_t max_body_bytes = 8 << 20;  // larger bodies: 413
    int64_t max_header_bytes = 64 << 10;
    int max_streams = 1024;  // open chunked responses at once
    // An idle keep-alive connection (no request in progress) is closed;
    // while a handler holds a request only a client that reads nothing
    // while output waits is (a quiet stream is not idle).
    int idle_timeout_s = 120;
    // From a request's first byte its headers must be complete within
    // this many milliseconds, and from then its body within as many
    // again; late: 408 and the connection closes. A connection that sends
    // nothing is idle (idle_timeout_s).
    int read_timeout_ms = 30000;
  };

  explicit HttpServer(Options options);
  ~HttpServer();  // Stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Registers a handler for exact `method` and `path` (before Start).
  void Handle(const std::string& method, const std::string& path, Handler handler);
  // The body of the answers the server makes itself: 404 (unknown path),
  // 405 (a known path, another method), 408 and 413 (Options). `path` is
  // the request's ("" when its headers never arrived); `message` says
  // what happened ("not found: /x", "method not allowed: /x", "request
  // headers incomplete after 30000 ms", "request body of N bytes is over
  // the limit of M bytes"). Set (before Start): the answer is
  // application/json with f's result (JSON error shapes); unset: plain
  // text, `message` and a newline.
  using FallbackBody =
      std::function<std::string(int status, const std::string& path, const std::string& message)>;
  void set_fallback_body(FallbackBody f);
  // Asked before the server answers 404 or 405 itself, with the request's
  // path and Authorization header (nullptr when absent): a {status,
  // message} to answer instead (e.g. 401 when API keys are required, so an
  // unknown path tells a client without a key nothing), or nullopt for the
  // 404/405. The answer's body is the fallback body's. Set before Start;
  // runs on the loop thread.
  using UnroutedGuard = std::function<std::optional<std::pair<int, std::string>>(
      const std::string& path, const std::string* authorization)>;
  void set_unrouted_guard(UnroutedGuard guard);

  // Binds host:port (port 0: any) and starts the loop thread. Returns the
  // bound port. Errors: UNAVAILABLE naming the address when it cannot bind;
  // INVALID_ARGUMENT for negative limits, idle_timeout_s <= 0 or
  // read_timeout_ms <= 0.
  // Once per process: evthread_use_pthreads() and SIGPIPE ignored.
  [[nodiscard]] absl::StatusOr<int> Start(const std::string& host, int port);
  // Closes the listener and every connection (on_close runs for open
  // exchanges), joins the loop thread. Idempotent. Not from a handler.
  void Stop();

  // Open chunked responses now (<= Options::max_streams).
  int open_streams() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_HTTP_SERVER_H_
