// One KV connection's messages, on KvReceiver's I/O thread: HELLO ->
// ACCEPT/REJECT, then FRAMEs checked and written (FRAME_DESCs:
// receiver_device.cc), then FINAL checked (receiver_impl.h has the
// lifecycle and locking notes).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtransfer/hello_auth.h"
#include "kvtransfer/receiver_impl.h"

namespace tandem::kvtransfer {

// KvWriter::WriteRows promises max_align_t alignment; std::vector<char>
// gets its buffer from ::operator new, which aligns to this.
static_assert(__STDCPP_DEFAULT_NEW_ALIGNMENT__ >= alignof(std::max_align_t));

void KvReceiver::Impl::OnMessage(Conn& c) {
  if (c.phase == ConnPhase::kHandshake) {
    OnHello(c);
    return;
  }
  const uint32_t type = c.reader.type();
  if (c.final_seen) {
    // A device transfer waiting for its Receives after FINAL.
    FailTransfer(
        c, absl::DataLossError(absl::StrCat("unexpected KV message ", wire::MessageTypeName(type),
                                            " after FINAL for request ", c.hello.request_id)));
  } else if (type == static_cast<uint32_t>(wire::MessageType::kFrame)) {
    OnFrame(c);
  } else if (type == static_cast<uint32_t>(wire::MessageType::kFrameDesc)) {
    OnFrameDesc(c);
  } else if (type == static_cast<uint32_t>(wire::MessageType::kFinal)) {
    OnFinal(c);
  } else if (type == static_cast<uint32_t>(wire::MessageType::kKeepalive)) {
    // The sender is alive and has nothing to send yet (the request waits
    // for its turn on P); its bytes already moved the silence deadline.
    if (absl::Status s = wire::DecodeKeepalive(c.reader.payload()); !s.ok()) {
      FailTransfer(c, s);
    }
  } else {
    FailTransfer(
        c, absl::DataLossError(absl::StrCat("unexpected KV message ", wire::MessageTypeName(type),
                                            " mid-transfer for request ", c.hello.request_id)));
  }
}

void KvReceiver::Impl::OnHello(Conn& c) {
  wire::Hello hello;
  std::shared_ptr<Transfer> t;
  absl::Status s = Handshake(c, &hello, &t);
  if (s.ok() && hello.transport != KvTransportName(KvTransport::kTcp)) {
    s = OpenDevice(t, hello);
  }
  if (!s.ok()) {
    Close(c, s);
    return;
  }
  c.transport = *ParseKvTransport(hello.transport);  // checked by Handshake
  // The largest legal message from now on is a FRAME over all of [hit, L)
  // (FrameBytes is in the layout's dtype), or a FRAME_DESC with the
  // longest locator.
  c.max_payload = std::max<uint64_t>(wire::kMaxControlPayload,
                                     c.transport == KvTransport::kTcp
                                         ? wire::FrameFieldsBytes(hello.request_id.size()) +
                                               layout_.FrameBytes(t->prompt_len - t->hit_tokens)
                                         : wire::MaxFrameDescBytes(hello.request_id.size()));
  c.phase = ConnPhase::kReceiving;
  c.deadline = tcp::DeadlineIn(options_.transfer_timeout_ms);
  const std::string answer = AcceptAnswer(options_.auth, hello);
  c.hello = std::move(hello);
  c.transfer = std::move(t);
  Queue(c, wire::EncodeAccept(answer));
}

absl::Status KvReceiver::Impl::Handshake(const Conn& c, wire::Hello* hello,
                                         std::shared_ptr<Transfer>* out) {
  const uint32_t type = c.reader.type();
  if (type != static_cast<uint32_t>(wire::MessageType::kHello)) {
    return absl::DataLossError(
        absl::StrCat("KV connection must start with HELLO, got ", wire::MessageTypeName(type)));
  }
  absl::StatusOr<wire::Hello> decoded = wire::DecodeHello(c.reader.payload(), hello);
  // A HELLO refused for its content (an unknown dtype) was read in full, so
  // it still names a transfer; every other decode failure (another protocol
  // version, malformed bytes) names nothing we can trust.
  const bool named = decoded.ok() || (absl::IsFailedPrecondition(decoded.status()) &&
                                      hello->protocol_version == kKvProtocolVersion);
  if (!named) return decoded.status();
  const std::string& id = hello->request_id;
  // An unauthenticated HELLO must not touch any transfer (nor end one).
  if (absl::Status authentic = VerifyHello(options_.auth, *hello); !authentic.ok()) {
    return absl::Status(authentic.code(),
                        absl::StrCat("KV receiver rejects request ", id, " attempt ",
                                     hello->attempt, ": ", authentic.message()));
  }
  absl::Status refused;
  if (!decoded.ok()) {
    refused = absl::FailedPreconditionError(absl::StrCat("KV receiver rejects request ", id,
                                                         " attempt ", hello->attempt, ": ",
                                                         decoded.status().message()));
  }
  // The peer hears about a refused HELLO whatever else is wrong with it;
  // the transfer is ended by it only below, where this attempt may take it.
  auto unless_refused = [&](absl::Status s) { return refused.ok() ? s : refused; };

  absl::MutexLock l(&mu_);
  if (stopping_) return absl::UnavailableError("KV receiver is shutting down");
  auto it = transfers_.find(id);
  if (it == transfers_.end()) {
    auto f = finished_.find(id);
    if (f != finished_.end()) {
      return unless_refused(absl::AbortedError(
          absl::StrCat("KV transfer for request ", id, " attempt ", f->second.attempt,
                       " already finished (", absl::StatusCodeToString(f->second.code), ")")));
    }
    return unless_refused(absl::NotFoundError(absl::StrCat("no KV transfer expected for request ",
                                                           id, " (attempt ", hello->attempt, ")")));
  }
  std::shared_ptr<Transfer> t = it->second;
  switch (t->state) {
    case TransferState::kAwaitingHello:
    case TransferState::kReceiving:
      break;
    case TransferState::kAborting:
    case TransferState::kQuiesced:
    case TransferState::kFreed:
      return unless_refused(
          absl::AbortedError(absl::StrCat("KV transfer for request ", id, " is being aborted")));
  }
  // A stale or duplicate sender must not end the live transfer, whatever
  // it says.
  if (hello->attempt < t->attempt) {
    return unless_refused(
        absl::AbortedError(absl::StrCat("KV transfer for request ", id, ": attempt ",
                                        hello->attempt, " is older than attempt ", t->attempt)));
  }
  if (hello->attempt == t->attempt && t->conn_id != 0) {
    return unless_refused(
        absl::AbortedError(absl::StrCat("KV transfer for request ", id, " attempt ", hello->attempt,
                                        " already has a live connection")));
  }
  if (!refused.ok()) {
    EndLocked(t, refused);
    return refused;
  }
  absl::Status compatible = CheckCompatible(layout_, hello->layout);
  std::shared_ptr<receiver_internal::DeviceAttempt> device;
  if (compatible.ok()) compatible = CheckTransportLocked(*t, *hello, &device);
  if (!compatible.ok()) {
    absl::Status rejected =
        absl::FailedPreconditionError(absl::StrCat("KV receiver rejects request ", id, " attempt ",
                                                   hello->attempt, ": ", compatible.message()));
    EndLocked(t, rejected);
    return rejected;
  }
  // Take over: the older connection (if any) is closed with REJECT ABORTED
  // and its partial bytes are discarded. No write of it is in flight: only
  // this (the I/O) thread writes. An older device attempt is closed on its
  // data path; the transfer's `done` waits for its `quiesced`.
  if (t->conn_id != 0) KickLocked(t->conn_id);
  if (t->device != nullptr) CloseAttemptLocked(t, t->device);
  t->conn_id = c.id;
  t->attempt = hello->attempt;
  t->state = TransferState::kReceiving;
  t->progress.Reset(layout_.n_layers, t->prompt_len - t->hit_tokens);
  t->result = TransferResult{};
  t->result.peer_bit_exact_class = hello->bit_exact_class;
  t->transport = device != nullptr ? device->data->transport() : KvTransport::kTcp;
  t->device = std::move(device);
  t->final_ok = false;
  t->any_frame = false;
  // The I/O thread calls OpenTransfer next (OnHello, mu_ released).
  if (t->device != nullptr) t->writing = true;
  *out = std::move(t);
  return absl::OkStatus();
}

absl::Status KvReceiver::Impl::CheckFrame(const Transfer& t, const wire::Hello& hello,
                                          const wire::FrameView& f) const {
  const wire::FrameHeader& h = f.header;
  absl::Status s = CheckFrameRange(t, hello, h);
  if (!s.ok()) return s;
  const uint64_t want = layout_.FrameBytes(h.token_count);
  if (f.kv.size() != want) {
    return absl::DataLossError(absl::StrCat("bad KV frame for request ", hello.request_id,
                                            " attempt ", hello.attempt, ": K+V payload is ",
                                            f.kv.size(), " bytes, expected ", want, " for ",
                                            h.token_count, " tokens"));
  }
  return absl::OkStatus();
}

absl::Status KvReceiver::Impl::CheckFrameRange(const Transfer& t, const wire::Hello& hello,
                                               const wire::FrameHeader& h) const {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("bad KV frame for request ", hello.request_id,
                                            " attempt ", hello.attempt, ": ", why));
  };
  if (h.request_id != hello.request_id) {
    return bad(absl::StrCat("request_id '", h.request_id, "' != '", hello.request_id, "'"));
  }
  if (h.attempt != hello.attempt) {
    return bad(absl::StrCat("attempt ", h.attempt, " != ", hello.attempt));
  }
  if (h.layer >= layout_.n_layers) {
    return bad(absl::StrCat("layer ", h.layer, " >= n_layers ", layout_.n_layers));
  }
  if (h.token_count == 0) return bad("token_count 0");
  if (h.token_start < t.hit_tokens) {
    return bad(absl::StrCat("token_start ", h.token_start, " < hit_tokens ", t.hit_tokens));
  }
  const uint64_t end = uint64_t{h.token_start} + h.token_count;
  if (end > t.prompt_len) {
    return bad(absl::StrCat("token_start ", h.token_start, " + token_count ", h.token_count, " = ",
                            end, " > prompt_len ", t.prompt_len));
  }
  return absl::OkStatus();
}

