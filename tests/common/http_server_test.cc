// HttpServer (common/http) against a raw-socket HTTP/1.1 client: whole
// responses and keep-alive, 404/405 fallback bodies, 413 (at once for a
// declared body), 408 read timeouts, chunked streams
// written from other threads, max_streams, client disconnects, idle
// timeouts, hundreds of open streams on one thread, Stop.
#include "common/http/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tandem::http {
namespace {

// One client connection; reads with a 10 s timeout so a bug fails the test
// instead of hanging it.
class Conn {
 public:
  explicit Conn(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Conn() { Close(); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  bool connected() const { return connected_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // Half-closes: a FIN, the socket still reads.
  void ShutdownWrite() { shutdown(fd_, SHUT_WR); }
  // Closes with a reset (RST) instead of a FIN.
  void Reset() {
    linger l{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    Close();
  }
  int local_port() const {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    return ntohs(addr.sin_port);
  }

  bool SendAll(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += n;
    }
    return true;
  }
  bool Request(const std::string& method, const std::string& target, const std::string& body = "",
               const std::string& extra_headers = "") {
    return SendAll(absl::StrCat(method, " ", target, " HTTP/1.1\r\nHost: test\r\n", extra_headers,
                                "Content-Length: ", body.size(), "\r\n\r\n", body));
  }

  struct Response {
    int status = 0;
    std::string reason;  // the status line's reason phrase
    std::map<std::string, std::string> headers;  // lower-case names
    std::string body;
  };
  // Reads the status line and headers.
  bool ReadHead(Response* r) {
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill()) return false;
    }
    std::vector<std::string> lines = absl::StrSplit(buf_.substr(0, end), "\r\n");
    buf_.erase(0, end + 4);
    std::vector<std::string> first = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
    if (first.size() < 2 || !absl::SimpleAtoi(first[1], &r->status)) return false;
    if (first.size() > 2) r->reason = first[2];
    for (size_t i = 1; i < lines.size(); ++i) {
      size_t colon = lines[i].find(':');
      if (colon == std::string::npos) return false;
      r->headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
    return true;
  }
  // Reads one chunk of a chunked body into *data; false at the last
  // (zero-length) chunk or on an error.
  bool ReadChunk(std::string* data, bool* last) {
    size_t eol;
    while ((eol = buf_.find("\r\n")) == std::string::npos) {
      if (!Fill()) return false;
    }
    size_t n = std::stoul(buf_.substr(0, eol), nullptr, 16);
    buf_.erase(0, eol + 2);
    while (buf_.size() < n + 2) {
      if (!Fill()) return false;
    }
    *data = buf_.substr(0, n);
    buf_.erase(0, n + 2);
    *last = n == 0;
    return true;
  }
  // A whole response (Content-Length, chunked, or until EOF).
  bool ReadResponse(Response* r) {
    if (!ReadHead(r)) return false;
    if (r->headers.count("transfer-encoding")) {
      std::string chunk;
      bool last = false;
      while (!last) {
        if (!ReadChunk(&chunk, &last)) return false;
        r->body += chunk;
      }
      return true;
    }
    size_t n = 0;
    if (r->headers.count("content-length")) {
      if (!absl::SimpleAtoi(r->headers["content-length"], &n)) return false;
      while (buf_.size() < n) {
        if (!Fill()) return false;
      }
    } else {
      while (Fill()) {
      }
      n = buf_.size();
    }
    r->body = buf_.substr(0, n);
    buf_.erase(0, n);
    return true;
  }
  // True when the server closed the connection (EOF or reset).
  bool WaitClosed() {
    char c;
    for (;;) {
      ssize_t n = recv(fd_, &c, 1, 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
      if (n < 0) return false;  // timeout
    }
  }

 private:
  bool Fill() {
    char tmp[65536];
    ssize_t n = recv(fd_, tmp, sizeof(tmp), 0);
    if (n <= 0) return false;
    buf_.append(tmp, n);
    return true;
  }
  int fd_ = -1;
  bool connected_ = false;
  std::string buf_;
};

int ThreadCount() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

// Exchanges a handler kept, and how many on_close callbacks ran.
struct Kept {
  absl::Mutex mu;
  std::vector<std::shared_ptr<Exchange>> exchanges ABSL_GUARDED_BY(mu);
  std::vector<bool> started ABSL_GUARDED_BY(mu);
  int closed ABSL_GUARDED_BY(mu) = 0;

  // Keeps `ex`, counting its on_close.
  void Keep(std::shared_ptr<Exchange> ex, bool stream_started) {
    ex->OnClose([this] {
      absl::MutexLock lock(&mu);
      ++closed;
    });
    absl::MutexLock lock(&mu);
    exchanges.push_back(std::move(ex));
    started.push_back(stream_started);
  }
  // Waits (10 s at most) until `n` exchanges are kept.
  bool WaitCount(size_t n) {
    absl::MutexLock lock(&mu);
    target = n;
    return mu.AwaitWithTimeout(absl::Condition(+[](Kept* k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu) {
                                 return k->exchanges.size() >= k->target;
                               }, this),
                               absl::Seconds(10));
  }
  // Waits (10 s at most) until `n` on_close callbacks ran.
  bool WaitClosed(int n) {
    absl::MutexLock lock(&mu);
    closed_target = n;
    return mu.AwaitWithTimeout(absl::Condition(+[](Kept* k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu) {
                                 return k->closed >= k->closed_target;
                               }, this),
                               absl::Seconds(10));
  }
  std::shared_ptr<Exchange> at(size_t i) {
    absl::MutexLock lock(&mu);
    return exchanges.at(i);
  }
  size_t target ABSL_GUARDED_BY(mu) = 0;
  int closed_target ABSL_GUARDED_BY(mu) = 0;
};

// A server with /hello (GET), /echo (POST) and /stream (GET: a stream kept
// in `kept`; 503 when StartStream refuses).
class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(HttpServer::Options options = {}) {
    server_ = std::make_unique<HttpServer>(options);
    server_->Handle("GET", "/hello", [](std::shared_ptr<Exchange> ex) {
      ex->Respond(200, {{"X-Reply", "yes"}, {"Content-Type", "text/plain"}},
                  absl::StrCat(ex->method(), " ", ex->path(), " custom=", ex->header("x-CUSTOM"),
                               " missing=", ex->header("X-Missing"), " peer=", ex->peer()));
    });
    server_->Handle("POST", "/echo", [](std::shared_ptr<Exchange> ex) {
      ex->Respond(201, {}, ex->body());
    });
    server_->Handle("GET", "/limited", [](std::shared_ptr<Exchange> ex) {
      ex->Respond(429, {}, "slow down");
    });
    server_->Handle("GET", "/stream", [this](std::shared_ptr<Exchange> ex) {
      bool ok = ex->StartStream(200, {{"Content-Type", "text/event-stream"}});
      if (!ok) ex->Respond(503, {}, "busy");
      kept_.Keep(ex, ok);
    });
    auto port = server_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
    ASSERT_GT(port_, 0);
  }
  bool WaitKept(size_t n) { return kept_.WaitCount(n); }

  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  Kept kept_;
};

TEST_F(HttpServerTest, RespondsWithHeadersAndBodyAndKeepsTheConnection) {
  StartServer();
  Conn c(port_);
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Request("GET", "/hello?x=1&y=2", "", "X-Custom: abc\r\n"));
  Conn::Response r;
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["x-reply"], "yes");
  EXPECT_EQ(r.headers["content-type"], "text/plain");
  EXPECT_EQ(r.body, absl::StrCat("GET /hello custom=abc missing= peer=127.0.0.1:", c.local_port()));
  EXPECT_EQ(r.headers["content-length"], absl::StrCat(r.body.size()));

