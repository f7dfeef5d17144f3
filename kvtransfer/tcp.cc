#include "kvtransfer/tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer::tcp {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// Milliseconds left until `deadline` (0 when past), for poll().
int MsLeft(Deadline deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left + 1, 1 << 30));
}

// Waits for `events` on fd until `deadline`. OK when ready (or when poll
// reports an error/hangup: the next I/O call returns the precise error).
[[nodiscard]] absl::Status WaitFor(int fd, short events, Deadline deadline, const char* what) {
  for (;;) {
    struct pollfd p = {fd, events, 0};
    int ms = MsLeft(deadline);
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return absl::OkStatus();
    if (rc == 0) {
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("deadline exceeded while ", what));
      }
      continue;
    }
    if (errno == EINTR) continue;
    return absl::UnavailableError(absl::StrCat("poll failed while ", what, ": ", ErrnoText(errno)));
  }
}

[[nodiscard]] absl::Status SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::UnavailableError(absl::StrCat("fcntl(O_NONBLOCK) failed: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

void SetNoDelay(int fd) {
  int one = 1;
  // Best effort: a socket without TCP_NODELAY still works, only slower.
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// getaddrinfo for a numeric or named host; `passive` for bind.
[[nodiscard]] absl::StatusOr<struct addrinfo*> Resolve(const std::string& host, int port,
                                                       bool passive) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  struct addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve KV endpoint host '", host, "': ", gai_strerror(rc)));
  }
  return res;
}

}  // namespace

Deadline DeadlineIn(int ms) { return Clock::now() + std::chrono::milliseconds(ms); }

ScopedFd& ScopedFd::operator=(ScopedFd&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = o.Release();
  }
  return *this;
}

int ScopedFd::Release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void ScopedFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::StatusOr<HostPort> ParseEndpoint(const std::string& endpoint) {
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad KV endpoint '", endpoint, "' (want host:port): ", why));
  };
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) return bad("no ':'");
  HostPort hp;
  hp.host = endpoint.substr(0, colon);
  if (hp.host.size() >= 2 && hp.host.front() == '[' && hp.host.back() == ']') {
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  }
  if (hp.host.empty()) return bad("empty host");
  if (!absl::SimpleAtoi(endpoint.substr(colon + 1), &hp.port) || hp.port <= 0 || hp.port > 65535) {
    return bad("port must be 1..65535");
  }
  return hp;
}

absl::StatusOr<ScopedFd> Listen(const std::string& host, int port, int* bound_port) {
  absl::StatusOr<struct addrinfo*> res = Resolve(host, port, true);
  if (!res.ok()) return res.status();
  absl::Status last =
      absl::UnavailableError(absl::StrCat("no address to listen on for ", host, ":", port));
  for (struct addrinfo* ai = *res; ai != nullptr; ai = ai->ai_next) {
    ScopedFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last = absl::UnavailableError(absl::StrCat("socket() failed: ", ErrnoText(errno)));
      continue;
    }
    int one = 1;
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), 128) != 0) {
      last = absl::UnavailableError(
          absl::StrCat("cannot listen on ", host, ":", port, ": ", ErrnoText(errno)));
      continue;
    }
    absl::Status nb = SetNonBlocking(fd.get());
    if (!nb.ok()) {
      last = nb;
      continue;
    }
    struct sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    if (::getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&addr), &len) != 0) {
      last = absl::UnavailableError(absl::StrCat("getsockname failed: ", ErrnoText(errno)));
      continue;
    }
    *bound_port = addr.ss_family == AF_INET6
                      ? ntohs(reinterpret_cast<struct sockaddr_in6*>(&addr)->sin6_port)
                      : ntohs(reinterpret_cast<struct sockaddr_in*>(&addr)->sin_port);
    ::freeaddrinfo(*res);
    return fd;
  }
  ::freeaddrinfo(*res);
  return last;
}

absl::StatusOr<ScopedFd> Accept(int listen_fd, Deadline deadline) {
  for (;;) {
    absl::Status ready = WaitFor(listen_fd, POLLIN, deadline, "accepting");
    if (absl::IsDeadlineExceeded(ready)) return ScopedFd();
    if (!ready.ok()) return ready;
    ScopedFd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.valid()) {
      SetNoDelay(fd.get());
      return fd;
    }
    int err = errno;
    if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK || err == ECONNABORTED ||
        err == EPROTO) {
      // Spurious wakeup or a client that already went away.
      if (Clock::now() >= deadline) return ScopedFd();
      continue;
    }
    return absl::UnavailableError(absl::StrCat("accept failed: ", ErrnoText(err)));
  }
}

absl::StatusOr<ScopedFd> AcceptNow(int listen_fd) {
  for (;;) {
    ScopedFd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.valid()) {
      SetNoDelay(fd.get());
      return fd;
    }
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK || err == ECONNABORTED || err == EPROTO) {
      return ScopedFd();
    }
    return absl::UnavailableError(absl::StrCat("accept failed: ", ErrnoText(err)));
  }
}

std::string PeerAddress(int fd) {
  struct sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) != 0) {
    return "unknown peer";
  }
  char host[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<const struct sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a6->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(a6->sin6_port));
  }
  if (addr.ss_family == AF_INET) {
    const auto* a4 = reinterpret_cast<const struct sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a4->sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(a4->sin_port));
  }
  return "unknown peer";
}

