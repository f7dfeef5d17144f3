// HttpServer on libevent's evhttp. See http_server.h; the read deadlines,
// the early 413 and the connections' close callbacks are connection.h's.
//
// Ownership and libevent 2.1 behaviour this file relies on:
//  - Every exchange whose response has not ended is held (shared_ptr) in
//    Core::live, and its Connection tells it when the connection closes
//    (the close callback, which runs when libevent frees the connection:
//    peer EOF or reset, a failed write, a timeout, or evhttp_free in Stop).
//  - When the client goes while the response is unfinished (the user has
//    not called evhttp_send_reply / evhttp_send_reply_end), libevent does
//    not free the request: it detaches it (evhttp_request_get_connection
//    becomes NULL) and leaves it to its user. The close callback frees such
//    a request. A request still attached (evhttp_free in Stop) is freed by
//    libevent right after the close callback.
//  - From the handler call until the response ends, the connection's read
//    callback is removed and EV_READ stays on, so libevent sees the peer's
//    EOF (the same thing evhttp does itself once a reply starts), and the
//    read timeout is off: idle_timeout_s applies between requests, and to
//    a client that reads nothing while output waits (write timeout).
//  - The response ends with evhttp_send_reply / evhttp_send_reply_end;
//    before either, the exchange stops listening for the close (the
//    connection may carry later requests) and the idle timeout is restored.
#include "common/http/http_server.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/http/connection.h"

namespace tandem::http {
namespace {

class ExchangeImpl;

// What the server and its exchanges share. Outlives the HttpServer while
// any exchange holds it, so calls after Stop find `stopped` and do nothing.
struct Core {
  HttpServer::Options options;
  HttpServer::FallbackBody fallback_body;    // fixed before Start
  HttpServer::UnroutedGuard unrouted_guard;  // fixed before Start

  // Loop thread only.
  event_base* base = nullptr;
  evhttp* http = nullptr;
  event* wake = nullptr;
  // Exchanges whose response has not ended.
  std::map<ExchangeImpl*, std::shared_ptr<ExchangeImpl>> live;
  std::unique_ptr<Connections> connections;  // from Start

  absl::Mutex mu;
  std::vector<std::function<void()>> tasks ABSL_GUARDED_BY(mu);
  bool stopped ABSL_GUARDED_BY(mu) = false;  // no more tasks run

  std::atomic<int> open_streams{0};

  // Queues `task` for the loop thread; dropped once the server stopped.
  void Post(std::function<void()> task) {
    absl::MutexLock lock(&mu);
    if (stopped || wake == nullptr) return;
    bool was_empty = tasks.empty();
    tasks.push_back(std::move(task));
    if (was_empty) event_active(wake, EV_READ, 0);
  }
  // Takes a stream slot; false when max_streams are open.
  bool AcquireStream() {
    int n = open_streams.fetch_add(1);
    if (n >= options.max_streams) {
      open_streams.fetch_sub(1);
      return false;
    }
    return true;
  }
  void ReleaseStream() { open_streams.fetch_sub(1); }

  // The Content-Type and body of an answer the server makes itself.
  std::pair<std::string, std::string> Answer(int status, const std::string& path,
                                             const std::string& message) const {
    if (fallback_body) return {"application/json", fallback_body(status, path, message)};
    return {"text/plain; charset=utf-8", absl::StrCat(message, "\n")};
  }
};

class ExchangeImpl : public Exchange,
                     public Connection::Listener,
                     public std::enable_shared_from_this<ExchangeImpl> {
 public:
  ExchangeImpl(std::shared_ptr<Core> core, evhttp_request* req, Connection* connection,
               std::string method, std::string path, std::string body, Headers headers,
               std::string peer)
      : core_(std::move(core)),
        req_(req),
        connection_(connection),
        method_(std::move(method)),
        path_(std::move(path)),
        body_(std::move(body)),
        headers_(std::move(headers)),
        peer_(std::move(peer)) {}

  const std::string& method() const override { return method_; }
  const std::string& path() const override { return path_; }
  const std::string& body() const override { return body_; }
  const std::string& peer() const override { return peer_; }
  std::string header(const std::string& name) const override {
    for (const auto& [n, v] : headers_) {
      if (absl::EqualsIgnoreCase(n, name)) return v;
    }
    return "";
  }

  void Respond(int status, Headers headers, std::string body) override {
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kNew) return;
      phase_ = Phase::kDone;
    }
    auto self = shared_from_this();
    core_->Post([self, status, headers = std::move(headers), body = std::move(body)] {
      self->DoRespond(status, headers, body);
    });
  }