  // The same connection carries the next requests.
  std::string body(100000, 'b');
  body[7] = '\0';
  ASSERT_TRUE(c.Request("POST", "/echo", body));
  Conn::Response r2;
  ASSERT_TRUE(c.ReadResponse(&r2));
  EXPECT_EQ(r2.status, 201);
  EXPECT_EQ(r2.body, body);
  ASSERT_TRUE(c.Request("GET", "/hello"));
  Conn::Response r3;
  ASSERT_TRUE(c.ReadResponse(&r3));
  EXPECT_EQ(r3.status, 200);
}

TEST_F(HttpServerTest, UnknownPathIs404AndWrongMethodIs405WithTheFallbackBody) {
  server_ = std::make_unique<HttpServer>(HttpServer::Options{});
  server_->Handle("POST", "/v1/x", [](std::shared_ptr<Exchange> ex) { ex->Respond(200, {}, ""); });
  server_->set_fallback_body([](int status, const std::string& path, const std::string&) {
    return absl::StrCat("{\"status\":", status, ",\"path\":\"", path, "\"}");
  });
  auto port = server_->Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  Conn c(*port);
  struct Case {
    std::string method, target;
    int status;
    std::string body, allow;
  };
  for (const Case& k : std::vector<Case>{
           {"GET", "/nope?q=1", 404, R"({"status":404,"path":"/nope"})", ""},
           {"POST", "/nope", 404, R"({"status":404,"path":"/nope"})", ""},
           {"GET", "/v1/x", 405, R"({"status":405,"path":"/v1/x"})", "POST"},
           {"PUT", "/v1/x", 405, R"({"status":405,"path":"/v1/x"})", "POST"},
           {"DELETE", "/elsewhere", 405, R"({"status":405,"path":"/elsewhere"})", "GET, POST"},
       }) {
    SCOPED_TRACE(k.method + " " + k.target);
    ASSERT_TRUE(c.Request(k.method, k.target));
    Conn::Response r;
    ASSERT_TRUE(c.ReadResponse(&r));
    EXPECT_EQ(r.status, k.status);
    EXPECT_EQ(r.body, k.body);
    EXPECT_EQ(r.headers["content-type"], "application/json");
    EXPECT_EQ(r.headers.count("allow") ? r.headers["allow"] : "", k.allow);
  }
}

TEST_F(HttpServerTest, FallbackWithoutABodyFunctionIsPlainText) {
  StartServer();
  Conn c(port_);
  ASSERT_TRUE(c.Request("GET", "/missing"));
  Conn::Response r;
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, "not found: /missing\n");
  EXPECT_EQ(r.headers["content-type"], "text/plain; charset=utf-8");
}

