// One KV connection of KvReceiver: HELLO -> ACCEPT/REJECT, then FRAMEs
// checked and written, then FINAL checked (receiver_impl.h has the
// lifecycle and locking notes).
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtransfer/receiver_impl.h"

namespace tandem::kvtransfer {

using receiver_internal::kControlSendMs;

// KvWriter::WriteRows promises max_align_t alignment; std::vector<char>
// gets its buffer from ::operator new, which aligns to this.
static_assert(__STDCPP_DEFAULT_NEW_ALIGNMENT__ >= alignof(std::max_align_t));

void KvReceiver::Impl::Serve(Conn* c, int fd) {
  std::string payload;
  wire::Hello hello;
  std::shared_ptr<Transfer> t;
  absl::Status reply = Handshake(*c, fd, &payload, &hello, &t);
  if (reply.ok()) {
    reply = tcp::SendAll(fd, wire::EncodeAccept(),
                         tcp::DeadlineIn(kControlSendMs));
    if (!reply.ok()) {
      absl::MutexLock l(&mu_);
      if (OwnsLocked(*t, *c)) EndLocked(t, reply);
    }
  }
  if (reply.ok()) reply = Receive(*c, fd, hello, t, &payload);
  if (!reply.ok()) SendReject(fd, reply);
  absl::MutexLock l(&mu_);
  ::close(fd);
  c->fd = -1;
  c->finished = true;
  reaper_wake_.Signal();
}

void KvReceiver::Impl::SendReject(int fd, const absl::Status& status) {
  // The peer may be gone already; nothing to do about a failure here.
  (void)tcp::SendAll(fd, wire::EncodeReject(status),
                     tcp::DeadlineIn(kControlSendMs));
}

absl::Status KvReceiver::Impl::Handshake(const Conn& c, int fd,
                                         std::string* payload,
                                         wire::Hello* hello,
                                         std::shared_ptr<Transfer>* out) {
  uint32_t type = 0;
  absl::Status s =
      tcp::ReadMessage(fd, tcp::DeadlineIn(options_.handshake_timeout_ms),
                       wire::kMaxControlPayload, &type, payload);
  if (!s.ok()) return s;
  if (type != static_cast<uint32_t>(wire::MessageType::kHello)) {
    return absl::DataLossError(absl::StrCat(
        "KV connection must start with HELLO, got ", wire::MessageTypeName(type)));
  }
  absl::StatusOr<wire::Hello> decoded = wire::DecodeHello(*payload, hello);
  // A HELLO refused for its content (an unknown dtype) was read in full, so
  // it still names a transfer; every other decode failure (another protocol
  // version, malformed bytes) names nothing we can trust.
  const bool named = decoded.ok() ||
                     (absl::IsFailedPrecondition(decoded.status()) &&
                      hello->protocol_version == kKvProtocolVersion);
  if (!named) return decoded.status();
  const std::string& id = hello->request_id;
  absl::Status refused;
  if (!decoded.ok()) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        "KV receiver rejects request ", id, " attempt ", hello->attempt, ": ",
        decoded.status().message()));
  }
  // The peer hears about a refused HELLO whatever else is wrong with it;
  // the transfer is ended by it only below, where this attempt may take it.
  auto unless_refused = [&](absl::Status s) {
    return refused.ok() ? s : refused;
  };

  absl::MutexLock l(&mu_);
  if (stopping_) return absl::UnavailableError("KV receiver is shutting down");
  auto it = transfers_.find(id);
  if (it == transfers_.end()) {
    auto f = finished_.find(id);
    if (f != finished_.end()) {
      return unless_refused(absl::AbortedError(absl::StrCat(
          "KV transfer for request ", id, " attempt ", f->second.attempt,
          " already finished (", absl::StatusCodeToString(f->second.code), ")")));
    }
    return unless_refused(absl::NotFoundError(absl::StrCat(
        "no KV transfer expected for request ", id, " (attempt ",
        hello->attempt, ")")));
  }
  std::shared_ptr<Transfer> t = it->second;
  switch (t->state) {
    case TransferState::kAwaitingHello:
    case TransferState::kReceiving:
      break;
    case TransferState::kAborting:
    case TransferState::kQuiesced:
    case TransferState::kFreed:
      return unless_refused(absl::AbortedError(
          absl::StrCat("KV transfer for request ", id, " is being aborted")));
  }
  // A stale or duplicate sender must not end the live transfer, whatever
  // it says.
  if (hello->attempt < t->attempt) {
    return unless_refused(absl::AbortedError(absl::StrCat(
        "KV transfer for request ", id, ": attempt ", hello->attempt,
        " is older than attempt ", t->attempt)));
  }
  if (hello->attempt == t->attempt && t->conn_id != 0) {
    return unless_refused(absl::AbortedError(absl::StrCat(
        "KV transfer for request ", id, " attempt ", hello->attempt,
        " already has a live connection")));
  }
  if (!refused.ok()) {
    EndLocked(t, refused);
    return refused;
  }
  absl::Status compatible = CheckCompatible(layout_, hello->layout);
  if (!compatible.ok()) {
    absl::Status rejected = absl::FailedPreconditionError(absl::StrCat(
        "KV receiver rejects request ", id, " attempt ", hello->attempt, ": ",
        compatible.message()));
    EndLocked(t, rejected);
    return rejected;
  }
  // Take over: the older connection (if any) is closed and its partial
  // bytes are discarded once its in-flight write (if any) has returned.
  if (t->conn_id != 0) KickLocked(t->conn_id, SHUT_RD);
  t->conn_id = c.id;
  t->attempt = hello->attempt;
  t->state = TransferState::kReceiving;
  while (t->writing) writer_idle_.Wait(&mu_);
  if (!OwnsLocked(*t, c)) return LostLocked(*t, *hello);
  t->progress.Reset(layout_.n_layers, t->prompt_len - t->hit_tokens);
  t->result = TransferResult{};
  t->result.peer_bit_exact_class = hello->bit_exact_class;
  *out = std::move(t);
  return absl::OkStatus();
}

