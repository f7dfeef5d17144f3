// KvReceiver (kv_transfer.h): acceptor thread, one thread per connection,
// and a reaper thread that fires handshake deadlines, runs `done`
// callbacks, forgets old finished keys and joins finished connection
// threads.
//
// Transfer lifecycle (DESIGN.md, Identity, retries and failures):
//   AWAITING_HELLO --HELLO accepted--> RECEIVING --end--> ABORTING
//   --no write in flight--> QUIESCED (done queued) --done ran--> FREED.
// ABORTING lasts only while a connection thread is inside
// KvWriter::WriteRows; that thread completes the transfer when the write
// returns, so `done` never races a write.
//
// Waking threads: a connection thread waits in poll() on its socket with a
// deadline. Other threads wake it with shutdown(fd, SHUT_RD) (Linux reports
// EOF to poll/recv at once); the fd itself is closed only by its own thread,
// under mu_, so a shutdown() never hits a reused fd.
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/tcp.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer {
namespace {

using tcp::Clock;
using tcp::Deadline;

// How long a finished (request_id, attempt) is remembered so that a late
// HELLO for it is rejected at once instead of looking unknown.
constexpr auto kFinishedMemory = std::chrono::seconds(60);
// Deadline for ACCEPT / REJECT writes (a few bytes into an idle socket).
constexpr int kControlSendMs = 200;
// Longest sleep of the acceptor and reaper between checks of their stop
// flags (they are also woken explicitly; this only bounds a missed wake).
constexpr int kAcceptSliceMs = 200;
constexpr auto kReaperMaxSleep = std::chrono::milliseconds(500);

enum class TransferState { kAwaitingHello, kReceiving, kAborting, kQuiesced, kFreed };

// Per-layer coverage of [hit_tokens, prompt_len) by the current attempt.
struct Progress {
  std::vector<std::vector<bool>> covered;  // [layer][token - hit]
  std::vector<uint32_t> covered_count;     // [layer]
  uint64_t frames = 0;
  uint64_t bytes = 0;

  void Reset(uint32_t n_layers, uint32_t span) {
    covered.assign(n_layers, std::vector<bool>(span, false));
    covered_count.assign(n_layers, 0);
    frames = 0;
    bytes = 0;
  }
  void Add(uint32_t layer, uint32_t first, uint32_t count, uint64_t nbytes) {
    std::vector<bool>& c = covered[layer];
    for (uint32_t i = first; i < first + count; ++i) {
      if (!c[i]) {
        c[i] = true;
        ++covered_count[layer];
      }
    }
    ++frames;
    bytes += nbytes;
  }
};

// One Expect()ed transfer. The first group is const after Expect(); the
// rest is guarded by KvReceiver::Impl::mu_.
struct Transfer {
  std::string request_id;
  uint32_t hit_tokens = 0;
  uint32_t prompt_len = 0;
  KvWriter* writer = nullptr;

  KvReceiver::DoneCallback done;
  uint32_t attempt = 0;  // newest attempt registered or accepted
  TransferState state = TransferState::kAwaitingHello;
  Deadline handshake_deadline;
  uint64_t conn_id = 0;  // connection that owns it; 0 = none
  bool writing = false;  // a connection thread is inside WriteRows
  absl::Status status;   // final status, set when it leaves RECEIVING
  TransferResult result;
  Progress progress;
};

// One accepted socket and its thread.
struct Conn {
  uint64_t id = 0;
  int fd = -1;            // guarded by mu_; -1 once closed
  bool finished = false;  // guarded by mu_; thread is about to return
  std::thread thread;
};

struct Finished {
  uint32_t attempt = 0;
  absl::StatusCode code = absl::StatusCode::kOk;
  Clock::time_point at;
};

}  // namespace

class KvReceiver::Impl {
 public:
  Impl(const Options& options, const KvLayout& layout, tcp::ScopedFd listen_fd,
       int port)
      : options_(options),
        layout_(layout),
        listen_fd_(std::move(listen_fd)),
        port_(port) {
    acceptor_ = std::thread([this] { AcceptLoop(); });
    reaper_ = std::thread([this] { ReaperLoop(); });
  }
  ~Impl();

  int port() const { return port_; }
  absl::Status Expect(const std::string& request_id, uint32_t attempt,
                      uint32_t hit_tokens, uint32_t prompt_len, KvWriter* writer,
                      DoneCallback done);
  void Cancel(const std::string& request_id);
  uint32_t in_flight() const { return in_flight_.load(); }
  uint64_t bytes_total() const { return bytes_total_.load(); }

 private:
  void AcceptLoop();
  void ReaperLoop();
  void Serve(Conn* c, int fd);
  // Reads and answers the HELLO. OK: *out owns the transfer now. Otherwise
  // the status to REJECT with.
  absl::Status Handshake(const Conn& c, int fd, std::string* payload,
                         wire::Hello* hello, std::shared_ptr<Transfer>* out);
  // Receives FRAMEs until FINAL or an error; returns the status to REJECT
  // with (OK after a good FINAL).
  absl::Status Receive(const Conn& c, int fd, const wire::Hello& hello,
                       const std::shared_ptr<Transfer>& t,
                       std::string* payload);
  // Checks one frame against the agreed range; DATA_LOSS names the check.
  absl::Status CheckFrame(const Transfer& t, const wire::Hello& hello,
                          const wire::FrameView& f) const;

  bool OwnsLocked(const Transfer& t, const Conn& c) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return t.state == TransferState::kReceiving && t.conn_id == c.id;
  }
  // Why connection `c` no longer owns `t` (cancelled, failed, superseded).
  absl::Status LostLocked(const Transfer& t, const wire::Hello& hello) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a live transfer with `status` (OK only after a good FINAL): marks
  // ABORTING, wakes its connection, and completes at once unless a write is
  // in flight. No-op when it already ended.
  void EndLocked(std::shared_ptr<Transfer> t, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ABORTING -> QUIESCED: forgets the key, queues `done`.
  void CompleteLocked(std::shared_ptr<Transfer> t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KickLocked(uint64_t conn_id, int how) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Best-effort REJECT before closing.
  void SendReject(int fd, const absl::Status& status);

  // Const after construction.
  const Options options_;
  const KvLayout layout_;
  const tcp::ScopedFd listen_fd_;
  const int port_;
  std::thread acceptor_;
  std::thread reaper_;

  std::atomic<uint32_t> in_flight_{0};
  std::atomic<uint64_t> bytes_total_{0};

  mutable absl::Mutex mu_;
  absl::CondVar writer_idle_;  // a Transfer::writing went false
  absl::CondVar reaper_wake_;  // completions, new deadlines, stop
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool reaper_stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_conn_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Finished> finished_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Transfer>> completions_ ABSL_GUARDED_BY(mu_);
};

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
  absl::StatusOr<wire::Hello> h = wire::DecodeHello(*payload);
  if (!h.ok()) return h.status();
  *hello = std::move(*h);
  const std::string& id = hello->request_id;

  absl::MutexLock l(&mu_);
  if (stopping_) return absl::UnavailableError("KV receiver is shutting down");
  auto it = transfers_.find(id);
  if (it == transfers_.end()) {
    auto f = finished_.find(id);
    if (f != finished_.end()) {
      return absl::AbortedError(absl::StrCat(
          "KV transfer for request ", id, " attempt ", f->second.attempt,
          " already finished (", absl::StatusCodeToString(f->second.code), ")"));
    }
    return absl::NotFoundError(absl::StrCat(
        "no KV transfer expected for request ", id, " (attempt ",
        hello->attempt, ")"));
  }
  std::shared_ptr<Transfer> t = it->second;
  switch (t->state) {
    case TransferState::kAwaitingHello:
    case TransferState::kReceiving:
      break;
    case TransferState::kAborting:
    case TransferState::kQuiesced:
    case TransferState::kFreed:
      return absl::AbortedError(
          absl::StrCat("KV transfer for request ", id, " is being aborted"));
  }
  if (hello->attempt < t->attempt) {
    return absl::AbortedError(absl::StrCat(
        "KV transfer for request ", id, ": attempt ", hello->attempt,
        " is older than attempt ", t->attempt));
  }
  if (hello->attempt == t->attempt && t->conn_id != 0) {
    return absl::AbortedError(absl::StrCat(
        "KV transfer for request ", id, " attempt ", hello->attempt,
        " already has a live connection"));
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

absl::Status KvReceiver::Impl::Receive(const Conn& c, int fd,
                                       const wire::Hello& hello,
                                       const std::shared_ptr<Transfer>& t,
                                       std::string* payload) {
  const uint64_t max_payload = std::max<uint64_t>(
      wire::kMaxControlPayload,
      wire::FrameFieldsBytes(hello.request_id.size()) +
          layout_.FrameBytes(t->prompt_len - t->hit_tokens));
  std::vector<float> k, v;
  for (;;) {
    uint32_t type = 0;
    absl::Status s =
        tcp::ReadMessage(fd, tcp::DeadlineIn(options_.transfer_timeout_ms),
                         max_payload, &type, payload);
    absl::StatusOr<wire::FrameView> frame;
    absl::StatusOr<TransferResult> final_msg;
    if (s.ok()) {
      switch (static_cast<wire::MessageType>(type)) {
        case wire::MessageType::kFrame:
          frame = wire::DecodeFrame(*payload);
          s = frame.ok() ? CheckFrame(*t, hello, *frame) : frame.status();
          break;
        case wire::MessageType::kFinal:
          final_msg = wire::DecodeFinal(*payload);
          s = final_msg.status();
          break;
        case wire::MessageType::kHello:
        case wire::MessageType::kAccept:
        case wire::MessageType::kReject:
        default:
          s = absl::DataLossError(
              absl::StrCat("unexpected KV message ", wire::MessageTypeName(type),
                           " mid-transfer for request ", hello.request_id));
      }
    } else if (absl::IsDeadlineExceeded(s)) {
      s = absl::DeadlineExceededError(
          absl::StrCat("KV transfer for request ", hello.request_id,
                       " stalled for ", options_.transfer_timeout_ms, " ms"));
    } else if (absl::IsUnavailable(s)) {
      s = absl::UnavailableError(absl::StrCat(
          "KV sender for request ", hello.request_id,
          " went away mid-transfer: ", s.message()));
    }
    if (s.ok() && final_msg.ok()) {
      absl::MutexLock l(&mu_);
      if (!OwnsLocked(*t, c)) return LostLocked(*t, hello);
      const Progress& p = t->progress;
      if (final_msg->frames != p.frames || final_msg->kv_bytes != p.bytes) {
        s = absl::DataLossError(absl::StrCat(
            "KV transfer for request ", hello.request_id, ": FINAL reports ",
            final_msg->frames, " frames / ", final_msg->kv_bytes,
            " bytes, received ", p.frames, " / ", p.bytes));
      }
      const uint32_t span = t->prompt_len - t->hit_tokens;
      for (uint32_t layer = 0; s.ok() && layer < layout_.n_layers; ++layer) {
        if (p.covered_count[layer] != span) {
          s = absl::DataLossError(absl::StrCat(
              "KV transfer for request ", hello.request_id,
              " incomplete at FINAL: layer ", layer, " covers ",
              p.covered_count[layer], " of ", span, " tokens [",
              t->hit_tokens, ", ", t->prompt_len, ")"));
        }
      }
      if (s.ok()) t->result = *final_msg;
      EndLocked(t, s);
      return s;
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
    k.resize(half / sizeof(float));
    v.resize(half / sizeof(float));
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

// ---- KvReceiver -----------------------------------------------------------

absl::StatusOr<std::unique_ptr<KvReceiver>> KvReceiver::Start(
    const Options& options, const KvLayout& layout) {
  if (layout.n_layers == 0 || layout.n_kv_heads == 0 || layout.head_dim == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout needs n_layers, n_kv_heads, head_dim > 0, got ",
        layout.n_layers, ", ", layout.n_kv_heads, ", ", layout.head_dim));
  }
  if (layout.dtype != "f32") {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout dtype '", layout.dtype, "' unsupported (only f32)"));
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