  bool StartStream(int status, Headers headers) override {
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kNew) return false;
      if (!core_->AcquireStream()) return false;
      phase_ = Phase::kStreaming;
    }
    auto self = shared_from_this();
    core_->Post(
        [self, status, headers = std::move(headers)] { self->DoStartStream(status, headers); });
    return true;
  }

  bool Send(std::string chunk) override {
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kStreaming) return false;
    }
    if (chunk.empty()) return true;  // a zero-length chunk would end the body
    auto self = shared_from_this();
    core_->Post([self, chunk = std::move(chunk)] { self->DoSend(chunk); });
    return true;
  }

  void EndStream() override {
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kStreaming) return;
      phase_ = Phase::kDone;
    }
    core_->ReleaseStream();
    auto self = shared_from_this();
    core_->Post([self] { self->DoEndStream(); });
  }

  void OnClose(std::function<void()> cb) override {
    {
      absl::MutexLock lock(&mu_);
      if (phase_ != Phase::kClosed) {
        on_close_ = std::move(cb);
        return;
      }
    }
    if (cb) cb();
  }

  bool open() const override {
    absl::MutexLock lock(&mu_);
    return phase_ == Phase::kNew || phase_ == Phase::kStreaming;
  }

  // --- Loop thread only below. ---

  // Listens for the connection's close, watches for the peer's EOF, turns
  // the read timeout off (see the file comment).
  void Attach() {
    connection_->Handling(this);
    evhttp_connection* evcon = evhttp_request_get_connection(req_);
    bufferevent* bev = evhttp_connection_get_bufferevent(evcon);
    bufferevent_data_cb readcb, writecb;
    bufferevent_event_cb eventcb;
    void* cbarg;
    bufferevent_getcb(bev, &readcb, &writecb, &eventcb, &cbarg);
    bufferevent_setcb(bev, nullptr, writecb, eventcb, cbarg);
    timeval write_tv{core_->options.idle_timeout_s, 0};
    bufferevent_set_timeouts(bev, nullptr, &write_tv);
    bufferevent_enable(bev, EV_READ);
  }

  // The connection closed while this exchange listened.
  void ConnectionClosed() override { Closed(/*request_alive=*/true); }

  // The client went (or the server stops): no more libevent calls; runs
  // on_close if the response had not ended. From the close callback
  // (`request_alive`) a detached request is ours to free; otherwise
  // libevent frees it (or already has).
  void Closed(bool request_alive) {
    if (request_alive && req_ != nullptr && evhttp_request_get_connection(req_) == nullptr) {
      evhttp_request_free(req_);
    }
    req_ = nullptr;
    std::function<void()> cb;
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      if (phase_ == Phase::kNew || phase_ == Phase::kStreaming) {
        release = phase_ == Phase::kStreaming;
        phase_ = Phase::kClosed;
        cb = std::move(on_close_);
      }
    }
    if (release) core_->ReleaseStream();
    auto self = shared_from_this();  // `live` may hold the last reference
    core_->live.erase(this);
    if (cb) cb();
  }

  // After the handler returned: a handler that neither answered nor kept
  // the exchange leaves only `live`'s reference; answer 500.
  void AfterHandler() {
    auto it = core_->live.find(this);
    if (it == core_->live.end() || it->second.use_count() > 1) return;
    Respond(500, {}, "handler kept no reference to the request\n");
  }

 private:
  enum class Phase { kNew, kStreaming, kDone, kClosed };

  static void AddHeaders(evhttp_request* req, const Headers& headers) {
    evkeyvalq* out = evhttp_request_get_output_headers(req);
    for (const auto& [n, v] : headers) {
      evhttp_add_header(out, n.c_str(), v.c_str());  // refuses CR/LF
    }
  }
  static int ValidStatus(int status) { return status >= 100 && status <= 599 ? status : 500; }

  // Stops listening for the close and restores the idle timeout before
  // the response's end hands the request back to libevent.
  void Detach() {
    evhttp_connection* evcon = evhttp_request_get_connection(req_);
    evhttp_connection_set_timeout(evcon, core_->options.idle_timeout_s);
    connection_->Idle();
  }

  void DoRespond(int status, const Headers& headers, const std::string& body) {
    if (req_ == nullptr) return;
    AddHeaders(req_, headers);
    evbuffer* buf = evbuffer_new();
    evbuffer_add(buf, body.data(), body.size());
    Detach();
    evhttp_send_reply(req_, ValidStatus(status), ReasonPhrase(ValidStatus(status)), buf);
    evbuffer_free(buf);
    Finished();
  }
  void DoStartStream(int status, const Headers& headers) {
    if (req_ == nullptr) return;
    AddHeaders(req_, headers);
    evhttp_send_reply_start(req_, ValidStatus(status), ReasonPhrase(ValidStatus(status)));
  }
  void DoSend(const std::string& chunk) {
    if (req_ == nullptr) return;
    evbuffer* buf = evbuffer_new();
    evbuffer_add(buf, chunk.data(), chunk.size());
    evhttp_send_reply_chunk(req_, buf);
    evbuffer_free(buf);
  }
  void DoEndStream() {
    if (req_ == nullptr) return;
    Detach();
    evhttp_send_reply_end(req_);
    Finished();
  }
  // The response ended: libevent owns the request from here.
  void Finished() {
    req_ = nullptr;
    auto self = shared_from_this();
    core_->live.erase(this);
  }

  const std::shared_ptr<Core> core_;
  evhttp_request* req_;           // loop thread; null once ended or closed
  Connection* const connection_;  // alive while req_ is set
  const std::string method_, path_, body_;
  const Headers headers_;
  const std::string peer_;

  mutable absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kNew;
  std::function<void()> on_close_ ABSL_GUARDED_BY(mu_);
};