namespace {

// Tries each address of `endpoint` in turn: a non-blocking socket and
// connect(). `settle(fd, in_progress, &stop)` finishes one attempt: OK
// keeps that socket; an error moves on to the next address (or ends the
// loop if it sets stop). Errors: the last attempt's.
[[nodiscard]] absl::StatusOr<ScopedFd> ConnectFirst(
    const std::string& endpoint,
    const std::function<absl::Status(int fd, bool in_progress, bool* stop)>& settle) {
  absl::StatusOr<HostPort> hp = ParseEndpoint(endpoint);
  if (!hp.ok()) return hp.status();
  absl::StatusOr<struct addrinfo*> res = Resolve(hp->host, hp->port, false);
  if (!res.ok()) return res.status();
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for KV endpoint ", endpoint));
  for (struct addrinfo* ai = *res; ai != nullptr; ai = ai->ai_next) {
    ScopedFd fd(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last = absl::UnavailableError(absl::StrCat("socket() failed: ", ErrnoText(errno)));
      continue;
    }
    int rc;
    do {
      rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno != EINPROGRESS) {
      last = absl::UnavailableError(
          absl::StrCat("cannot connect to KV endpoint ", endpoint, ": ", ErrnoText(errno)));
      continue;
    }
    bool stop = false;
    last = settle(fd.get(), rc != 0, &stop);
    if (last.ok()) {
      ::freeaddrinfo(*res);
      return fd;
    }
    if (stop) break;
  }
  ::freeaddrinfo(*res);
  return last;
}

}  // namespace

absl::StatusOr<ScopedFd> Connect(const std::string& endpoint, Deadline deadline) {
  return ConnectFirst(endpoint, [&](int fd, bool in_progress, bool* stop) {
    if (in_progress) {
      absl::Status ready = WaitFor(fd, POLLOUT, deadline,
                                   absl::StrCat("connecting to KV endpoint ", endpoint).c_str());
      if (!ready.ok()) {
        *stop = absl::IsDeadlineExceeded(ready);
        return ready;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        return absl::UnavailableError(
            absl::StrCat("cannot connect to KV endpoint ", endpoint, ": ", ErrnoText(err)));
      }
    }
    SetNoDelay(fd);
    return absl::OkStatus();
  });
}

absl::StatusOr<ScopedFd> StartConnect(const std::string& endpoint) {
  return ConnectFirst(endpoint, [](int, bool, bool*) { return absl::OkStatus(); });
}

absl::Status FinishConnect(int fd, const std::string& endpoint) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to KV endpoint ", endpoint, ": ", ErrnoText(err)));
  }
  SetNoDelay(fd);
  return absl::OkStatus();
}

absl::Status SendAll(int fd, struct iovec* iov, int iovcnt, Deadline deadline, int idle_ms) {
  while (iovcnt > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --iovcnt;
      continue;
    }
    absl::Status ready = WaitFor(fd, POLLOUT, deadline, "sending KV data");
    if (!ready.ok()) return ready;
    struct msghdr msg;
    std::memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(std::min(iovcnt, IOV_MAX));
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return absl::UnavailableError(
          absl::StrCat("KV peer connection failed while sending: ", ErrnoText(errno)));
    }
    if (idle_ms > 0 && n > 0) deadline = DeadlineIn(idle_ms);
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0 && left > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status SendAll(int fd, const std::string& bytes, Deadline deadline) {
  struct iovec iov = {const_cast<char*>(bytes.data()), bytes.size()};
  return SendAll(fd, &iov, 1, deadline);
}

absl::Status RecvAll(int fd, void* buf, size_t n, Deadline* deadline, int idle_ms) {
  char* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < n) {
    absl::Status ready = WaitFor(fd, POLLIN, *deadline, "receiving KV data");
    if (!ready.ok()) return ready;
    ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r == 0) {
      return absl::UnavailableError(
          absl::StrCat("KV peer closed the connection after ", got, " of ", n, " bytes"));
    }
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return absl::UnavailableError(
          absl::StrCat("KV peer connection failed while receiving: ", ErrnoText(errno)));
    }
    got += static_cast<size_t>(r);
    if (idle_ms > 0) *deadline = DeadlineIn(idle_ms);
  }
  return absl::OkStatus();
}

absl::Status ReadMessage(int fd, Deadline deadline, uint64_t max_payload, uint32_t* type,
                         std::string* payload, int idle_ms) {
  char header[wire::kHeaderBytes];
  absl::Status s = RecvAll(fd, header, sizeof(header), &deadline, idle_ms);
  if (!s.ok()) return s;
  uint32_t length = 0;
  wire::GetHeader(header, type, &length);
  if (length > max_payload) {
    return absl::DataLossError(absl::StrCat("KV message ", wire::MessageTypeName(*type),
                                            " declares ", length, " payload bytes, more than the ",
                                            max_payload, " allowed here"));
  }
  payload->resize(length);
  return RecvAll(fd, payload->data(), length, &deadline, idle_ms);
}

bool Readable(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, 0);
  } while (rc < 0 && errno == EINTR);
  return rc > 0;
}

}  // namespace tandem::kvtransfer::tcp
