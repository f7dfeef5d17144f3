// TCP helpers for the KV transfer: every socket is non-blocking and every
// read/write/connect/accept waits in poll() against a deadline, so no call
// blocks forever (DESIGN.md, KV transfer). Sends use MSG_NOSIGNAL (a closed
// peer is an error, never SIGPIPE); connected sockets set TCP_NODELAY.
//
// Owns: file descriptors handed out as ScopedFd. Does not touch: message
// semantics beyond the u32 type | u32 length framing (wire.h).
// Threads: functions are thread-safe; one fd is read by one thread and
// written by one thread at a time. Another thread may call shutdown() on
// an fd to wake a poll() on it.
#ifndef TANDEM_KVTRANSFER_TCP_H_
#define TANDEM_KVTRANSFER_TCP_H_

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kvtransfer::tcp {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// now + ms.
Deadline DeadlineIn(int ms);

// Owns one file descriptor; closes it on destruction.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& o) noexcept : fd_(o.Release()) {}
  ScopedFd& operator=(ScopedFd&& o) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release();
  void Reset();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  int port = 0;
};
// "host:port" or "[v6addr]:port". Errors: INVALID_ARGUMENT naming the
// endpoint.
[[nodiscard]] absl::StatusOr<HostPort> ParseEndpoint(const std::string& endpoint);

// Binds and listens on host:port (port 0 = ephemeral); *bound_port gets the
// actual port. Errors: UNAVAILABLE naming the address and errno text.
[[nodiscard]] absl::StatusOr<ScopedFd> Listen(const std::string& host, int port, int* bound_port);

// Waits until `listen_fd` has a connection or `deadline` passes. Returns an
// invalid ScopedFd on timeout; UNAVAILABLE when the listener is shut down or
// fails.
[[nodiscard]] absl::StatusOr<ScopedFd> Accept(int listen_fd, Deadline deadline);

// Accepts one pending connection on non-blocking `listen_fd` without
// waiting: an invalid ScopedFd when none is pending (or the client already
// went away). The socket is non-blocking, close-on-exec, TCP_NODELAY.
// Errors: UNAVAILABLE "accept failed: <errno text>" (EMFILE, ...).
[[nodiscard]] absl::StatusOr<ScopedFd> AcceptNow(int listen_fd);

// The peer's address of a connected socket, "1.2.3.4:5678" or
// "[::1]:5678"; "unknown peer" when getpeername fails. For log lines.
std::string PeerAddress(int fd);

// Connects to endpoint ("host:port") before `deadline`. Errors:
// INVALID_ARGUMENT (bad endpoint), UNAVAILABLE (resolve/connect failed),
// DEADLINE_EXCEEDED.
[[nodiscard]] absl::StatusOr<ScopedFd> Connect(const std::string& endpoint, Deadline deadline);

// Starts a non-blocking connect to endpoint ("host:port") and returns the
// socket at once, its connect in progress or done: wait for POLLOUT on it,
// then call FinishConnect. Never waits for the peer (name resolution may
// still take a moment for a host name). Errors: INVALID_ARGUMENT (bad
// endpoint), UNAVAILABLE (resolve failed, or every address refused at
// once).
[[nodiscard]] absl::StatusOr<ScopedFd> StartConnect(const std::string& endpoint);
// After POLLOUT (or POLLERR/POLLHUP) on a StartConnect socket: OK once
// connected (TCP_NODELAY set), else UNAVAILABLE naming the endpoint and
// the connect error.
[[nodiscard]] absl::Status FinishConnect(int fd, const std::string& endpoint);

// In the functions below, idle_ms > 0 turns `deadline` into a silence
// bound: every chunk of progress moves the deadline to now + idle_ms, so a
// big message on a slow link is not cut off while bytes keep flowing.

// Writes all bytes of iov[0..iovcnt) (iov is modified). Errors: UNAVAILABLE
// (peer closed / reset), DEADLINE_EXCEEDED.
[[nodiscard]] absl::Status SendAll(int fd, struct iovec* iov, int iovcnt, Deadline deadline,
                                   int idle_ms = 0);
[[nodiscard]] absl::Status SendAll(int fd, const std::string& bytes, Deadline deadline);

// Reads exactly n bytes. Errors: UNAVAILABLE (peer closed: "closed after
// k of n bytes"), DEADLINE_EXCEEDED.
[[nodiscard]] absl::Status RecvAll(int fd, void* buf, size_t n, Deadline* deadline,
                                   int idle_ms = 0);

// Reads one framed message; the payload goes to *payload (resized, its
// capacity reused). A length prefix above max_payload is DATA_LOSS before
// anything is allocated. Errors: as RecvAll, plus DATA_LOSS.
[[nodiscard]] absl::Status ReadMessage(int fd, Deadline deadline, uint64_t max_payload,
                                       uint32_t* type, std::string* payload, int idle_ms = 0);

// True when `fd` has bytes (or EOF / an error) to read right now.
bool Readable(int fd);

}  // namespace tandem::kvtransfer::tcp

#endif  // TANDEM_KVTRANSFER_TCP_H_
