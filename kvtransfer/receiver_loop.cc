// KvReceiver's I/O thread: one poll() loop over the wake eventfd, the
// listening socket and every connection (receiver_impl.h has the design
// notes; receiver_conn.cc handles the messages).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtransfer/receiver_impl.h"

namespace tandem::kvtransfer {

using receiver_internal::kAcceptPause;
using receiver_internal::kControlSendMs;
using receiver_internal::kFinishedMemory;
using receiver_internal::kMaxAcceptsPerTurn;
using receiver_internal::kMaxPollSleep;
using receiver_internal::kReadBudgetBytes;
using tcp::Clock;

namespace {

// Milliseconds from now until `t` for poll(), rounded up (0 when past).
int PollMs(Clock::time_point now, Clock::time_point t) {
  if (t <= now) return 0;
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t - now).count();
  return static_cast<int>(std::min<int64_t>((us + 999) / 1000, 1 << 30));
}

}  // namespace

void KvReceiver::Impl::Wake() {
  const uint64_t one = 1;
  // EAGAIN means the counter is already non-zero: the thread wakes anyway.
  ssize_t n;
  do {
    n = ::write(wake_fd_.get(), &one, sizeof(one));
  } while (n < 0 && errno == EINTR);
}

void KvReceiver::Impl::IoLoop() {
  std::vector<struct pollfd> fds;
  std::vector<Conn*> polled;  // polled[i] goes with fds[i + 2]
  for (;;) {
    const Clock::time_point now = Clock::now();
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    const bool accepting = now >= accept_paused_until_;
    fds.push_back({accepting ? listen_fd_.get() : -1, POLLIN, 0});
    for (auto& [id, c] : conns_) {
      short events = 0;
      if (c->phase != ConnPhase::kClosing) events |= POLLIN;
      if (c->out_sent < c->out.size()) events |= POLLOUT;
      fds.push_back({c->fd.get(), events, 0});
      polled.push_back(c.get());
    }
    const int rc = ::poll(fds.data(), fds.size(), PollMs(now, NextWakeup(now)));
    if (rc < 0 && errno != EINTR) {
      // Only EFAULT/EINVAL/ENOMEM: nothing to retry differently; pause.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (rc > 0 && fds[0].revents != 0) {
      uint64_t count = 0;  // resets the eventfd; the count itself is unused
      const ssize_t got = ::read(wake_fd_.get(), &count, sizeof(count));
      (void)got;
    }
    {
      absl::MutexLock l(&mu_);
      if (stopping_) break;
    }
    if (rc > 0 && fds[1].revents != 0) AcceptAll();
    for (size_t i = 0; rc > 0 && i < polled.size(); ++i) {
      Conn& c = *polled[i];
      const short re = fds[i + 2].revents;
      if (re == 0 || !c.fd.valid()) continue;
      if ((re & (POLLOUT | POLLERR | POLLHUP)) && c.out_sent < c.out.size()) {
        Flush(c);
      }
      if (c.fd.valid() && c.phase != ConnPhase::kClosing && (re & (POLLIN | POLLERR | POLLHUP))) {
        OnReadable(c);
      }
    }
    HandleKicks();
    RunCloses();
    FireDeadlines(Clock::now());
    for (auto it = conns_.begin(); it != conns_.end();) {
      it = it->second->fd.valid() ? std::next(it) : conns_.erase(it);
    }
  }
  // Stopping: every transfer was ended by the destructor, which queued the
  // CloseTransfer of each open device attempt: made here, on this thread,
  // after this thread's last Receive call.
  RunCloses();
  // Each connection gets one try at a REJECT, then is closed.
  for (auto& [id, c] : conns_) {
    if (!c->fd.valid() || c->phase == ConnPhase::kClosing) continue;
    absl::Status why = absl::UnavailableError("KV receiver is shutting down");
    if (c->phase == ConnPhase::kReceiving) {
      absl::MutexLock l(&mu_);
      why = LostLocked(*c->transfer, c->hello);
      // A device transfer that succeeded just now still gets its ACK.
      if (c->final_seen && c->transfer->conn_id == c->id && c->transfer->status.ok() &&
          c->transfer->state != TransferState::kReceiving) {
        c->out.append(wire::EncodeAck());
        continue;
      }
    }
    c->out.append(wire::EncodeReject(why));
  }
  for (auto& [id, c] : conns_) {
    if (!c->fd.valid()) continue;
    if (c->out_sent < c->out.size()) {
      (void)::send(c->fd.get(), c->out.data() + c->out_sent, c->out.size() - c->out_sent,
                   MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    c->fd.Reset();
  }
  conns_.clear();
}

void KvReceiver::Impl::AcceptAll() {
  for (int i = 0; i < kMaxAcceptsPerTurn; ++i) {
    absl::StatusOr<tcp::ScopedFd> fd = tcp::AcceptNow(listen_fd_.get());
    if (!fd.ok()) {
      // EMFILE and the like: the listener would stay readable and spin the
      // loop; leave the connection in the backlog for a while.
      accept_paused_until_ = Clock::now() + kAcceptPause;
      LogLine(absl::StrCat("KV receiver: ", fd.status().message(), "; not accepting for ",
                           kAcceptPause.count(), " ms"));
      return;
    }
    if (!fd->valid()) return;
    auto c = std::make_unique<Conn>();
    c->id = ++next_conn_id_;
    c->peer = tcp::PeerAddress(fd->get());
    c->fd = std::move(*fd);
    c->deadline = tcp::DeadlineIn(options_.handshake_timeout_ms);
    conns_[c->id] = std::move(c);
  }
}

void KvReceiver::Impl::OnReadable(Conn& c) {
  size_t used = 0;
  while (c.fd.valid() && c.phase != ConnPhase::kClosing && used < kReadBudgetBytes) {
    MessageReader::Progress p;
    absl::Status s = c.reader.ReadSome(c.fd.get(), c.max_payload, kReadBudgetBytes - used, &p);
    used += p.bytes;
    // Silence is measured from the last byte, so a big frame on a slow
    // link is not cut off while bytes keep coming.
    if (p.bytes > 0 && c.phase == ConnPhase::kReceiving) {
      c.deadline = tcp::DeadlineIn(options_.transfer_timeout_ms);
    }
    if (!s.ok()) {
      OnReadError(c, std::move(s));
      return;
    }
    if (!p.complete) return;
    OnMessage(c);
    c.reader.Next();
    // A write may have taken a while: silence starts after it.
    if (c.phase == ConnPhase::kReceiving) {
      c.deadline = tcp::DeadlineIn(options_.transfer_timeout_ms);
    }
  }
}

void KvReceiver::Impl::OnReadError(Conn& c, absl::Status status) {
  if (c.phase != ConnPhase::kReceiving) {
    Close(c, status);
    return;
  }
  if (absl::IsUnavailable(status)) {
    status = absl::UnavailableError(absl::StrCat("KV sender for request ", c.hello.request_id,
                                                 " went away mid-transfer: ", status.message()));
  }
  FailTransfer(c, std::move(status));
}

void KvReceiver::Impl::HandleKicks() {
  std::vector<uint64_t> kicked;
  {
    absl::MutexLock l(&mu_);
    kicked.swap(kicked_);
  }
  for (uint64_t id : kicked) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    Conn& c = *it->second;
    if (!c.fd.valid() || c.phase != ConnPhase::kReceiving) continue;
    absl::Status why;
    bool ack = false;
    {
      absl::MutexLock l(&mu_);
      if (OwnsLocked(*c.transfer, c)) continue;
      // A device transfer that ended OK (FINAL checked, every Receive done).
      const Transfer& t = *c.transfer;
      ack = c.final_seen && t.conn_id == c.id && t.status.ok() &&
            t.state != TransferState::kReceiving;
      if (!ack) why = LostLocked(t, c.hello);
    }
    if (ack) {
      SendAck(c);
    } else {
      Close(c, why);
    }
  }
}

void KvReceiver::Impl::FireDeadlines(Clock::time_point now) {
  for (auto& [id, cp] : conns_) {
    Conn& c = *cp;
    if (!c.fd.valid() || now < c.deadline) continue;
    switch (c.phase) {
      case ConnPhase::kHandshake:
        Close(c, absl::DeadlineExceededError(absl::StrCat("no complete KV HELLO within ",
                                                          options_.handshake_timeout_ms,
                                                          " ms of connecting")));
        break;
      case ConnPhase::kReceiving:
        FailTransfer(c, absl::DeadlineExceededError(absl::StrCat(
                            "KV transfer for request ", c.hello.request_id, " stalled for ",
                            options_.transfer_timeout_ms,
                            " ms: no byte (not even a KEEPALIVE) from the prefill "
                            "worker at ",
                            c.peer, "; it stopped or the link is down (kv.transfer_timeout_ms)")));
        break;
      case ConnPhase::kClosing:
        CloseNow(c);
        break;
    }
  }
  absl::MutexLock l(&mu_);
  std::vector<std::shared_ptr<Transfer>> expired;
  for (auto& [id, t] : transfers_) {
    if (t->state == TransferState::kAwaitingHello && now >= t->handshake_deadline) {
      expired.push_back(t);
    }
  }
  for (auto& t : expired) {
    EndLocked(t, absl::DeadlineExceededError(absl::StrCat(
                     "no KV sender said HELLO for request ", t->request_id, " attempt ", t->attempt,
                     " within ", options_.handshake_timeout_ms,
                     " ms: no prefill worker connected for it (kv.handshake_timeout_ms)")));
  }
  for (auto it = finished_.begin(); it != finished_.end();) {
    it = (now - it->second.at >= kFinishedMemory) ? finished_.erase(it) : std::next(it);
  }
}

Clock::time_point KvReceiver::Impl::NextWakeup(Clock::time_point now) {
  Clock::time_point next = now + kMaxPollSleep;
  if (now < accept_paused_until_) next = std::min(next, accept_paused_until_);
  for (const auto& [id, c] : conns_) next = std::min(next, c->deadline);
  absl::MutexLock l(&mu_);
  for (const auto& [id, t] : transfers_) {
    if (t->state == TransferState::kAwaitingHello) {
      next = std::min(next, t->handshake_deadline);
    }
  }
  return next;
}

void KvReceiver::Impl::Queue(Conn& c, const std::string& bytes) {
  c.out.append(bytes);
  Flush(c);
}

void KvReceiver::Impl::Flush(Conn& c) {
  while (c.out_sent < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0) {
      // The peer is gone: a receiving connection learns it from its next
      // read; a closing one has nothing left to say.
      c.out_sent = c.out.size();
      break;
    }
    c.out_sent += static_cast<size_t>(n);
  }
  c.out.clear();
  c.out_sent = 0;
  if (c.phase == ConnPhase::kClosing) CloseNow(c);
}

void KvReceiver::Impl::Close(Conn& c, const absl::Status& status) {
  if (!c.fd.valid() || c.phase == ConnPhase::kClosing) return;
  if (c.phase == ConnPhase::kHandshake) {
    LogLine(absl::StrCat("KV receiver: refused connection from ", c.peer, ": ", status.ToString()));
  } else if (!status.ok()) {
    bool superseded;
    {
      absl::MutexLock l(&mu_);
      superseded = c.transfer->state == TransferState::kReceiving && c.transfer->conn_id != c.id;
    }
    if (superseded) {
      LogLine(
          absl::StrCat("KV receiver: closed connection from ", c.peer, ": ", status.ToString()));
    }
  }
  if (status.ok()) {
    CloseNow(c);
    return;
  }
  c.phase = ConnPhase::kClosing;
  c.deadline = tcp::DeadlineIn(kControlSendMs);
  Queue(c, wire::EncodeReject(status));
}

void KvReceiver::Impl::CloseNow(Conn& c) {
  c.fd.Reset();
  c.transfer.reset();
}

}  // namespace tandem::kvtransfer