absl::Status KvReceiver::Impl::CheckFrame(const Transfer& t,
                                          const wire::Hello& hello,
                                          const wire::FrameView& f) const {
  const wire::FrameHeader& h = f.header;
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("bad KV frame for request ",
                                            hello.request_id, " attempt ",
                                            hello.attempt, ": ", why));
  };
  if (h.request_id != hello.request_id) {
    return bad(absl::StrCat("request_id '", h.request_id, "' != '",
                            hello.request_id, "'"));
  }
  if (h.attempt != hello.attempt) {
    return bad(absl::StrCat("attempt ", h.attempt, " != ", hello.attempt));
  }
  if (h.layer >= layout_.n_layers) {
    return bad(absl::StrCat("layer ", h.layer, " >= n_layers ", layout_.n_layers));
  }
  if (h.token_count == 0) return bad("token_count 0");
  if (h.token_start < t.hit_tokens) {
    return bad(absl::StrCat("token_start ", h.token_start, " < hit_tokens ",
                            t.hit_tokens));
  }
  const uint64_t end = uint64_t{h.token_start} + h.token_count;
  if (end > t.prompt_len) {
    return bad(absl::StrCat("token_start ", h.token_start, " + token_count ",
                            h.token_count, " = ", end, " > prompt_len ",
                            t.prompt_len));
  }
  const uint64_t want = layout_.FrameBytes(h.token_count);
  if (f.kv.size() != want) {
    return bad(absl::StrCat("K+V payload is ", f.kv.size(), " bytes, expected ",
                            want, " for ", h.token_count, " tokens"));
  }
  return absl::OkStatus();
}