absl::Status KvReceiver::Impl::CheckFinalLocked(const Transfer& t, const wire::Hello& hello,
                                                const TransferResult& final_msg) const {
  const receiver_internal::Progress& p = t.progress;
  if (final_msg.frames != p.frames || final_msg.kv_bytes != p.bytes) {
    return absl::DataLossError(absl::StrCat(
        "KV transfer for request ", hello.request_id, ": FINAL reports ", final_msg.frames,
        " frames / ", final_msg.kv_bytes, " bytes, received ", p.frames, " / ", p.bytes));
  }
  const uint32_t span = t.prompt_len - t.hit_tokens;
  for (uint32_t layer = 0; layer < layout_.n_layers; ++layer) {
    if (p.covered_count[layer] != span) {
      return absl::DataLossError(absl::StrCat("KV transfer for request ", hello.request_id,
                                              " incomplete at FINAL: layer ", layer, " covers ",
                                              p.covered_count[layer], " of ", span, " tokens [",
                                              t.hit_tokens, ", ", t.prompt_len, ")"));
    }
  }
  return absl::OkStatus();
}

void KvReceiver::Impl::FailTransfer(Conn& c, absl::Status status) {
  {
    absl::MutexLock l(&mu_);
    if (OwnsLocked(*c.transfer, c)) {
      EndLocked(c.transfer, status);
    } else {
      status = LostLocked(*c.transfer, c.hello);
    }
  }
  Close(c, status);
}

