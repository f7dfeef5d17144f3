// HttpServer's per-connection state on top of evhttp (internal to
// tandem_http): the read deadlines of the request arriving on a connection,
// the 413 for a declared body over the limit before any of it is read, and
// the connection's close callback.
//
// evhttp 2.1 offers no hook between "bytes arrived" and "whole request
// read", so a Connection watches the bytes itself: it creates the
// connection's bufferevent (evhttp_set_bevcb) and registers a callback on
// its input buffer, which libevent runs as bytes are appended, before
// evhttp parses them. RequestHead finds where the head ends in them.
// Deadlines: the head must be complete read_timeout_ms after its first
// byte, the body read_timeout_ms after the head; late, the Connection
// answers 408 itself. A head declaring a body over max_body_bytes gets 413
// at once. Either answer takes the bufferevent over from evhttp (its
// callbacks replaced, so evhttp reads nothing more), reads and drops the
// rest of a declared body (bounded by read_timeout_ms) so the client sees
// the answer instead of a reset, and frees the connection through
// evhttp_connection_free.
//
// libevent 2.1 behaviour relied on (checked by tests/common/http_server_test):
//  - evhttp sets the bufferevent's callbacks with the evhttp_connection as
//    their argument before any byte is read: that is how a Connection finds
//    its evhttp_connection (bound at the first input, or at a zero-delay
//    timer right after accept, whichever comes first).
//  - bufferevent_free clears the callbacks; a Connection holds a reference
//    (bufferevent_incref) so it can see that a connection freed before it
//    was bound is gone.
//  - evhttp_connection_free runs the close callback of every server
//    connection (they are all in a connected state).
//
// Threads: the HTTP loop thread only.
#ifndef TANDEM_COMMON_HTTP_CONNECTION_H_
#define TANDEM_COMMON_HTTP_CONNECTION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "common/http/request_head.h"

struct bufferevent;
struct evbuffer;
struct evbuffer_cb_entry;
struct evbuffer_cb_info;
struct event;
struct event_base;
struct evhttp_connection;

namespace tandem::http {

// The reason phrase of an HTTP status (RFC 9110 section 15): libevent 2.1
// knows none for 429 ("Client Error"), so every answer names its own.
const char* ReasonPhrase(int status);

class Connections;

class Connection {
 public:
  // Whoever answers the connection's current request (HttpServer's
  // exchange): told once if the connection closes before it is done.
  class Listener {
   public:
    virtual ~Listener() = default;
    virtual void ConnectionClosed() = 0;
  };

  Connection(Connections* owner, bufferevent* bev);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // The request was read whole and is being answered: no read deadline
  // until Idle. `listener` (may be null) hears of a close.
  void Handling(Listener* listener);
  // The response ended; the connection may carry the next request. Bytes
  // of it already here start its head deadline (a pipelined request over
  // the body limit is left to evhttp: its 413 after the body, or 408).
  void Idle();

 private:
  friend class Connections;
  enum class Phase { kIdle, kHead, kBody, kHandling, kRefusing };

  static void OnInput(evbuffer* buffer, const evbuffer_cb_info* info, void* arg);
  static void OnTimer(int fd, short what, void* arg);
  static void OnClose(evhttp_connection* evcon, void* arg);
  static void OnRefusalRead(bufferevent* bev, void* arg);
  static void OnRefusalWritten(bufferevent* bev, void* arg);
  static void OnRefusalEvent(bufferevent* bev, short what, void* arg);

  // Finds the evhttp_connection and sets its close callback; false when
  // libevent already freed the connection.
  bool Bind();
  // A request's first bytes are here: head deadline, scan from `from`.
  void StartHead(size_t from, bool may_refuse);
  // Feeds the input bytes from offset `from` on to head_; once the head
  // is complete: 413 (if `may_refuse` and the declared body is too large)
  // or the body deadline.
  void Scan(size_t from, bool may_refuse);
  void Arm(int64_t ms);
  // Answers `status` itself and closes once the answer is written and
  // `drop_bytes` more input bytes were read (or the client closed, or
  // read_timeout_ms passed).
  void Refuse(int status, const std::string& message, int64_t drop_bytes);
  void DropInput();
  void CloseIfDone();
  // evhttp_connection_free: the close callback deletes this.
  void Close();

  Connections* const owner_;
  bufferevent* const bev_;  // referenced until destruction
  evbuffer_cb_entry* input_cb_ = nullptr;
  event* timer_ = nullptr;
  evhttp_connection* evcon_ = nullptr;  // once bound
  Phase phase_ = Phase::kIdle;
  RequestHead head_;
  Listener* listener_ = nullptr;  // kHandling
  int64_t drop_bytes_ = 0;        // kRefusing: body bytes still to read and drop
  bool written_ = false;          // kRefusing: the answer left the output buffer
};

// What every connection of one server shares.
struct ConnectionOptions {
  int64_t max_body_bytes = 0;
  int64_t max_header_bytes = 0;
  int read_timeout_ms = 0;
  int idle_timeout_s = 0;
  // The Content-Type and body of an answer the server makes itself.
  std::function<std::pair<std::string, std::string>(int status, const std::string& message)> answer;
};

// Every accepted connection of one server. Loop thread only.
class Connections {
 public:
  Connections(event_base* base, ConnectionOptions options);
  ~Connections();  // Clear()
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  // evhttp_set_bevcb(http, &Connections::NewBufferevent, connections):
  // creates a connection's bufferevent (as evhttp's own, options 0) and
  // its Connection. Null when out of memory (evhttp then drops it).
  static bufferevent* NewBufferevent(event_base* base, void* arg);

  // The Connection of `evcon`, or null.
  Connection* Find(evhttp_connection* evcon);
  // Forgets every connection (call after evhttp_free, which closed them).
  void Clear();

  event_base* base() const { return base_; }
  const ConnectionOptions& options() const { return options_; }

 private:
  friend class Connection;
  void Forget(Connection* connection);  // deletes it

  event_base* const base_;
  const ConnectionOptions options_;
  std::map<bufferevent*, std::unique_ptr<Connection>> by_bufferevent_;
};

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_CONNECTION_H_
