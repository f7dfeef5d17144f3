// KvReceiver lifecycle: Start, Expect/Cancel/CancelAttempt, ending
// transfers, the completion thread, and the public API (receiver_impl.h has
// the design notes; receiver_loop.cc the I/O thread).
#include <sys/eventfd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtransfer/receiver_impl.h"

namespace tandem::kvtransfer {

using tcp::Clock;

KvReceiver::Impl::Impl(const Options& options, const KvLayout& layout, tcp::ScopedFd listen_fd,
                       int port, tcp::ScopedFd wake_fd)
    : options_(options),
      layout_(layout),
      listen_fd_(std::move(listen_fd)),
      port_(port),
      wake_fd_(std::move(wake_fd)),
      offered_(options.transports.empty() ? std::vector<KvTransport>{KvTransport::kTcp}
                                          : options.transports) {
  io_ = std::thread([this] { IoLoop(); });
  completion_ = std::thread([this] { CompletionLoop(); });
}

KvReceiver::Impl::~Impl() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    std::vector<std::shared_ptr<Transfer>> live;
    for (auto& [id, t] : transfers_) live.push_back(t);
    for (auto& t : live) {
      EndLocked(
          t, absl::CancelledError(absl::StrCat("KV receiver shutting down; transfer for request ",
                                               t->request_id, " cancelled")));
    }
  }
  Wake();
  // The I/O thread completes a transfer whose write was in flight, sends
  // what REJECTs it can and closes every connection before it returns.
  io_.join();
  // Device transfers: the I/O thread made every CloseTransfer queued so
  // far (RunCloses here is a safety net); wait for every Receive `done`
  // and `quiesced` (their callbacks touch this object), so that each
  // transfer's `done` is queued.
  for (;;) {
    RunCloses();
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(this, &Impl::DataPlaneIdleOrCloseLocked));
    if (DataPlaneIdleLocked()) break;
  }
  {
    absl::MutexLock l(&mu_);
    completion_stop_ = true;
  }
  // Runs every queued `done` before it returns.
  completion_.join();
}

absl::Status KvReceiver::Impl::Expect(const std::string& request_id, uint32_t attempt,
                                      uint32_t hit_tokens, uint32_t prompt_len, KvWriter* writer,
                                      DoneCallback done) {
  if (writer == nullptr || !done) {
    return absl::InvalidArgumentError("KvReceiver::Expect needs a writer and a done callback");
  }
  if (hit_tokens > prompt_len) {
    return absl::InvalidArgumentError(absl::StrCat("KV transfer for request ", request_id,
                                                   ": hit_tokens ", hit_tokens, " > prompt_len ",
                                                   prompt_len));
  }
  auto t = std::make_shared<Transfer>();
  t->request_id = request_id;
  t->hit_tokens = hit_tokens;
  t->prompt_len = prompt_len;
  t->writer = writer;
  t->done = std::move(done);
  t->attempt = attempt;
  t->handshake_deadline = tcp::DeadlineIn(options_.handshake_timeout_ms);
  {
    absl::MutexLock l(&mu_);
    if (stopping_) {
      return absl::UnavailableError("KV receiver is shutting down");
    }
    if (transfers_.count(request_id) != 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("a KV transfer for request ", request_id, " is already expected"));
    }
    finished_.erase(request_id);
    transfers_[request_id] = std::move(t);
    in_flight_.fetch_add(1);
  }
  Wake();  // a new handshake deadline to watch
  return absl::OkStatus();
}

void KvReceiver::Impl::Cancel(const std::string& request_id) {
  absl::MutexLock l(&mu_);
  auto it = transfers_.find(request_id);
  if (it == transfers_.end()) return;
  EndLocked(it->second, absl::CancelledError(
                            absl::StrCat("KV transfer for request ", request_id, " cancelled")));
}

absl::Status KvReceiver::Impl::CancelAttempt(const std::string& request_id, uint32_t attempt,
                                             const std::string& reason) {
  absl::MutexLock l(&mu_);
  auto it = transfers_.find(request_id);
  if (it == transfers_.end() || it->second->attempt != attempt ||
      (it->second->state != TransferState::kAwaitingHello &&
       it->second->state != TransferState::kReceiving)) {
    return absl::NotFoundError(
        absl::StrCat("no live KV transfer for request ", request_id, " attempt ", attempt));
  }
  EndLocked(it->second,
            absl::CancelledError(absl::StrCat("KV transfer for request ", request_id, " attempt ",
                                              attempt, " cancelled: ", reason)));
  return absl::OkStatus();
}

void KvReceiver::Impl::EndLocked(std::shared_ptr<Transfer> t, absl::Status status) {
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
  if (t->conn_id != 0) KickLocked(t->conn_id);
  if (t->device != nullptr) CloseAttemptLocked(t, t->device);
  MaybeCompleteLocked(t);
}

void KvReceiver::Impl::MaybeCompleteLocked(const std::shared_ptr<Transfer>& t) {
  if (t->state == TransferState::kAborting && !t->writing && t->quiescing == 0) {
    CompleteLocked(t);
  }
}

void KvReceiver::Impl::CompleteLocked(std::shared_ptr<Transfer> t) {
  t->state = TransferState::kQuiesced;
  if (t->status.ok()) {
    ++transfers_completed_;
    if (t->any_frame) {
      t->result.stream_seconds =
          std::chrono::duration<double>(t->final_at - t->first_frame_at).count();
      transfer_seconds_ += t->result.stream_seconds;
    }
  }
  auto it = transfers_.find(t->request_id);
  if (it != transfers_.end() && it->second == t) transfers_.erase(it);
  finished_[t->request_id] = Finished{t->attempt, t->status.code(), Clock::now()};
  completions_.push_back(std::move(t));
  in_flight_.fetch_sub(1);
}