const char* MethodName(evhttp_cmd_type type) {
  switch (type) {
    case EVHTTP_REQ_GET:
      return "GET";
    case EVHTTP_REQ_POST:
      return "POST";
    case EVHTTP_REQ_HEAD:
      return "HEAD";
    case EVHTTP_REQ_PUT:
      return "PUT";
    case EVHTTP_REQ_DELETE:
      return "DELETE";
    case EVHTTP_REQ_OPTIONS:
      return "OPTIONS";
    case EVHTTP_REQ_TRACE:
      return "TRACE";
    case EVHTTP_REQ_CONNECT:
      return "CONNECT";
    case EVHTTP_REQ_PATCH:
      return "PATCH";
  }
  return "UNKNOWN";
}

std::string PathOf(evhttp_request* req) {
  const evhttp_uri* uri = evhttp_request_get_evhttp_uri(req);
  const char* path = uri != nullptr ? evhttp_uri_get_path(uri) : nullptr;
  if (path == nullptr || *path == '\0') return "/";
  return path;
}

std::string PeerOf(evhttp_request* req) {
  char* address = nullptr;
  ev_uint16_t port = 0;
  evhttp_connection_get_peer(evhttp_request_get_connection(req), &address, &port);
  std::string ip = address != nullptr ? address : "";
  if (ip.find(':') != std::string::npos) ip = absl::StrCat("[", ip, "]");
  return absl::StrCat(ip, ":", port);
}

}  // namespace

struct HttpServer::Impl {
  std::shared_ptr<Core> core = std::make_shared<Core>();
  // path -> method -> handler; fixed before Start.
  std::map<std::string, std::map<std::string, Handler>> routes;
  std::thread loop;
  bool started = false;
  std::once_flag stop_once;

