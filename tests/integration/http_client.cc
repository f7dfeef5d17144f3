#include "tests/integration/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace tandem::testing {
namespace {

std::pair<std::string, int> SplitAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return {address, 0};
  }
  return {address.substr(0, colon), port};
}

}  // namespace

HttpResult HttpCall(const std::string& address, const std::string& method,
                    const std::string& path, const std::string& body,
                    const std::vector<std::pair<std::string, std::string>>& headers) {
  auto [host, port] = SplitAddress(address);
  httplib::Client client(host, port);
  client.set_read_timeout(60, 0);
  client.set_connection_timeout(10, 0);
  httplib::Headers h;
  for (const auto& [k, v] : headers) h.emplace(k, v);
  httplib::Result r = method == "GET" ? client.Get(path.c_str(), h)
                                      : client.Post(path.c_str(), h, body, "application/json");
  HttpResult out;
  if (!r) {
    out.error = httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  out.body = r->body;
  for (const auto& [k, v] : r->headers) out.headers[absl::AsciiStrToLower(k)] = v;
  return out;
}

RawHttpResult RawHttp(const std::string& address, const std::string& request,
                      absl::Duration timeout) {
  RawHttpResult out;
  auto [host, port] = SplitAddress(address);
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 || inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    out.error = absl::StrCat("connect ", address, ": ", strerror(errno));
    if (fd >= 0) close(fd);
    return out;
  }
  const absl::Time start = absl::Now();
  for (size_t off = 0; off < request.size();) {
    ssize_t n = send(fd, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      out.error = absl::StrCat("send: ", strerror(errno));
      break;
    }
    off += static_cast<size_t>(n);
  }
  std::string raw;
  const absl::Time deadline = start + timeout;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0 || poll(&p, 1, static_cast<int>(ms)) == 0) break;
    char buf[16384];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      out.closed = true;  // EOF or reset
      break;
    }
    raw.append(buf, static_cast<size_t>(n));
  }
  out.took = absl::Now() - start;
  close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return out;
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &out.status)) return out;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    out.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  out.body = raw.substr(end + 4);
  return out;
}

absl::StatusOr<SseStream> SseStream::Open(
    const std::string& address, const std::string& path, const std::string& body,
    const std::vector<std::pair<std::string, std::string>>& headers, absl::Duration timeout) {
  auto [host, port] = SplitAddress(address);
  SseStream s;
  s.deadline_ = absl::Now() + timeout;
  s.fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (s.fd_ < 0 || inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
      connect(s.fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("connect ", address, ": ", strerror(errno)));
  }
  std::string request = absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: ", address,
                                      "\r\nContent-Type: application/json\r\nContent-Length: ",
                                      body.size(), "\r\nConnection: close\r\n");
  for (const auto& [k, v] : headers) absl::StrAppend(&request, k, ": ", v, "\r\n");
  absl::StrAppend(&request, "\r\n", body);
  for (size_t off = 0; off < request.size();) {
    ssize_t n = send(s.fd_, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    off += static_cast<size_t>(n);
  }
  // Status line and headers.
  size_t end;
  while ((end = s.raw_.find("\r\n\r\n")) == std::string::npos) {
    absl::StatusOr<bool> more = s.Fill();
    if (!more.ok()) return more.status();
    if (!*more) return absl::UnavailableError("connection closed before the headers ended");
  }
  std::vector<std::string> lines = absl::StrSplit(s.raw_.substr(0, end), "\r\n");
  s.raw_.erase(0, end + 4);
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &s.status_)) {
    return absl::UnavailableError(absl::StrCat("bad status line: ", lines[0]));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    s.headers_[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  auto te = s.headers_.find("transfer-encoding");
  s.chunked_ = te != s.headers_.end() && absl::AsciiStrToLower(te->second) == "chunked";
  return s;
}

SseStream::SseStream(SseStream&& o) noexcept
    : fd_(o.fd_),
      deadline_(o.deadline_),
      status_(o.status_),
      headers_(std::move(o.headers_)),
      chunked_(o.chunked_),
      eof_(o.eof_),
      body_done_(o.body_done_),
      raw_(std::move(o.raw_)),
      body_(std::move(o.body_)) {
  o.fd_ = -1;
}

SseStream::~SseStream() { Close(); }

void SseStream::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::StatusOr<bool> SseStream::Fill() {
  if (fd_ < 0 || eof_) return false;
  pollfd p{fd_, POLLIN, 0};
  const int64_t ms = absl::ToInt64Milliseconds(deadline_ - absl::Now());
  if (ms <= 0 || poll(&p, 1, static_cast<int>(ms)) == 0) {
    return absl::DeadlineExceededError("no data before the deadline");
  }
  char buf[16384];
  ssize_t n = recv(fd_, buf, sizeof(buf), 0);
  if (n < 0) return absl::UnavailableError(absl::StrCat("recv: ", strerror(errno)));
  if (n == 0) {
    eof_ = true;
    return false;
  }
  raw_.append(buf, static_cast<size_t>(n));
  return true;
}

void SseStream::Dechunk() {
  if (!chunked_) {
    body_ += raw_;
    raw_.clear();
    if (eof_) body_done_ = true;
    return;
  }
  for (;;) {
    const size_t line_end = raw_.find("\r\n");
    if (line_end == std::string::npos) return;
    size_t size = 0;
    const std::string size_text = raw_.substr(0, raw_.find_first_of(";\r"));
    if (!absl::SimpleHexAtoi(size_text, &size)) {
      body_done_ = true;  // malformed: stop
      return;
    }
    if (raw_.size() < line_end + 2 + size + 2) return;
    if (size == 0) {
      body_done_ = true;
      raw_.clear();
      return;
    }
    body_.append(raw_, line_end + 2, size);
    raw_.erase(0, line_end + 2 + size + 2);
  }
}

absl::StatusOr<std::string> SseStream::Next() {
  for (;;) {
    Dechunk();
    const size_t end = body_.find("\n\n");
    if (end != std::string::npos) {
      std::string event = body_.substr(0, end);
      body_.erase(0, end + 2);
      if (absl::StartsWith(event, "data: ")) return event.substr(6);
      if (absl::StartsWith(event, ":")) return event;
      return absl::InternalError(absl::StrCat("not an SSE event: ", event));
    }
    if (body_done_ || eof_) {
      Dechunk();
      if (body_.find("\n\n") != std::string::npos) continue;
      return absl::NotFoundError("end of stream");
    }
    absl::StatusOr<bool> more = Fill();
    if (!more.ok()) return more.status();
  }
}

absl::StatusOr<std::vector<std::string>> SseStream::ReadAll() {
  std::vector<std::string> events;
  for (;;) {
    absl::StatusOr<std::string> e = Next();
    if (absl::IsNotFound(e.status())) return events;
    if (!e.ok()) return e.status();
    if (!absl::StartsWith(*e, ":")) events.push_back(*std::move(e));
  }
}

}  // namespace tandem::testing
