// KvReceiver's device transports (nccl, cuda_ipc; data_plane.h): the
// HELLO's transport checks, KvDataReceiver::OpenTransfer / Receive /
// CloseTransfer, FRAME_DESC, and the ACK that ends a device transfer
// (receiver_impl.h has the lifecycle and the threading rules).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtransfer/receiver_impl.h"

namespace tandem::kvtransfer {

using receiver_internal::DeviceAttempt;

KvDataReceiver* KvReceiver::Impl::DataReceiverFor(KvTransport transport) const {
  if (transport == KvTransport::kTcp) return nullptr;
  for (KvDataReceiver* d : options_.data_receivers) {
    if (d->transport() == transport) return d;
  }
  return nullptr;
}

absl::Status KvReceiver::Impl::CheckTransportLocked(const Transfer& t, const wire::Hello& hello,
                                                    std::shared_ptr<DeviceAttempt>* a) {
  a->reset();
  absl::StatusOr<KvTransport> chosen = ParseKvTransport(hello.transport);
  if (!chosen.ok()) return chosen.status();
  absl::Status accepted = CheckTransportAccepted(*chosen, offered_);
  if (!accepted.ok() || *chosen == KvTransport::kTcp) return accepted;
  if (t.writer->device_target() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this decode worker's KV cache is not on a device (transport ", hello.transport, ")"));
  }
  // Start() made sure there is one for every offered device transport.
  auto attempt = std::make_shared<DeviceAttempt>();
  attempt->key = TransferKey{hello.request_id, hello.attempt};
  attempt->data = DataReceiverFor(*chosen);
  *a = std::move(attempt);
  return absl::OkStatus();
}

absl::Status KvReceiver::Impl::OpenDevice(const std::shared_ptr<Transfer>& t,
                                          const wire::Hello& hello) {
  std::shared_ptr<DeviceAttempt> a;
  {
    absl::MutexLock l(&mu_);
    a = t->device;
  }
  // Transfer::writing is set: the transfer (and its writer) stays put.
  absl::Status opened =
      a->data->OpenTransfer(a->key, hello.transport_setup, *t->writer->device_target());
  absl::MutexLock l(&mu_);
  t->writing = false;
  if (!opened.ok()) {
    EndLocked(t, absl::Status(opened.code(),
                              absl::StrCat("KV receiver rejects request ", hello.request_id,
                                           " attempt ", hello.attempt, ": ", opened.message())));
  } else {
    a->opened = true;
  }
  if (t->state == TransferState::kReceiving) return absl::OkStatus();
  // Ended meanwhile (cancelled) or refused: an opened attempt is closed,
  // and `done` waits for it.
  CloseAttemptLocked(t, a);
  MaybeCompleteLocked(t);
  return t->status;
}

void KvReceiver::Impl::OnFrameDesc(Conn& c) {
  const std::shared_ptr<Transfer> t = c.transfer;
  if (c.transport == KvTransport::kTcp) {
    FailTransfer(c, absl::DataLossError(
                        absl::StrCat("bad KV frame for request ", c.hello.request_id, " attempt ",
                                     c.hello.attempt, ": FRAME_DESC on a tcp transfer")));
    return;
  }
  absl::StatusOr<FrameDescriptor> desc = wire::DecodeFrameDesc(c.reader.payload());
  absl::Status s = desc.status();
  if (s.ok()) {
    s = CheckFrameRange(
        *t, c.hello,
        {desc->request_id, desc->attempt, desc->layer, desc->token_start, desc->token_count});
  }
  if (!s.ok()) {
    FailTransfer(c, std::move(s));
    return;
  }
  const uint64_t bytes = layout_.FrameBytes(desc->token_count);
  std::shared_ptr<DeviceAttempt> a;
  {
    absl::MutexLock l(&mu_);
    if (!OwnsLocked(*t, c)) {
      s = LostLocked(*t, c.hello);
    } else {
      a = t->device;
      ++a->outstanding;
      ++outstanding_total_;
      if (!t->any_frame) {
        t->any_frame = true;
        t->first_frame_at = Clock::now();
      }
      // FINAL's totals count descriptors as frames, FrameBytes as bytes.
      t->progress.Add(desc->layer, desc->token_start - t->hit_tokens, desc->token_count, bytes);
    }
  }
  if (!s.ok()) {
    Close(c, s);
    return;
  }
  // mu_ released: `done` may run on any thread, even before Receive
  // returns. A CloseTransfer queued meanwhile is made after this call (both
  // on this thread), so the data receiver sees Receive first.
  a->data->Receive(a->key, *desc, [this, t, a, bytes](absl::Status status) {
    OnReceived(t, a, bytes, std::move(status));
  });
}

void KvReceiver::Impl::OnReceived(const std::shared_ptr<Transfer>& t,
                                  const std::shared_ptr<DeviceAttempt>& a, uint64_t bytes,
                                  absl::Status status) {
  absl::MutexLock l(&mu_);
  --a->outstanding;
  --outstanding_total_;
  if (status.ok()) bytes_[static_cast<size_t>(a->data->transport())].fetch_add(bytes);
  // An attempt that was superseded or a transfer that already ended: its
  // frames no longer decide anything.
  if (t->device != a || t->state != TransferState::kReceiving) return;
  if (!status.ok()) {
    // The connection learns it through the kick (REJECT with this status).
    EndLocked(t, absl::Status(status.code(),
                              absl::StrCat("KV transfer for request ", t->request_id, " attempt ",
                                           t->attempt, ": receiving a frame on ",
                                           std::string(KvTransportName(t->transport)),
                                           " failed: ", status.message())));
    return;
  }
  if (t->final_ok && a->outstanding == 0) SucceedLocked(t);
}

void KvReceiver::Impl::SucceedLocked(const std::shared_ptr<Transfer>& t) {
  // OK ends it like any other status: its connection is kicked (it sends
  // ACK, HandleKicks), the attempt is closed, `done` waits for quiesced.
  EndLocked(t, absl::OkStatus());
}

void KvReceiver::Impl::OnQuiesced(const std::shared_ptr<Transfer>& t) {
  absl::MutexLock l(&mu_);
  --t->quiescing;
  --quiesce_pending_;
  MaybeCompleteLocked(t);
}

void KvReceiver::Impl::CloseAttemptLocked(const std::shared_ptr<Transfer>& t,
                                          const std::shared_ptr<DeviceAttempt>& a) {
  if (a == nullptr || !a->opened || a->closing) return;
  a->closing = true;
  ++t->quiescing;
  ++quiesce_pending_;
  pending_closes_.emplace_back(t, a);
  Wake();
}

void KvReceiver::Impl::RunCloses() {
  std::vector<std::pair<std::shared_ptr<Transfer>, std::shared_ptr<DeviceAttempt>>> closes;
  {
    absl::MutexLock l(&mu_);
    closes.swap(pending_closes_);
  }
  for (auto& [t, a] : closes) {
    a->data->CloseTransfer(a->key, [this, t = t] { OnQuiesced(t); });
  }
}

void KvReceiver::Impl::SendAck(Conn& c) {
  if (!c.fd.valid() || c.phase == ConnPhase::kClosing) return;
  c.phase = ConnPhase::kClosing;
  c.deadline = tcp::DeadlineIn(receiver_internal::kControlSendMs);
  Queue(c, wire::EncodeAck());
}

}  // namespace tandem::kvtransfer
