// Connection and Connections: see connection.h.
#include "common/http/connection.h"

#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include <algorithm>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace tandem::http {

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return status < 400 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  }
}

Connection::Connection(Connections* owner, bufferevent* bev)
    : owner_(owner),
      bev_(bev),
      // evhttp's header limit counts line bytes without their ends.
      head_(static_cast<size_t>(2 * owner->options().max_header_bytes + 4096)) {
  bufferevent_incref(bev_);
  input_cb_ = evbuffer_add_cb(bufferevent_get_input(bev_), &Connection::OnInput, this);
  timer_ = evtimer_new(owner_->base(), &Connection::OnTimer, this);
  Arm(0);  // binds once evhttp has set the connection up
}

Connection::~Connection() {
  if (input_cb_ != nullptr) evbuffer_remove_cb_entry(bufferevent_get_input(bev_), input_cb_);
  if (timer_ != nullptr) event_free(timer_);
  bufferevent_decref(bev_);
}

bool Connection::Bind() {
  if (evcon_ != nullptr) return true;
  bufferevent_data_cb readcb, writecb;
  bufferevent_event_cb eventcb;
  void* arg = nullptr;
  bufferevent_getcb(bev_, &readcb, &writecb, &eventcb, &arg);
  if (eventcb == nullptr || arg == nullptr) return false;  // freed by libevent
  evcon_ = static_cast<evhttp_connection*>(arg);
  evhttp_connection_set_closecb(evcon_, &Connection::OnClose, this);
  return true;
}

void Connection::Handling(Listener* listener) {
  phase_ = Phase::kHandling;
  listener_ = listener;
  evtimer_del(timer_);
}

void Connection::Idle() {
  listener_ = nullptr;
  phase_ = Phase::kIdle;
  evtimer_del(timer_);
  if (evbuffer_get_length(bufferevent_get_input(bev_)) > 0) StartHead(0, /*may_refuse=*/false);
}

void Connection::StartHead(size_t from, bool may_refuse) {
  phase_ = Phase::kHead;
  head_.Reset();
  Arm(owner_->options().read_timeout_ms);
  Scan(from, may_refuse);
}

void Connection::Scan(size_t from, bool may_refuse) {
  evbuffer* input = bufferevent_get_input(bev_);
  const size_t length = evbuffer_get_length(input);
  evbuffer_ptr pos;
  if (from >= length || evbuffer_ptr_set(input, &pos, from, EVBUFFER_PTR_SET) != 0) return;
  size_t offset = from;
  while (!head_.complete() && offset < length) {
    evbuffer_iovec piece;
    if (evbuffer_peek(input, -1, &pos, &piece, 1) < 1 || piece.iov_len == 0) return;
    offset += head_.Feed(std::string_view(static_cast<const char*>(piece.iov_base), piece.iov_len));
    if (evbuffer_ptr_set(input, &pos, piece.iov_len, EVBUFFER_PTR_ADD) != 0) break;
  }
  if (!head_.complete()) return;
  const int64_t declared = head_.declared_body_bytes();
  const ConnectionOptions& o = owner_->options();
  if (may_refuse && head_.conflicting_lengths()) {
    // Nothing after the head can be trusted to be this request's body.
    Refuse(400, "conflicting Content-Length headers", 0);
    return;
  }
  if (may_refuse && declared > o.max_body_bytes) {
    Refuse(413,
           absl::StrCat("request body of ", declared, " bytes is over the limit of ",
                        o.max_body_bytes, " bytes"),
           declared - static_cast<int64_t>(length - offset));
    return;
  }
  phase_ = Phase::kBody;
  Arm(o.read_timeout_ms);
}

void Connection::Arm(int64_t ms) {
  const timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>(ms % 1000 * 1000)};
  evtimer_add(timer_, &tv);
}

void Connection::OnInput(evbuffer* buffer, const evbuffer_cb_info* info, void* arg) {
  auto* c = static_cast<Connection*>(arg);
  if (info->n_added == 0) return;
  c->Bind();  // evhttp reads only once it has set the connection up
  switch (c->phase_) {
    case Phase::kIdle:
      // The buffer holds nothing of an earlier request (evhttp consumed
      // it before the handler ran): all of it is the new request's.
      c->StartHead(0, /*may_refuse=*/true);
      return;
    case Phase::kHead:
      c->Scan(evbuffer_get_length(buffer) - info->n_added, /*may_refuse=*/true);
      return;
    case Phase::kBody:
    case Phase::kHandling:
    case Phase::kRefusing:
      return;
  }
}

