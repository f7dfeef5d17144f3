// KvReceiver lifecycle: Expect/Cancel, ending transfers, the acceptor and
// the reaper, and the public API (receiver_impl.h has the design notes).
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtransfer/receiver_impl.h"

namespace tandem::kvtransfer {

using receiver_internal::kFinishedMemory;
using receiver_internal::kAcceptSliceMs;
using receiver_internal::kReaperMaxSleep;
using tcp::Clock;

KvReceiver::Impl::~Impl() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    std::vector<std::shared_ptr<Transfer>> live;
    for (auto& [id, t] : transfers_) live.push_back(t);
    for (auto& t : live) {
      EndLocked(t, absl::CancelledError(absl::StrCat(
                       "KV receiver shutting down; transfer for request ",
                       t->request_id, " cancelled")));
    }
    for (auto& [id, c] : conns_) KickLocked(id, SHUT_RDWR);
  }
  ::shutdown(listen_fd_.get(), SHUT_RDWR);
  acceptor_.join();
  std::map<uint64_t, std::unique_ptr<Conn>> conns;
  {
    absl::MutexLock l(&mu_);
    conns.swap(conns_);
  }
  for (auto& [id, c] : conns) c->thread.join();
  {
    absl::MutexLock l(&mu_);
    reaper_stop_ = true;
    reaper_wake_.Signal();
  }
  reaper_.join();
}

absl::Status KvReceiver::Impl::Expect(const std::string& request_id,
                                      uint32_t attempt, uint32_t hit_tokens,
                                      uint32_t prompt_len, KvWriter* writer,
                                      DoneCallback done) {
  if (writer == nullptr || !done) {
    return absl::InvalidArgumentError("KvReceiver::Expect needs a writer and a done callback");
  }
  if (hit_tokens > prompt_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV transfer for request ", request_id, ": hit_tokens ",
                     hit_tokens, " > prompt_len ", prompt_len));
  }
  auto t = std::make_shared<Transfer>();
  t->request_id = request_id;
  t->hit_tokens = hit_tokens;
  t->prompt_len = prompt_len;
  t->writer = writer;
  t->done = std::move(done);
  t->attempt = attempt;
  t->handshake_deadline = tcp::DeadlineIn(options_.handshake_timeout_ms);

  absl::MutexLock l(&mu_);
  if (stopping_) {
    return absl::UnavailableError("KV receiver is shutting down");
  }
  if (transfers_.count(request_id) != 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "a KV transfer for request ", request_id, " is already expected"));
  }
  finished_.erase(request_id);
  transfers_[request_id] = std::move(t);
  in_flight_.fetch_add(1);
  reaper_wake_.Signal();
  return absl::OkStatus();
}

void KvReceiver::Impl::Cancel(const std::string& request_id) {
  absl::MutexLock l(&mu_);
  auto it = transfers_.find(request_id);
  if (it == transfers_.end()) return;
  EndLocked(it->second,
            absl::CancelledError(absl::StrCat("KV transfer for request ",
                                              request_id, " cancelled")));
}

void KvReceiver::Impl::EndLocked(std::shared_ptr<Transfer> t,
                                 absl::Status status) {
  switch (t->state) {
    case TransferState::kAwaitingHello:
    case TransferState::kReceiving:
      break;
    case TransferState::kAborting:
    case TransferState::kQuiesced:
    case TransferState::kFreed:
      return;
  }
  t->status = std::move(status);
  t->state = TransferState::kAborting;
  if (t->conn_id != 0) KickLocked(t->conn_id, SHUT_RD);
  if (!t->writing) CompleteLocked(t);
}

void KvReceiver::Impl::CompleteLocked(std::shared_ptr<Transfer> t) {
  t->state = TransferState::kQuiesced;
  auto it = transfers_.find(t->request_id);
  if (it != transfers_.end() && it->second == t) transfers_.erase(it);
  finished_[t->request_id] = Finished{t->attempt, t->status.code(), Clock::now()};
  completions_.push_back(t);
  in_flight_.fetch_sub(1);
  reaper_wake_.Signal();
}

void KvReceiver::Impl::KickLocked(uint64_t conn_id, int how) {
  auto it = conns_.find(conn_id);
  if (it != conns_.end() && it->second->fd >= 0) ::shutdown(it->second->fd, how);
}

absl::Status KvReceiver::Impl::LostLocked(const Transfer& t,
                                          const wire::Hello& hello) const {
  switch (t.state) {
    case TransferState::kAborting:
    case TransferState::kQuiesced:
    case TransferState::kFreed:
      if (!t.status.ok()) return t.status;
      break;
    case TransferState::kAwaitingHello:
    case TransferState::kReceiving:
      break;
  }
  return absl::AbortedError(absl::StrCat(
      "KV transfer for request ", hello.request_id, " attempt ", hello.attempt,
      " superseded by attempt ", t.attempt));
}

