// Finds where an HTTP/1.1 request head ends in bytes fed as they arrive,
// and reads from it what the server decides before the body: whether a
// body is declared and how large (RFC 9112 sections 2.2, 6.1-6.3).
//
// The head is the request line and the header lines up to the first empty
// line; lines end with LF or CRLF (libevent's EVBUFFER_EOL_CRLF, which
// evhttp parses with). The declared body follows evhttp 2.1's rules, so
// this and evhttp agree on what a request holds: only POST, PUT and PATCH
// carry a body; `Transfer-Encoding: chunked` (the first such header) wins
// over Content-Length; the first Content-Length header counts, its value
// trimmed of blanks, decimal digits only.
//
// Owns: nothing but its scan state. Does not touch: sockets, libevent.
// Threads: one user at a time.
#ifndef TANDEM_COMMON_HTTP_REQUEST_HEAD_H_
#define TANDEM_COMMON_HTTP_REQUEST_HEAD_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::http {

class RequestHead {
 public:
  // `max_bytes`: the most head bytes kept; a longer head is still found
  // complete but declares nothing here (evhttp refuses it with 400 at its
  // own header limit).
  explicit RequestHead(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Scans the next bytes of the request. Returns how many of them belong
  // to the head (all of them while it is incomplete; up to and including
  // its final LF once it completes). Bytes fed after completion are not
  // looked at (returns 0).
  size_t Feed(std::string_view bytes);

  // The empty line ending the head was seen.
  bool complete() const { return complete_; }

  // Once complete(): the Content-Length of a POST, PUT or PATCH without
  // chunked Transfer-Encoding (INT64_MAX when the number does not fit);
  // -1 when the method carries no body, no length is declared, the value
  // is one evhttp refuses (not a decimal number), or the head was longer
  // than max_bytes.
  int64_t declared_body_bytes() const;

  // Once complete(): two Content-Length headers with different values
  // (RFC 9112 section 6.3: the framing is invalid, answered 400 and the
  // connection closed; evhttp would take the first and read the rest as
  // another request, the start of request smuggling). Equal repeats are
  // fine.
  bool conflicting_lengths() const;

  // Forgets everything: the next byte fed starts a new request.
  void Reset();

 private:
  const size_t max_bytes_;
  std::string head_;         // the head's bytes so far (<= max_bytes_)
  bool truncated_ = false;   // bytes beyond max_bytes_ were not kept
  size_t line_bytes_ = 0;    // bytes of the current line before a pending CR
  bool pending_cr_ = false;  // the last byte was a CR (data unless LF follows)
  bool first_line_done_ = false;
  bool complete_ = false;
};

}  // namespace tandem::http

#endif  // TANDEM_COMMON_HTTP_REQUEST_HEAD_H_