void Connection::OnTimer(int, short, void* arg) {
  auto* c = static_cast<Connection*>(arg);
  if (!c->Bind()) {
    c->owner_->Forget(c);
    return;
  }
  const int ms = c->owner_->options().read_timeout_ms;
  switch (c->phase_) {
    case Phase::kIdle:
    case Phase::kHandling:
      return;
    case Phase::kHead:
    case Phase::kBody:
      if (evbuffer_get_length(bufferevent_get_output(c->bev_)) > 0) {
        c->Close();  // evhttp is answering (an error of its own): late anyway
        return;
      }
      c->Refuse(408,
                absl::StrCat("request ", c->phase_ == Phase::kHead ? "headers" : "body",
                             " incomplete after ", ms, " ms"),
                0);
      return;
    case Phase::kRefusing:
      c->Close();
      return;
  }
}

void Connection::OnClose(evhttp_connection*, void* arg) {
  auto* c = static_cast<Connection*>(arg);
  Listener* listener = c->listener_;
  c->listener_ = nullptr;
  if (listener != nullptr) listener->ConnectionClosed();
  c->owner_->Forget(c);
}

void Connection::Refuse(int status, const std::string& message, int64_t drop_bytes) {
  phase_ = Phase::kRefusing;
  drop_bytes_ = std::max<int64_t>(0, drop_bytes);
  written_ = false;
  // evhttp reads nothing more of this connection; its request is freed
  // with the connection.
  bufferevent_setcb(bev_, &Connection::OnRefusalRead, &Connection::OnRefusalWritten,
                    &Connection::OnRefusalEvent, this);
  evbuffer_drain(bufferevent_get_input(bev_), evbuffer_get_length(bufferevent_get_input(bev_)));
  const ConnectionOptions& o = owner_->options();
  const timeval write_tv{o.idle_timeout_s, 0};
  bufferevent_set_timeouts(bev_, nullptr, &write_tv);
  bufferevent_enable(bev_, EV_READ | EV_WRITE);
  auto [content_type, body] = o.answer(status, message);
  const std::string answer = absl::StrCat(
      "HTTP/1.1 ", status, " ", ReasonPhrase(status), "\r\nContent-Type: ", content_type,
      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
  bufferevent_write(bev_, answer.data(), answer.size());
  Arm(o.read_timeout_ms);
}

void Connection::DropInput() {
  evbuffer* input = bufferevent_get_input(bev_);
  const int64_t n = static_cast<int64_t>(evbuffer_get_length(input));
  evbuffer_drain(input, n);
  drop_bytes_ = std::max<int64_t>(0, drop_bytes_ - n);
}

void Connection::OnRefusalRead(bufferevent*, void* arg) {
  auto* c = static_cast<Connection*>(arg);
  c->DropInput();
  c->CloseIfDone();
}

void Connection::OnRefusalWritten(bufferevent*, void* arg) {
  auto* c = static_cast<Connection*>(arg);
  c->written_ = true;
  // The answer is out: end our half at once, so the client reads it and
  // sees the close without waiting for the rest of a body it may still
  // send (drained until it closes, or read_timeout_ms).
  ::shutdown(bufferevent_getfd(c->bev_), SHUT_WR);
  c->CloseIfDone();
}

void Connection::OnRefusalEvent(bufferevent*, short what, void* arg) {
  auto* c = static_cast<Connection*>(arg);
  if ((what & BEV_EVENT_READING) && (what & BEV_EVENT_EOF) && !c->written_) {
    // The client half-closed (sent all it will): the answer still goes
    // out, then OnRefusalWritten closes.
    c->drop_bytes_ = 0;
    bufferevent_disable(c->bev_, EV_READ);
    return;
  }
  c->Close();  // an error, the write timeout, or the end of input once answered
}

void Connection::CloseIfDone() {
  if (written_ && drop_bytes_ == 0) Close();
}

void Connection::Close() { evhttp_connection_free(evcon_); }

Connections::Connections(event_base* base, ConnectionOptions options)
    : base_(base), options_(std::move(options)) {}

Connections::~Connections() { Clear(); }

bufferevent* Connections::NewBufferevent(event_base* base, void* arg) {
  auto* self = static_cast<Connections*>(arg);
  bufferevent* bev = bufferevent_socket_new(base, -1, 0);
  if (bev == nullptr) return nullptr;
  self->by_bufferevent_.emplace(bev, std::make_unique<Connection>(self, bev));
  return bev;
}

Connection* Connections::Find(evhttp_connection* evcon) {
  if (evcon == nullptr) return nullptr;
  auto it = by_bufferevent_.find(evhttp_connection_get_bufferevent(evcon));
  return it == by_bufferevent_.end() ? nullptr : it->second.get();
}

void Connections::Clear() { by_bufferevent_.clear(); }

void Connections::Forget(Connection* connection) { by_bufferevent_.erase(connection->bev_); }

}  // namespace tandem::http