  static void OnRequest(evhttp_request* req, void* arg) { static_cast<Impl*>(arg)->Dispatch(req); }
  static void OnWake(evutil_socket_t, short, void* arg) {
    Core* core = static_cast<Core*>(arg);
    std::vector<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&core->mu);
      tasks.swap(core->tasks);
    }
    for (auto& t : tasks) t();
  }

  void Fallback(evhttp_request* req, int status, const std::string& path, const char* allow) {
    evkeyvalq* out = evhttp_request_get_output_headers(req);
    std::string message =
        absl::StrCat(status == 404 ? "not found: " : "method not allowed: ", path);
    if (core->unrouted_guard) {
      const char* authorization =
          evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
      const std::string header = authorization == nullptr ? "" : authorization;
      if (auto instead = core->unrouted_guard(path, authorization == nullptr ? nullptr : &header)) {
        std::tie(status, message) = *std::move(instead);
        allow = nullptr;
      }
    }
    auto [content_type, body] = core->Answer(status, path, message);
    evhttp_add_header(out, "Content-Type", content_type.c_str());
    if (allow != nullptr) evhttp_add_header(out, "Allow", allow);
    evbuffer* buf = evbuffer_new();
    evbuffer_add(buf, body.data(), body.size());
    evhttp_send_reply(req, status, ReasonPhrase(status), buf);
    evbuffer_free(buf);
  }

  void Dispatch(evhttp_request* req) {
    Connection* connection = core->connections->Find(evhttp_request_get_connection(req));
    if (connection == nullptr) {  // its bufferevent was not ours (out of memory)
      evhttp_send_error(req, 500, nullptr);
      return;
    }
    connection->Handling(nullptr);
    std::string method = MethodName(evhttp_request_get_command(req));
    std::string path = PathOf(req);
    auto route = routes.find(path);
    if (route == routes.end()) {
      bool known_method = method == "GET" || method == "POST";
      Fallback(req, known_method ? 404 : 405, path, known_method ? nullptr : "GET, POST");
      connection->Idle();
      return;
    }
    auto handler = route->second.find(method);
    if (handler == route->second.end()) {
      std::vector<std::string> allowed;
      for (const auto& [m, h] : route->second) allowed.push_back(m);
      Fallback(req, 405, path, absl::StrJoin(allowed, ", ").c_str());
      connection->Idle();
      return;
    }
    Headers headers;
    evkeyvalq* in = evhttp_request_get_input_headers(req);
    for (evkeyval* kv = in->tqh_first; kv != nullptr; kv = kv->next.tqe_next) {
      headers.emplace_back(kv->key, kv->value);
    }
    evbuffer* input = evhttp_request_get_input_buffer(req);
    std::string body(evbuffer_get_length(input), '\0');
    if (!body.empty()) evbuffer_copyout(input, body.data(), body.size());
    std::string peer = PeerOf(req);
    auto ex =
        std::make_shared<ExchangeImpl>(core, req, connection, std::move(method), std::move(path),
                                       std::move(body), std::move(headers), std::move(peer));
    core->live.emplace(ex.get(), ex);
    ex->Attach();
    handler->second(ex);
    ex->AfterHandler();
  }

  // On the loop thread: frees every connection (their exchanges' on_close
  // run), closes what is left, ends the loop.
  void Shutdown() {
    evhttp_free(core->http);
    core->http = nullptr;
    // Left only if libevent skipped a close callback; their requests are
    // freed with the connections.
    while (!core->live.empty()) core->live.begin()->second->Closed(/*request_alive=*/false);
    core->connections->Clear();                // those libevent freed before they were bound
    event_base_loopexit(core->base, nullptr);  // after the callbacks now active
  }
};