TEST_F(HttpServerTest, BodyOverTheLimitIs413WithoutReachingTheHandler) {
  HttpServer::Options o;
  o.max_body_bytes = 1024;
  StartServer(o);
  {
    Conn c(port_);
    ASSERT_TRUE(c.Request("POST", "/echo", std::string(1024, 'a')));  // at the limit: fine
    Conn::Response r;
    ASSERT_TRUE(c.ReadResponse(&r));
    EXPECT_EQ(r.status, 201);
    EXPECT_EQ(r.body.size(), 1024u);
  }
  Conn c(port_);
  std::string big(10 << 20, 'x');
  ASSERT_TRUE(c.Request("POST", "/echo", big));
  Conn::Response r;
  ASSERT_TRUE(c.ReadHead(&r));
  EXPECT_EQ(r.status, 413);
  EXPECT_TRUE(c.WaitClosed());
}

// Issue #32: a declared body over the limit is answered before any of it
// is read; the connection closes within the read timeout (the client never
// sends the body).
TEST_F(HttpServerTest, DeclaredBodyOverTheLimitIs413AtOnceAndClosesWithinTheReadTimeout) {
  HttpServer::Options o;
  o.max_body_bytes = 1024;
  o.read_timeout_ms = 300;
  StartServer(o);
  Conn c(port_);
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(c.SendAll("POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 9999999999\r\n\r\n"));
  Conn::Response r;
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 413);  // not the 408 the read timeout would give
  EXPECT_EQ(r.headers["connection"], "close");
  EXPECT_EQ(r.body, "request body of 9999999999 bytes is over the limit of 1024 bytes\n");
  EXPECT_TRUE(c.WaitClosed());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  // A Content-Length too large for 64 bits, and the limit + 1.
  for (const char* length : {"99999999999999999999999", "1025"}) {
    Conn d(port_);
    ASSERT_TRUE(d.SendAll(absl::StrCat("PUT /echo HTTP/1.1\r\nContent-Length:  ", length,
                                       " \r\n\r\n")));
    Conn::Response rd;
    ASSERT_TRUE(d.ReadHead(&rd));
    EXPECT_EQ(rd.status, 413) << length;
    EXPECT_TRUE(d.WaitClosed());
  }
}