absl::Status KvReceiver::Impl::CheckFinalLocked(
    const Transfer& t, const wire::Hello& hello,
    const TransferResult& final_msg) const {
  const receiver_internal::Progress& p = t.progress;
  if (final_msg.frames != p.frames || final_msg.kv_bytes != p.bytes) {
    return absl::DataLossError(absl::StrCat(
        "KV transfer for request ", hello.request_id, ": FINAL reports ",
        final_msg.frames, " frames / ", final_msg.kv_bytes,
        " bytes, received ", p.frames, " / ", p.bytes));
  }
  const uint32_t span = t.prompt_len - t.hit_tokens;
  for (uint32_t layer = 0; layer < layout_.n_layers; ++layer) {
    if (p.covered_count[layer] != span) {
      return absl::DataLossError(absl::StrCat(
          "KV transfer for request ", hello.request_id,
          " incomplete at FINAL: layer ", layer, " covers ",
          p.covered_count[layer], " of ", span, " tokens [", t.hit_tokens,
          ", ", t.prompt_len, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status KvReceiver::Impl::Receive(const Conn& c, int fd,
                                       const wire::Hello& hello,
                                       const std::shared_ptr<Transfer>& t,
                                       std::string* payload) {
  // The largest legal message is a FRAME over all of [hit, L) (FrameBytes
  // is in the layout's dtype).
  const uint64_t max_payload = std::max<uint64_t>(
      wire::kMaxControlPayload,
      wire::FrameFieldsBytes(hello.request_id.size()) +
          layout_.FrameBytes(t->prompt_len - t->hit_tokens));
  // K and V are copied out of the payload (where they sit at an offset
  // that depends on the request_id length) so that the writer gets them
  // aligned for any element type (KvWriter::WriteRows).
  std::vector<char> k, v;
  for (;;) {
    uint32_t type = 0;
    absl::Status s = tcp::ReadMessage(
        fd, tcp::DeadlineIn(options_.transfer_timeout_ms), max_payload, &type,
        payload, /*idle_ms=*/options_.transfer_timeout_ms);
    absl::StatusOr<wire::FrameView> frame;
    if (absl::IsDeadlineExceeded(s)) {
      s = absl::DeadlineExceededError(
          absl::StrCat("KV transfer for request ", hello.request_id,
                       " stalled for ", options_.transfer_timeout_ms, " ms"));
    } else if (absl::IsUnavailable(s)) {
      s = absl::UnavailableError(absl::StrCat(
          "KV sender for request ", hello.request_id,
          " went away mid-transfer: ", s.message()));
    } else if (s.ok() &&
               type == static_cast<uint32_t>(wire::MessageType::kFinal)) {
      absl::StatusOr<TransferResult> final_msg = wire::DecodeFinal(*payload);
      absl::MutexLock l(&mu_);
      if (!OwnsLocked(*t, c)) return LostLocked(*t, hello);
      s = final_msg.ok() ? CheckFinalLocked(*t, hello, *final_msg)
                         : final_msg.status();
      if (s.ok()) {
        // FINAL carries no class: keep the one from this attempt's HELLO.
        // The samples move through to `done` as decoded.
        std::string peer_class = std::move(t->result.peer_bit_exact_class);
        t->result = std::move(*final_msg);
        t->result.peer_bit_exact_class = std::move(peer_class);
      }
      EndLocked(t, s);
      return s;
    } else if (s.ok() &&
               type == static_cast<uint32_t>(wire::MessageType::kFrame)) {
      frame = wire::DecodeFrame(*payload);
      s = frame.ok() ? CheckFrame(*t, hello, *frame) : frame.status();
    } else if (s.ok()) {
      s = absl::DataLossError(
          absl::StrCat("unexpected KV message ", wire::MessageTypeName(type),
                       " mid-transfer for request ", hello.request_id));
    }
    if (!s.ok()) {
      absl::MutexLock l(&mu_);
      if (!OwnsLocked(*t, c)) return LostLocked(*t, hello);
      EndLocked(t, s);
      return s;
    }
    // A checked FRAME: copy K and V out of the (unaligned) payload, then
    // write with the lock released but `writing` set, so an abort waits.
    const wire::FrameHeader& h = frame->header;
    const size_t half = frame->kv.size() / 2;
    k.resize(half);
    v.resize(half);
    std::memcpy(k.data(), frame->kv.data(), half);
    std::memcpy(v.data(), frame->kv.data() + half, half);
    {
      absl::MutexLock l(&mu_);
      if (!OwnsLocked(*t, c)) return LostLocked(*t, hello);
      t->writing = true;
    }
    t->writer->WriteRows(h.layer, h.token_start, h.token_count, k.data(),
                         v.data());
    absl::MutexLock l(&mu_);
    t->writing = false;
    writer_idle_.SignalAll();
    if (t->state == TransferState::kAborting) {
      CompleteLocked(t);
      return t->status;
    }
    if (!OwnsLocked(*t, c)) return LostLocked(*t, hello);
    t->progress.Add(h.layer, h.token_start - t->hit_tokens, h.token_count,
                    frame->kv.size());
    bytes_total_.fetch_add(frame->kv.size());
  }
}

}  // namespace tandem::kvtransfer