HttpServer::HttpServer(Options options) : impl_(std::make_unique<Impl>()) {
  impl_->core->options = options;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(const std::string& method, const std::string& path, Handler handler) {
  impl_->routes[path][method] = std::move(handler);
}

void HttpServer::set_fallback_body(FallbackBody f) { impl_->core->fallback_body = std::move(f); }

void HttpServer::set_unrouted_guard(UnroutedGuard guard) {
  impl_->core->unrouted_guard = std::move(guard);
}

int HttpServer::open_streams() const { return impl_->core->open_streams.load(); }

absl::StatusOr<int> HttpServer::Start(const std::string& host, int port) {
  static std::once_flag process_once;
  std::call_once(process_once, [] {
    evthread_use_pthreads();
    // A write to a closed socket must fail with EPIPE, not kill the process.
    signal(SIGPIPE, SIG_IGN);
  });
  if (impl_->started) return absl::FailedPreconditionError("HttpServer::Start called twice");
  Core& core = *impl_->core;
  const Options& o = core.options;
  if (o.max_body_bytes < 0 || o.max_header_bytes <= 0 || o.max_streams < 0 ||
      o.idle_timeout_s <= 0 || o.read_timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HttpServer options: max_body_bytes ", o.max_body_bytes, ", max_header_bytes ",
        o.max_header_bytes, ", max_streams ", o.max_streams, ", idle_timeout_s ", o.idle_timeout_s,
        ", read_timeout_ms ", o.read_timeout_ms, " (need >= 0, > 0, >= 0, > 0, > 0)"));
  }
  std::string address = absl::StrCat(host, ":", port);
  core.base = event_base_new();
  if (core.base == nullptr) return absl::InternalError("event_base_new failed");
  core.http = evhttp_new(core.base);
  evhttp_set_max_body_size(core.http, o.max_body_bytes);
  evhttp_set_max_headers_size(core.http, o.max_header_bytes);
  evhttp_set_timeout(core.http, o.idle_timeout_s);
  // Every method reaches Dispatch, which answers 405 itself.
  evhttp_set_allowed_methods(core.http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                            EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                            EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
                                            EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
  // A declared body over the limit gets the Connection's 413 first; what
  // evhttp still refuses itself (a body it finds too long: pipelined
  // requests) it reads and drops before answering, so the client sees the
  // answer instead of a reset.
  evhttp_set_flags(core.http, EVHTTP_SERVER_LINGERING_CLOSE);
  evhttp_set_default_content_type(core.http, "text/plain; charset=utf-8");
  evhttp_set_gencb(core.http, &Impl::OnRequest, impl_.get());
  ConnectionOptions connection_options;
  connection_options.max_body_bytes = o.max_body_bytes;
  connection_options.max_header_bytes = o.max_header_bytes;
  connection_options.read_timeout_ms = o.read_timeout_ms;
  connection_options.idle_timeout_s = o.idle_timeout_s;
  connection_options.answer = [core = &core](int status, const std::string& message) {
    return core->Answer(status, "", message);
  };
  core.connections = std::make_unique<Connections>(core.base, std::move(connection_options));
  evhttp_set_bevcb(core.http, &Connections::NewBufferevent, core.connections.get());
  evhttp_bound_socket* bound = evhttp_bind_socket_with_handle(core.http, host.c_str(), port);
  if (bound == nullptr) {
    int err = errno;
    evhttp_free(core.http);
    core.connections.reset();
    event_base_free(core.base);
    core.http = nullptr;
    core.base = nullptr;
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ",
                                               err != 0 ? std::strerror(err) : "bind failed"));
  }
  const evutil_socket_t fd = evhttp_bound_socket_get_fd(bound);
  // evhttp listens with a backlog of 128; a burst of clients (hundreds of
  // streams opening at once) would see dropped SYNs and 1 s retries.
  listen(fd, SOMAXCONN);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  int bound_port = port;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    if (ss.ss_family == AF_INET) {
      bound_port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      bound_port = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    }
  }
  {
    absl::MutexLock lock(&core.mu);
    core.wake = event_new(core.base, -1, 0, &Impl::OnWake, &core);
  }
  impl_->started = true;
  event_base* base = core.base;
  impl_->loop = std::thread([base] { event_base_loop(base, EVLOOP_NO_EXIT_ON_EMPTY); });
  return bound_port;
}

void HttpServer::Stop() {
  if (!impl_->started) return;
  std::call_once(impl_->stop_once, [this] {
    Impl* impl = impl_.get();
    impl->core->Post([impl] { impl->Shutdown(); });
    impl->loop.join();
    Core& core = *impl->core;
    std::vector<std::function<void()>> dropped;
    {
      absl::MutexLock lock(&core.mu);
      core.stopped = true;
      dropped.swap(core.tasks);
      event_free(core.wake);
      core.wake = nullptr;
    }
    dropped.clear();  // may hold the last references to exchanges
    event_base_free(core.base);
    core.base = nullptr;
  });
}

}  // namespace tandem::http