// Issue #32: two Content-Length headers that disagree make the framing
// invalid (RFC 9112 section 6.3): 400 and the connection closed, never the
// rest read as another request (request smuggling).
TEST_F(HttpServerTest, ConflictingContentLengthsAre400AndClose) {
  StartServer();
  Conn c(port_);
  ASSERT_TRUE(c.SendAll("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                        "Content-Length: 66\r\n\r\n{}GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
  Conn::Response r;
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.reason, "Bad Request");
  EXPECT_EQ(r.body, "conflicting Content-Length headers\n");
  EXPECT_TRUE(c.WaitClosed());  // no second response
  // Equal repeats are one length.
  Conn d(port_);
  ASSERT_TRUE(d.SendAll("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                        "Content-Length: 2\r\n\r\n{}"));
  ASSERT_TRUE(d.ReadResponse(&r));
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(r.body, "{}");
}

// The 413 for a declared body over the limit ends the server's half of the
// connection as soon as it is written: the client sees the close at once,
// not after the read timeout.
TEST_F(HttpServerTest, DeclaredBodyOverTheLimitClosesOnceAnswered) {
  HttpServer::Options o;
  o.max_body_bytes = 1024;
  o.read_timeout_ms = 20000;
  StartServer(o);
  Conn c(port_);
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(c.SendAll("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n"));
  Conn::Response r;
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.reason, "Content Too Large");
  EXPECT_TRUE(c.WaitClosed());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

// libevent 2.1 has no phrase for 429 ("Client Error"): every answer names
// its own.
TEST_F(HttpServerTest, ReasonPhrasesAreTheStatusNames) {
  StartServer();
  Conn c(port_);
  ASSERT_TRUE(c.Request("GET", "/limited", ""));
  Conn::Response r;
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.reason, "Too Many Requests");
  ASSERT_TRUE(c.Request("GET", "/nowhere", ""));
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.reason, "Not Found");
}

// The unrouted guard answers instead of the server's own 404/405 (with
// the request's Authorization header): what the router uses to refuse a
// client without an API key before telling it a path or model is unknown.
TEST(HttpServerGuardTest, UnroutedGuardAnswersInsteadOf404And405) {
  HttpServer server{HttpServer::Options{}};
  server.Handle("GET", "/known", [](std::shared_ptr<Exchange> ex) { ex->Respond(200, {}, "ok"); });
  server.set_unrouted_guard([](const std::string& path, const std::string* authorization)
                                -> std::optional<std::pair<int, std::string>> {
    if (authorization != nullptr && *authorization == "Bearer good") return std::nullopt;
    return std::make_pair(401, absl::StrCat("no key for ", path));
  });
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  Conn c(*port);
  Conn::Response r;
  ASSERT_TRUE(c.Request("GET", "/unknown", ""));
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.body, "no key for /unknown\n");
  ASSERT_TRUE(c.Request("POST", "/known", "x"));  // a known path, another method
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.headers.count("allow"), 0u);
  ASSERT_TRUE(c.SendAll("GET /unknown HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer good\r\n\r\n"));
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 404);
  ASSERT_TRUE(c.Request("GET", "/known", ""));
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 200);  // routed requests never reach the guard
}

// A client that sends its too-large body and half-closes still reads the
// 413 (the server does not close before the answer is written).
TEST_F(HttpServerTest, DeclaredBodyOverTheLimitIs413EvenAfterTheClientHalfCloses) {
  HttpServer::Options o;
  o.max_body_bytes = 1024;
  o.read_timeout_ms = 300;
  StartServer(o);
  Conn c(port_);
  ASSERT_TRUE(c.Request("POST", "/echo", std::string(4096, 'b')));
  c.ShutdownWrite();
  Conn::Response r;
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 413);
  EXPECT_TRUE(c.WaitClosed());
}

// Issue #32: headers that never finish (here: a byte every 50 ms, which an
// inactivity timeout would never catch) get 408 and the connection closes.
TEST_F(HttpServerTest, HeadersNotCompleteWithinTheReadTimeoutAre408) {
  HttpServer::Options o;
  o.read_timeout_ms = 300;
  StartServer(o);
  Conn c(port_);
  const absl::Time t0 = absl::Now();
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    const std::string head = "GET /hello HTTP/1.1\r\nHost: test\r\nX-Slow: " + std::string(200, 'x');
    for (size_t i = 0; i < head.size() && !stop.load(); ++i) {
      if (!c.SendAll(head.substr(i, 1))) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  Conn::Response r;
  const bool read = c.ReadResponse(&r);
  stop = true;
  trickle.join();
  ASSERT_TRUE(read);
  const absl::Duration took = absl::Now() - t0;
  EXPECT_EQ(r.status, 408);
  EXPECT_EQ(r.body, "request headers incomplete after 300 ms\n");
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_TRUE(c.WaitClosed());
}

// Issue #32: the body has its own read_timeout_ms from the end of the
// headers; late: 408, closed.
TEST_F(HttpServerTest, BodyNotCompleteWithinTheReadTimeoutIs408) {
  HttpServer::Options o;
  o.read_timeout_ms = 300;
  StartServer(o);
  Conn c(port_);
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(c.SendAll("POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n0123456789"));
  Conn::Response r;
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 408);
  EXPECT_EQ(r.body, "request body incomplete after 300 ms\n");
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  EXPECT_TRUE(c.WaitClosed());
}