void KvReceiver::Impl::AcceptLoop() {
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
    }
    absl::StatusOr<tcp::ScopedFd> fd =
        tcp::Accept(listen_fd_.get(), tcp::DeadlineIn(kAcceptSliceMs));
    if (!fd.ok()) {
      // Listener shut down (destructor) or a transient failure such as
      // EMFILE: re-check the stop flag after a short pause.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (!fd->valid()) continue;
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    auto c = std::make_unique<Conn>();
    c->id = ++next_conn_id_;
    c->fd = fd->Release();
    Conn* raw = c.get();
    int raw_fd = c->fd;
    conns_[c->id] = std::move(c);
    raw->thread = std::thread([this, raw, raw_fd] { Serve(raw, raw_fd); });
  }
}

void KvReceiver::Impl::ReaperLoop() {
  for (;;) {
    std::vector<std::shared_ptr<Transfer>> ready;
    std::vector<std::unique_ptr<Conn>> dead;
    {
      absl::MutexLock l(&mu_);
      const auto now = Clock::now();
      auto next = now + kReaperMaxSleep;
      std::vector<std::shared_ptr<Transfer>> expired;
      for (auto& [id, t] : transfers_) {
        if (t->state != TransferState::kAwaitingHello) continue;
        if (now >= t->handshake_deadline) {
          expired.push_back(t);
        } else {
          next = std::min(next, t->handshake_deadline);
        }
      }
      for (auto& t : expired) {
        EndLocked(t, absl::DeadlineExceededError(absl::StrCat(
                         "no KV sender said HELLO for request ", t->request_id,
                         " attempt ", t->attempt, " within ",
                         options_.handshake_timeout_ms, " ms")));
      }
      for (auto it = finished_.begin(); it != finished_.end();) {
        it = (now - it->second.at >= kFinishedMemory) ? finished_.erase(it)
                                                      : std::next(it);
      }
      for (auto it = conns_.begin(); it != conns_.end();) {
        if (it->second->finished) {
          dead.push_back(std::move(it->second));
          it = conns_.erase(it);
        } else {
          ++it;
        }
      }
      ready.swap(completions_);
      if (ready.empty() && dead.empty()) {
        if (reaper_stop_) return;
        reaper_wake_.WaitWithTimeout(&mu_, absl::FromChrono(next - now));
        continue;
      }
    }
    for (auto& c : dead) c->thread.join();
    for (auto& t : ready) {
      // QUIESCED: nothing touches done/status/result any more.
      t->done(t->status, t->result);
      absl::MutexLock l(&mu_);
      t->state = TransferState::kFreed;
      t->done = nullptr;
    }
  }
}

// ---- KvReceiver -----------------------------------------------------------

absl::StatusOr<std::unique_ptr<KvReceiver>> KvReceiver::Start(
    const Options& options, const KvLayout& layout) {
  if (layout.n_layers == 0 || layout.n_kv_heads == 0 || layout.head_dim == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout needs n_layers, n_kv_heads, head_dim > 0, got ",
        layout.n_layers, ", ", layout.n_kv_heads, ", ", layout.head_dim));
  }
  // Any known dtype will do: D only moves the bytes into its writer.
  if (!IsKnownKvDtype(static_cast<uint32_t>(layout.dtype))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout dtype ", static_cast<uint32_t>(layout.dtype),
        " is not a known KvDtype (f32 = 0, f16 = 1, bf16 = 30)"));
  }
  if (options.handshake_timeout_ms <= 0 || options.transfer_timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV receiver timeouts must be > 0, got handshake_timeout_ms ",
        options.handshake_timeout_ms, ", transfer_timeout_ms ",
        options.transfer_timeout_ms));
  }
  int bound = 0;
  absl::StatusOr<tcp::ScopedFd> fd = tcp::Listen(options.host, options.port, &bound);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<KvReceiver>(new KvReceiver(
      std::make_unique<Impl>(options, layout, std::move(*fd), bound)));
}

KvReceiver::KvReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvReceiver::~KvReceiver() = default;

int KvReceiver::port() const { return impl_->port(); }

absl::Status KvReceiver::Expect(const std::string& request_id, uint32_t attempt,
                                uint32_t hit_tokens, uint32_t prompt_len,
                                KvWriter* writer, DoneCallback done) {
  return impl_->Expect(request_id, attempt, hit_tokens, prompt_len, writer,
                       std::move(done));
}

void KvReceiver::Cancel(const std::string& request_id) {
  impl_->Cancel(request_id);
}

uint32_t KvReceiver::transfers_in_flight() const { return impl_->in_flight(); }

uint64_t KvReceiver::kv_bytes_received_total() const {
  return impl_->bytes_total();
}

}  // namespace tandem::kvtransfer