void KvReceiver::Impl::OnFinal(Conn& c) {
  absl::StatusOr<TransferResult> final_msg = wire::DecodeFinal(c.reader.payload());
  const std::shared_ptr<Transfer> t = c.transfer;
  absl::Status s;
  bool ack = false;  // a device transfer that is complete now
  {
    absl::MutexLock l(&mu_);
    if (!OwnsLocked(*t, c)) {
      s = LostLocked(*t, c.hello);
    } else {
      s = final_msg.ok() ? CheckFinalLocked(*t, c.hello, *final_msg) : final_msg.status();
      if (s.ok()) {
        // FINAL carries no class: keep the one from this attempt's HELLO.
        // The samples move through to `done` as decoded.
        std::string peer_class = std::move(t->result.peer_bit_exact_class);
        t->result = std::move(*final_msg);
        t->result.peer_bit_exact_class = std::move(peer_class);
        t->final_at = Clock::now();
      }
      if (!s.ok() || t->device == nullptr) {
        EndLocked(t, s);
      } else {
        // Device: done once every Receive reported (OnReceived).
        t->final_ok = true;
        c.final_seen = true;
        ack = t->device->outstanding == 0;
        if (ack) SucceedLocked(t);
      }
    }
  }
  if (ack) {
    SendAck(c);
    return;
  }
  // A device transfer waiting for its Receives keeps its connection (the
  // silence deadline still applies); OnReceived ends it.
  if (c.final_seen) return;
  Close(c, s);  // tcp OK: closed without a word, as the sender expects
}