// The read timeout counts the arrival of a request only: a body sent in
// pieces within it, a keep-alive connection quiet between requests, and a
// handler or stream slower than it are all fine.
TEST_F(HttpServerTest, ReadTimeoutSparesTimelyPiecesIdleConnectionsAndSlowResponses) {
  HttpServer::Options o;
  o.read_timeout_ms = 300;
  StartServer(o);
  Conn c(port_);
  ASSERT_TRUE(c.SendAll("POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 6\r\n"));
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(c.SendAll("\r\nab"));
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(c.SendAll("cdef"));
  Conn::Response r;
  ASSERT_TRUE(c.ReadResponse(&r));
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(r.body, "abcdef");
  absl::SleepFor(absl::Milliseconds(700));  // idle between requests
  ASSERT_TRUE(c.Request("GET", "/stream"));
  ASSERT_TRUE(WaitKept(1));
  absl::SleepFor(absl::Milliseconds(700));  // a quiet stream
  std::shared_ptr<Exchange> ex = kept_.at(0);
  ASSERT_TRUE(ex->Send("late but fine"));
  ex->EndStream();
  Conn::Response rs;
  ASSERT_TRUE(c.ReadResponse(&rs));
  EXPECT_EQ(rs.status, 200);
  EXPECT_EQ(rs.body, "late but fine");
  ASSERT_TRUE(c.Request("GET", "/hello"));  // the connection still serves
  Conn::Response rh;
  ASSERT_TRUE(c.ReadResponse(&rh));
  EXPECT_EQ(rh.status, 200);
}

TEST_F(HttpServerTest, HeadersOverTheLimitAreRefused) {
  HttpServer::Options o;
  o.max_header_bytes = 1024;
  StartServer(o);
  Conn c(port_);
  std::string big_header = absl::StrCat("X-Big: ", std::string(2048, 'h'), "\r\n");
  ASSERT_TRUE(c.Request("GET", "/hello", "", big_header));
  Conn::Response r;
  ASSERT_TRUE(c.ReadHead(&r));
  EXPECT_EQ(r.status, 400);  // libevent 2.1's answer
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(HttpServerTest, StreamWrittenFromAnotherThreadArrivesInOrderAndEnds) {
  StartServer();
  Conn c(port_);
  ASSERT_TRUE(c.Request("GET", "/stream"));
  ASSERT_TRUE(WaitKept(1));
  std::shared_ptr<Exchange> ex = kept_.at(0);
  EXPECT_EQ(server_->open_streams(), 1);
  std::thread producer([ex] {
    for (int i = 0; i < 1000; ++i) ASSERT_TRUE(ex->Send(absl::StrCat("data: ", i, "\n\n")));
    EXPECT_TRUE(ex->Send(""));  // nothing sent: an empty chunk would end the body
    ex->EndStream();
  });
  Conn::Response r;
  ASSERT_TRUE(c.ReadResponse(&r));
  producer.join();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "text/event-stream");
  EXPECT_EQ(r.headers["transfer-encoding"], "chunked");
  std::string want;
  for (int i = 0; i < 1000; ++i) absl::StrAppend(&want, "data: ", i, "\n\n");
  EXPECT_EQ(r.body, want);
  EXPECT_EQ(server_->open_streams(), 0);
  EXPECT_FALSE(ex->open());
  EXPECT_FALSE(ex->Send("late"));
  EXPECT_FALSE(ex->StartStream(200, {}));

  // The connection carries the next request; the ended stream's on_close
  // never runs.
  ASSERT_TRUE(c.Request("GET", "/hello"));
  Conn::Response r2;
  ASSERT_TRUE(c.ReadResponse(&r2));
  EXPECT_EQ(r2.status, 200);
  absl::MutexLock lock(&kept_.mu);
  EXPECT_EQ(kept_.closed, 0);
}