void KvReceiver::Impl::KickLocked(uint64_t conn_id) {
  kicked_.push_back(conn_id);
  Wake();
}

absl::Status KvReceiver::Impl::LostLocked(const Transfer& t, const wire::Hello& hello) const {
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
  return absl::AbortedError(absl::StrCat("KV transfer for request ", hello.request_id, " attempt ",
                                         hello.attempt, " superseded by attempt ", t.attempt));
}

void KvReceiver::Impl::CompletionLoop() {
  for (;;) {
    std::shared_ptr<Transfer> t;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &Impl::CompletionReadyLocked));
      if (completions_.empty()) return;  // stopping, and nothing left to run
      t = std::move(completions_.front());
      completions_.pop_front();
    }
    // QUIESCED: nothing touches done/status/result any more.
    if (!t->status.ok()) {
      LogLine(absl::StrCat("KV receiver: transfer for request ", t->request_id, " attempt ",
                           t->attempt, " failed: ", t->status.ToString()));
    }
    t->done(t->status, t->result);
    absl::MutexLock l(&mu_);
    t->state = TransferState::kFreed;
    t->done = nullptr;
  }
}

void KvReceiver::Impl::LogLine(const std::string& line) const {
  if (options_.log) options_.log(line);
}

// ---- KvReceiver -----------------------------------------------------------

absl::StatusOr<std::unique_ptr<KvReceiver>> KvReceiver::Start(const Options& options,
                                                              const KvLayout& layout) {
  if (layout.n_layers == 0 || layout.n_kv_heads == 0 || layout.head_dim == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout needs n_layers, n_kv_heads, head_dim > 0, got ", layout.n_layers,
                     ", ", layout.n_kv_heads, ", ", layout.head_dim));
  }
  // Any known dtype will do: D only moves the bytes into its writer.
  if (!IsKnownKvDtype(static_cast<uint32_t>(layout.dtype))) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout dtype ", static_cast<uint32_t>(layout.dtype),
                     " is not a known KvDtype (f32 = 0, f16 = 1, bf16 = 30)"));
  }
  if (options.handshake_timeout_ms <= 0 || options.transfer_timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV receiver timeouts must be > 0, got handshake_timeout_ms ", options.handshake_timeout_ms,
        ", transfer_timeout_ms ", options.transfer_timeout_ms));
  }
  for (KvTransport t : options.transports) {
    if (t == KvTransport::kTcp) continue;
    bool found = false;
    for (const KvDataReceiver* d : options.data_receivers) {
      found = found || (d != nullptr && d->transport() == t);
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvReceiver: transports offers ", std::string(KvTransportName(t)),
                       " but data_receivers has no KvDataReceiver for it"));
    }
  }
  for (const KvDataReceiver* d : options.data_receivers) {
    if (d == nullptr) {
      return absl::InvalidArgumentError("KvReceiver: data_receivers holds a null entry");
    }
  }
  tcp::ScopedFd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake.valid()) {
    return absl::UnavailableError(
        absl::StrCat("KV receiver cannot create its eventfd: ", std::strerror(errno)));
  }
  int bound = 0;
  absl::StatusOr<tcp::ScopedFd> fd = tcp::Listen(options.host, options.port, &bound);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<KvReceiver>(new KvReceiver(
      std::make_unique<Impl>(options, layout, std::move(*fd), bound, std::move(wake))));
}

KvReceiver::KvReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvReceiver::~KvReceiver() = default;

int KvReceiver::port() const { return impl_->port(); }

absl::Status KvReceiver::Expect(const std::string& request_id, uint32_t attempt,
                                uint32_t hit_tokens, uint32_t prompt_len, KvWriter* writer,
                                DoneCallback done) {
  return impl_->Expect(request_id, attempt, hit_tokens, prompt_len, writer, std::move(done));
}

void KvReceiver::Cancel(const std::string& request_id) { impl_->Cancel(request_id); }

absl::Status KvReceiver::CancelAttempt(const std::string& request_id, uint32_t attempt,
                                       std::string reason) {
  return impl_->CancelAttempt(request_id, attempt, reason);
}

uint32_t KvReceiver::transfers_in_flight() const { return impl_->in_flight(); }

uint64_t KvReceiver::kv_bytes_received_total() const { return impl_->bytes_total(); }

uint64_t KvReceiver::kv_bytes_received(KvTransport transport) const {
  return impl_->bytes(transport);
}

double KvReceiver::transfer_seconds_total() const { return impl_->transfer_seconds_total(); }

uint64_t KvReceiver::transfers_completed_total() const {
  return impl_->transfers_completed_total();
}

uint64_t KvReceiver::Impl::bytes_total() const {
  uint64_t sum = 0;
  for (const auto& b : bytes_) sum += b.load();
  return sum;
}

double KvReceiver::Impl::transfer_seconds_total() const {
  absl::MutexLock l(&mu_);
  return transfer_seconds_;
}

uint64_t KvReceiver::Impl::transfers_completed_total() const {
  absl::MutexLock l(&mu_);
  return transfers_completed_;
}

}  // namespace tandem::kvtransfer