void KvReceiver::Impl::OnFrame(Conn& c) {
  if (c.transport != KvTransport::kTcp) {
    FailTransfer(c, absl::DataLossError(absl::StrCat(
                        "bad KV frame for request ", c.hello.request_id, " attempt ",
                        c.hello.attempt, ": FRAME on a ", std::string(KvTransportName(c.transport)),
                        " transfer (its frames come as FRAME_DESC)")));
    return;
  }
  absl::StatusOr<wire::FrameView> frame = wire::DecodeFrame(c.reader.payload());
  absl::Status s = frame.ok() ? CheckFrame(*c.transfer, c.hello, *frame) : frame.status();
  if (!s.ok()) {
    FailTransfer(c, std::move(s));
    return;
  }
  const std::shared_ptr<Transfer> t = c.transfer;
  {
    absl::MutexLock l(&mu_);
    if (!OwnsLocked(*t, c)) s = LostLocked(*t, c.hello);
    // Set under the lock that saw it RECEIVING: an abort from now on waits
    // for the write (ABORTING), and this thread completes it below.
    if (s.ok()) t->writing = true;
  }
  if (!s.ok()) {
    Close(c, s);
    return;
  }
  // K and V are copied out of the payload (where they sit at an offset
  // that depends on the request_id length) so that the writer gets them
  // aligned for any element type (KvWriter::WriteRows).
  const wire::FrameHeader& h = frame->header;
  const size_t half = frame->kv.size() / 2;
  k_.resize(half);
  v_.resize(half);
  std::memcpy(k_.data(), frame->kv.data(), half);
  std::memcpy(v_.data(), frame->kv.data() + half, half);
  t->writer->WriteRows(h.layer, h.token_start, h.token_count, k_.data(), v_.data());
  {
    absl::MutexLock l(&mu_);
    t->writing = false;
    if (t->state == TransferState::kAborting) {
      MaybeCompleteLocked(t);
      s = t->status;
    } else if (!OwnsLocked(*t, c)) {
      s = LostLocked(*t, c.hello);
    } else {
      if (!t->any_frame) {
        t->any_frame = true;
        t->first_frame_at = Clock::now();
      }
      t->progress.Add(h.layer, h.token_start - t->hit_tokens, h.token_count, frame->kv.size());
      bytes_[static_cast<size_t>(KvTransport::kTcp)].fetch_add(frame->kv.size());
    }
  }
  if (!s.ok()) Close(c, s);
}

}  // namespace tandem::kvtransfer