TEST_F(HttpServerTest, MaxStreamsRefusesTheNextStreamUntilOneEnds) {
  HttpServer::Options o;
  o.max_streams = 2;
  StartServer(o);
  Conn a(port_), b(port_), c(port_);
  ASSERT_TRUE(a.Request("GET", "/stream"));
  ASSERT_TRUE(WaitKept(1));
  ASSERT_TRUE(b.Request("GET", "/stream"));
  ASSERT_TRUE(WaitKept(2));
  ASSERT_TRUE(c.Request("GET", "/stream"));
  ASSERT_TRUE(WaitKept(3));
  Conn::Response rc;
  ASSERT_TRUE(c.ReadResponse(&rc));
  EXPECT_EQ(rc.status, 503);
  EXPECT_EQ(rc.body, "busy");
  {
    absl::MutexLock lock(&kept_.mu);
    EXPECT_EQ(kept_.started, (std::vector<bool>{true, true, false}));
  }
  EXPECT_EQ(server_->open_streams(), 2);

  kept_.at(0)->EndStream();
  EXPECT_EQ(server_->open_streams(), 1);
  Conn::Response ra;
  ASSERT_TRUE(a.ReadResponse(&ra));
  EXPECT_EQ(ra.status, 200);
  ASSERT_TRUE(c.Request("GET", "/stream"));
  ASSERT_TRUE(WaitKept(4));
  {
    absl::MutexLock lock(&kept_.mu);
    EXPECT_TRUE(kept_.started[3]);
  }
  EXPECT_EQ(server_->open_streams(), 2);
}

TEST_F(HttpServerTest, ClientGoneMidStreamRunsOnCloseOnceAndSendFails) {
  StartServer();
  Conn c(port_);
  ASSERT_TRUE(c.Request("GET", "/stream"));
  ASSERT_TRUE(WaitKept(1));
  std::shared_ptr<Exchange> ex = kept_.at(0);
  ASSERT_TRUE(ex->Send("data: first\n\n"));
  Conn::Response r;
  ASSERT_TRUE(c.ReadHead(&r));
  EXPECT_EQ(r.status, 200);
  c.Close();
  ASSERT_TRUE(kept_.WaitClosed(1));  // seen as EOF, without a write
  EXPECT_FALSE(ex->open());
  EXPECT_FALSE(ex->Send("data: late\n\n"));
  ex->EndStream();  // a no-op
  EXPECT_EQ(server_->open_streams(), 0);
  int late = 0;
  ex->OnClose([&late] { ++late; });  // already gone: runs at once
  EXPECT_EQ(late, 1);
  absl::MutexLock lock(&kept_.mu);
  EXPECT_EQ(kept_.closed, 1);
}

TEST_F(HttpServerTest, ClientGoneBeforeTheResponseRunsOnClose) {
  std::shared_ptr<Exchange> held;
  absl::Mutex mu;
  bool closed = false;
  server_ = std::make_unique<HttpServer>(HttpServer::Options{});
  server_->Handle("POST", "/slow", [&](std::shared_ptr<Exchange> ex) {
    ex->OnClose([&] {
      absl::MutexLock lock(&mu);
      closed = true;
    });
    absl::MutexLock lock(&mu);
    held = ex;
  });
  auto port = server_->Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  Conn c(*port);
  ASSERT_TRUE(c.Request("POST", "/slow", "{}"));
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(+[](std::shared_ptr<Exchange>* h) {
                                      return *h != nullptr;
                                    }, &held),
                                    absl::Seconds(10)));
  }
  c.Close();
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&closed), absl::Seconds(10)));
  EXPECT_FALSE(held->open());
  held->Respond(200, {}, "too late");  // a no-op
  server_->Stop();
}

TEST_F(HttpServerTest, ClientResetMidStreamRunsOnClose) {
  StartServer();
  Conn c(port_);
  ASSERT_TRUE(c.Request("GET", "/stream"));
  ASSERT_TRUE(WaitKept(1));
  std::shared_ptr<Exchange> ex = kept_.at(0);
  c.Reset();
  // Writes after the reset fail (EPIPE, not SIGPIPE) if the read side has
  // not noticed first; either way the exchange closes once.
  for (int i = 0; i < 100 && ex->Send(std::string(4096, 'z')); ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(kept_.WaitClosed(1));
  EXPECT_FALSE(ex->Send("more"));
  EXPECT_EQ(server_->open_streams(), 0);
  absl::MutexLock lock(&kept_.mu);
  EXPECT_EQ(kept_.closed, 1);
}

TEST_F(HttpServerTest, FiveHundredOpenStreamsShareTheLoopThread) {
  StartServer();
  const int threads_before = ThreadCount();
  constexpr int kStreams = 500;
  std::vector<std::unique_ptr<Conn>> conns;
  for (int i = 0; i < kStreams; ++i) {
    conns.push_back(std::make_unique<Conn>(port_));
    ASSERT_TRUE(conns.back()->connected());
    ASSERT_TRUE(conns.back()->Request("GET", "/stream"));
  }
  ASSERT_TRUE(WaitKept(kStreams));
  EXPECT_EQ(server_->open_streams(), kStreams);
  EXPECT_EQ(ThreadCount(), threads_before);
  for (int i = 0; i < kStreams; ++i) ASSERT_TRUE(kept_.at(i)->Send(absl::StrCat("to ", i)));
  // Each client gets its own chunk (exchanges are kept in arrival order,
  // not connection order, so match by content).
  std::multiset<std::string> got, want;
  for (int i = 0; i < kStreams; ++i) {
    Conn::Response r;
    ASSERT_TRUE(conns[i]->ReadHead(&r));
    std::string chunk;
    bool last;
    ASSERT_TRUE(conns[i]->ReadChunk(&chunk, &last));
    got.insert(chunk);
    want.insert(absl::StrCat("to ", i));
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(ThreadCount(), threads_before);
  server_->Stop();
  ASSERT_TRUE(kept_.WaitClosed(kStreams));
  EXPECT_EQ(server_->open_streams(), 0);
}

TEST_F(HttpServerTest, StopClosesOpenStreamsAndCallsAfterItAreNoOps) {
  StartServer();
  Conn a(port_), b(port_);
  ASSERT_TRUE(a.Request("GET", "/stream"));
  ASSERT_TRUE(b.Request("GET", "/stream"));
  ASSERT_TRUE(WaitKept(2));
  std::shared_ptr<Exchange> ex = kept_.at(0);
  ASSERT_TRUE(ex->Send("x"));
  server_->Stop();
  {
    absl::MutexLock lock(&kept_.mu);
    EXPECT_EQ(kept_.closed, 2);  // ran before Stop returned
  }
  EXPECT_TRUE(a.WaitClosed());
  EXPECT_TRUE(b.WaitClosed());
  EXPECT_FALSE(ex->Send("y"));
  ex->EndStream();
  server_->Stop();  // idempotent
  server_.reset();  // the exchange outlives the server
  EXPECT_FALSE(ex->Send("z"));
  EXPECT_FALSE(ex->open());
  EXPECT_EQ(ex->path(), "/stream");
}

TEST_F(HttpServerTest, IdleConnectionsTimeOutButQuietStreamsDoNot) {
  HttpServer::Options o;
  o.idle_timeout_s = 1;
  StartServer(o);
  Conn idle(port_);
  Conn s(port_);
  ASSERT_TRUE(s.Request("GET", "/stream"));
  ASSERT_TRUE(WaitKept(1));
  const absl::Time t0 = absl::Now();
  EXPECT_TRUE(idle.WaitClosed());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  absl::SleepFor(absl::Milliseconds(1500));  // longer than the timeout, quiet
  std::shared_ptr<Exchange> ex = kept_.at(0);
  EXPECT_TRUE(ex->open());
  ASSERT_TRUE(ex->Send("still here"));
  ex->EndStream();
  Conn::Response r;
  ASSERT_TRUE(s.ReadResponse(&r));
  EXPECT_EQ(r.body, "still here");
}

TEST(HttpServerOptionsTest, NonPositiveReadTimeoutIsInvalid) {
  HttpServer::Options o;
  o.read_timeout_ms = 0;
  HttpServer server(o);
  auto port = server.Start("127.0.0.1", 0);
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(port.status().message().find("read_timeout_ms 0"), std::string::npos)
      << port.status();
}

TEST_F(HttpServerTest, StartOnAUsedPortIsUnavailableNamingTheAddress) {
  StartServer();
  HttpServer other(HttpServer::Options{});
  auto port = other.Start("127.0.0.1", port_);
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(port.status().message().find(absl::StrCat("127.0.0.1:", port_)), std::string::npos)
      << port.status();
}

}  // namespace
}  // namespace tandem::http
