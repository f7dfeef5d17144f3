// KvSendQueue (send_queue.h): one sender thread, one poll() over every
// transfer's socket plus a wake-up pipe. All state sits under one mutex;
// the thread holds it while it handles poll()'s events (every socket call
// is non-blocking) and releases it while it waits in poll() or resolves an
// endpoint.
#include "kvtransfer/send_queue.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/hello_auth.h"
#include "kvtransfer/tcp.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer {
namespace {

using tcp::Clock;

enum class State {
  kNew,          // queued for the sender thread to connect
  kConnecting,   // connect in progress
  kHandshake,    // connected: HELLO going out, then waiting for ACCEPT
  kStreaming,    // accepted: FRAMEs (or FRAME_DESCs) and FINAL go out as queued
  kAwaitingAck,  // a device transfer's FINAL is written: waiting for D's ACK
  kDone,         // result known, socket closed
};

const char* Doing(State s) {
  switch (s) {
    case State::kNew:
    case State::kConnecting:
      return "connecting";
    case State::kHandshake:
      return "waiting for ACCEPT";
    case State::kStreaming:
      return "sending";
    case State::kAwaitingAck:
      return "waiting for ACK";
    case State::kDone:
      return "done";
  }
  return "?";
}

struct Transfer {
  std::string endpoint;
  std::string request_id;
  uint32_t attempt = 0;
  uint32_t n_layers = 0;
  uint64_t row_bytes = 0;
  KvTransport transport = KvTransport::kTcp;  // not tcp: a device transfer
  KvSendQueue::Notify notify;
  State state = State::kNew;
  tcp::ScopedFd fd;
  std::string hello;            // unwritten tail of the HELLO
  wire::Hello sent_hello;       // what the HELLO said (its nonce, for ACCEPT's answer)
  std::deque<std::string> out;  // messages after HELLO, front partly written
  size_t front_written = 0;     // bytes of out.front() already written
  uint64_t queued = 0;          // bytes of `out` not written yet
  bool final_queued = false;
  std::string in;  // bytes read from the receiver
  Clock::time_point last_progress;
  // When a byte last went to the receiver (or ACCEPT came): a streaming
  // transfer with nothing to send sends KEEPALIVE KeepaliveIntervalMs after.
  Clock::time_point last_sent;
  // Queued FRAMEs (FRAME_DESCs) and their K+V bytes (FrameBytes).
  uint64_t frames = 0, kv_bytes = 0;
  std::optional<absl::Status> result;

  // Whether the silence bound applies (the transfer waits for the network).
  bool Waiting() const {
    return state == State::kNew || state == State::kConnecting || state == State::kHandshake ||
           state == State::kAwaitingAck || (state == State::kStreaming && queued > 0);
  }
  bool device() const { return transport != KvTransport::kTcp; }
  // Accepted, nothing queued, no FINAL yet: the request waits on P.
  bool Idle() const { return state == State::kStreaming && out.empty() && !final_queued; }
};

struct Destination {
  uint64_t queued = 0;
  bool waiter = false;  // someone was told "not now": notify on progress
};

}  // namespace

class KvSendQueue::Impl {
 public:
  explicit Impl(const Options& options)
      : options_(options), keepalive_ms_(KeepaliveIntervalMs(options.transfer_timeout_ms)) {}

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    Wake();
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    for (auto& [id, t] : transfers_) {
      End(t, absl::CancelledError(absl::StrCat("KV transfer of request ", t.request_id,
                                               " cancelled: the KV send queue shut down")));
    }
    if (wake_read_ >= 0) ::close(wake_read_);
    if (wake_write_ >= 0) ::close(wake_write_);
  }

  [[nodiscard]] absl::Status Init() {
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
      return absl::InternalError(absl::StrCat("KvSendQueue: pipe2 failed: ", std::strerror(errno)));
    }
    wake_read_ = fds[0];
    wake_write_ = fds[1];
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }

  [[nodiscard]] absl::StatusOr<TransferId> Open(const std::string& endpoint,
                                                const std::string& request_id, uint32_t attempt,
                                                const KvLayout& layout,
                                                const std::string& bit_exact_class,
                                                KvTransport transport,
                                                const std::string& transport_setup, Notify notify) {
    absl::StatusOr<tcp::HostPort> hp = tcp::ParseEndpoint(endpoint);
    if (!hp.ok()) return hp.status();
    if (transport_setup.size() > wire::kMaxTransportSetupBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KvSendQueue::OpenWithTransport: transport_setup of ", transport_setup.size(),
          " bytes exceeds the limit of ", wire::kMaxTransportSetupBytes));
    }
    if (!IsKnownKvDtype(static_cast<uint32_t>(layout.dtype))) {
      return absl::InvalidArgumentError(absl::StrCat("KvSendQueue::Open: layout.dtype ",
                                                     static_cast<uint32_t>(layout.dtype),
                                                     " is not a KvDtype"));
    }
    wire::Hello h;
    h.request_id = request_id;
    h.attempt = attempt;
    h.layout = layout;
    h.bit_exact_class = bit_exact_class;
    h.transport = std::string(KvTransportName(transport));
    h.transport_setup = transport_setup;
    SignHello(options_.auth, &h);
    std::string hello = wire::EncodeHello(h);
    if (hello.size() - wire::kHeaderBytes > wire::kMaxControlPayload) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvSendQueue::Open: HELLO of ", hello.size(), " bytes exceeds the ",
                       wire::kMaxControlPayload,
                       "-byte control limit (request_id, fingerprint or "
                       "bit_exact_class too long)"));
    }
    TransferId id;
    {
      absl::MutexLock lock(&mu_);
      id = next_id_++;
      Transfer& t = transfers_[id];
      t.endpoint = endpoint;
      t.request_id = request_id;
      t.attempt = attempt;
      t.n_layers = layout.n_layers;
      t.row_bytes = layout.RowBytes();
      t.transport = transport;
      t.notify = std::move(notify);
      t.hello = std::move(hello);
      t.sent_hello = std::move(h);
      t.last_progress = Clock::now();
      if (stop_) {
        End(t, absl::CancelledError("KvSendQueue: shutting down"));
        return id;
      }
    }
    Wake();
    return id;
  }

  [[nodiscard]] absl::StatusOr<bool> HasRoom(TransferId id) {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Transfer*> t = Find(id);
    if (!t.ok()) return t.status();
    if ((*t)->result.has_value() && !(*t)->result->ok()) return *(*t)->result;
    Destination& d = dests_[(*t)->endpoint];
    if (d.queued < options_.send_buffer_bytes) return true;
    d.waiter = true;
    return false;
  }

  [[nodiscard]] absl::StatusOr<bool> EnqueueFrame(TransferId id, uint32_t layer,
                                                  uint32_t token_start, uint32_t token_count,
                                                  const void* k, const void* v, Admit admit) {
    // Checks and the FRAME's fields under the lock; the K/V copy without
    // it (the sender thread keeps writing meanwhile).
    std::string msg;
    uint64_t half = 0;
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<Transfer*> t = Usable(id, "EnqueueFrame");
      if (!t.ok()) return t.status();
      if ((*t)->device()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "KvSendQueue::EnqueueFrame: request ", (*t)->request_id, " uses transport ",
            std::string(KvTransportName((*t)->transport)), "; its frames go as EnqueueDescriptor"));
      }
      if (layer >= (*t)->n_layers || token_count == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("KvSendQueue::EnqueueFrame: layer ", layer, " (n_layers ", (*t)->n_layers,
                         "), token_count ", token_count, " (must be > 0)"));
      }
      half = uint64_t{token_count} * (*t)->row_bytes;
      absl::StatusOr<std::string> prefix = wire::EncodeFramePrefix(
          {(*t)->request_id, (*t)->attempt, layer, token_start, token_count}, 2 * half);
      if (!prefix.ok()) return prefix.status();
      msg = *std::move(prefix);
      Destination& d = dests_[(*t)->endpoint];
      const uint64_t size = msg.size() + 2 * half;
      if (admit == Admit::kIfRoom && d.queued > 0 && d.queued + size > options_.send_buffer_bytes) {
        d.waiter = true;
        return false;
      }
    }
    const size_t head = msg.size();
    msg.resize(head + 2 * half);
    std::memcpy(msg.data() + head, k, half);
    std::memcpy(msg.data() + head + half, v, half);
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<Transfer*> t = Usable(id, "EnqueueFrame");
      if (!t.ok()) return t.status();
      ++(*t)->frames;
      (*t)->kv_bytes += 2 * half;
      Push(**t, std::move(msg));
    }
    Wake();
    return true;
  }

  [[nodiscard]] absl::Status EnqueueDescriptor(TransferId id, const FrameDescriptor& f) {
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<Transfer*> found = Usable(id, "EnqueueDescriptor");
      if (!found.ok()) return found.status();
      Transfer& t = **found;
      auto bad = [&](const std::string& why) {
        return absl::InvalidArgumentError(absl::StrCat("KvSendQueue::EnqueueDescriptor: request ",
                                                       t.request_id, " attempt ", t.attempt, ": ",
                                                       why));
      };
      if (!t.device()) return bad("a tcp transfer takes FRAMEs (EnqueueFrame), not descriptors");
      if (f.request_id != t.request_id || f.attempt != t.attempt) {
        return bad(
            absl::StrCat("descriptor is for request ", f.request_id, " attempt ", f.attempt));
      }
      if (f.layer >= t.n_layers) {
        return bad(absl::StrCat("layer ", f.layer, " >= n_layers ", t.n_layers));
      }
      if (f.token_count == 0) return bad("token_count must be > 0");
      if (f.locator.size() > wire::kMaxLocatorBytes) {
        return bad(absl::StrCat("locator of ", f.locator.size(), " bytes exceeds the limit of ",
                                wire::kMaxLocatorBytes));
      }
      ++t.frames;
      t.kv_bytes += 2 * uint64_t{f.token_count} * t.row_bytes;  // KvLayout::FrameBytes
      Push(t, wire::EncodeFrameDesc(f));
    }
    Wake();
    return absl::OkStatus();
  }

  [[nodiscard]] absl::Status EnqueueFinal(TransferId id, const std::vector<FinalSample>& samples) {
    if (samples.empty() || samples.size() > kMaxFinalSamples) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvSendQueue::EnqueueFinal: samples: must hold 1 to ", kMaxFinalSamples,
                       " samples, got ", samples.size()));
    }
    for (size_t i = 0; i < samples.size(); ++i) {
      if (samples[i].top_logprobs.size() > kMaxFinalTopLogprobs) {
        return absl::InvalidArgumentError(
            absl::StrCat("KvSendQueue::EnqueueFinal: samples[", i, "].top_logprobs: at most ",
                         kMaxFinalTopLogprobs, " entries, got ", samples[i].top_logprobs.size()));
      }
    }
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<Transfer*> t = Usable(id, "EnqueueFinal");
      if (!t.ok()) return t.status();
      TransferResult final_msg;
      final_msg.samples = samples;
      final_msg.frames = (*t)->frames;
      final_msg.kv_bytes = (*t)->kv_bytes;
      (*t)->final_queued = true;
      Push(**t, wire::EncodeFinal(final_msg));
    }
    Wake();
    return absl::OkStatus();
  }

  std::optional<absl::Status> Result(TransferId id) {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Transfer*> t = Find(id);
    if (!t.ok()) return t.status();
    return (*t)->result;
  }

  void Close(TransferId id) {
    {
      absl::MutexLock lock(&mu_);
      auto it = transfers_.find(id);
      if (it == transfers_.end()) return;
      Transfer& t = it->second;
      t.notify = nullptr;
      if (!t.result.has_value()) {
        End(t, absl::CancelledError(
                   absl::StrCat("KV transfer of request ", t.request_id, " cancelled")));
      }
      transfers_.erase(it);
    }
    Wake();  // the sender thread drops the closed socket from its poll set
  }

  uint64_t queued_bytes(const std::string& endpoint) {
    absl::MutexLock lock(&mu_);
    auto it = dests_.find(endpoint);
    return it == dests_.end() ? 0 : it->second.queued;
  }

 private:
  [[nodiscard]] absl::StatusOr<Transfer*> Find(TransferId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = transfers_.find(id);
    if (it == transfers_.end()) {
      return absl::NotFoundError(absl::StrCat("KvSendQueue: unknown transfer id ", id));
    }
    return &it->second;
  }

  // A transfer that still takes messages: not failed, no FINAL yet.
  [[nodiscard]] absl::StatusOr<Transfer*> Usable(TransferId id, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<Transfer*> t = Find(id);
    if (!t.ok()) return t;
    if ((*t)->result.has_value() && !(*t)->result->ok()) return *(*t)->result;
    if ((*t)->final_queued) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KvSendQueue::", what, ": request ", (*t)->request_id, " already queued its FINAL"));
    }
    return t;
  }

  void Push(Transfer& t, std::string msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    t.queued += msg.size();
    dests_[t.endpoint].queued += msg.size();
    if (t.state == State::kStreaming && t.out.empty()) t.last_progress = Clock::now();
    t.out.push_back(std::move(msg));
  }

  // Ends `t` with `result`: socket closed, queued bytes dropped, notify.
  void End(Transfer& t, absl::Status result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (t.result.has_value()) return;
    t.result = std::move(result);
    t.state = State::kDone;
    t.fd.Reset();
    Drained(t.endpoint, t.queued);
    t.queued = 0;
    t.out.clear();
    t.front_written = 0;
    if (t.notify) t.notify();
  }

  // `bytes` of `endpoint` left the queue: wake whoever was told "not now".
  void Drained(const std::string& endpoint, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (bytes == 0) return;
    Destination& d = dests_[endpoint];
    d.queued -= std::min(d.queued, bytes);
    if (!d.waiter) return;
    d.waiter = false;
    for (auto& [id, other] : transfers_) {
      if (other.endpoint == endpoint && !other.result.has_value() && other.notify) {
        other.notify();
      }
    }
  }

  void Wake() {
    const char c = 1;
    (void)!::write(wake_write_, &c, 1);  // full pipe: a wake-up is pending anyway
  }

  [[nodiscard]] absl::Status Rejected(const Transfer& t, const wire::Reject& r) const {
    return absl::Status(r.code, absl::StrCat("KV receiver ", t.endpoint, " rejected request ",
                                             t.request_id, " attempt ", t.attempt, ": ", r.reason));
  }

  [[nodiscard]] absl::Status Error(const Transfer& t, absl::StatusCode code,
                                   const std::string& why) const {
    return absl::Status(
        code, absl::StrCat("KV transfer of request ", t.request_id, " to ", t.endpoint, ": ", why));
  }

  // Reads what the receiver sent. Before ACCEPT: ACCEPT moves to
  // streaming, REJECT fails. After it the receiver only speaks to end the
  // transfer: a REJECT (its reason) or the close.
  void ReadFrom(Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    char buf[4096];
    for (;;) {
      ssize_t n = ::recv(t.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        t.in.append(buf, static_cast<size_t>(n));
        t.last_progress = Clock::now();
        if (t.in.size() > wire::kHeaderBytes + wire::kMaxControlPayload) break;
        continue;
      }
      if (n < 0 && (errno == EINTR)) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      // EOF or a socket error: a complete REJECT (or ACK) already read
      // still wins.
      const int err = errno;
      ParseReplies(t);
      if (!t.result.has_value()) {
        End(t,
            Error(t, absl::StatusCode::kUnavailable,
                  n == 0 ? absl::StrCat("KV receiver closed the connection while ", Doing(t.state))
                         : absl::StrCat("connection failed: ", std::strerror(err))));
      }
      return;
    }
    ParseReplies(t);
  }

  // Acts on every complete message in t.in (ACCEPT, then an ACK or REJECT
  // may come in one read).
  void ParseReplies(Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!t.result.has_value() && ParseReply(t)) {
    }
  }

  // Acts on one complete message in t.in; false if none is complete yet.
  bool ParseReply(Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (t.result.has_value()) return true;
    if (t.in.size() < wire::kHeaderBytes) return false;
    uint32_t type = 0, length = 0;
    wire::GetHeader(t.in.data(), &type, &length);
    if (length > wire::kMaxControlPayload) {
      End(t, Error(t, absl::StatusCode::kDataLoss,
                   absl::StrCat("KV receiver sent ", wire::MessageTypeName(type), " of ", length,
                                " bytes")));
      return true;
    }
    if (t.in.size() < wire::kHeaderBytes + length) return false;
    const absl::string_view payload(t.in.data() + wire::kHeaderBytes, length);
    if (type == static_cast<uint32_t>(wire::MessageType::kReject)) {
      absl::StatusOr<wire::Reject> r = wire::DecodeReject(payload);
      End(t, r.ok() ? Rejected(t, *r) : r.status());
      return true;
    }
    if (type == static_cast<uint32_t>(wire::MessageType::kAccept) && t.state == State::kHandshake &&
        t.hello.empty()) {
      std::string answer;
      absl::Status s = wire::DecodeAccept(payload, &answer);
      if (!s.ok()) {
        End(t, s);
        return true;
      }
      if (s = CheckAcceptAnswer(options_.auth, t.sent_hello, answer); !s.ok()) {
        End(t, Error(t, s.code(), std::string(s.message())));
        return true;
      }
      t.in.erase(0, wire::kHeaderBytes + length);
      t.state = State::kStreaming;
      t.last_progress = Clock::now();
      t.last_sent = t.last_progress;
      return true;
    }
    if (type == static_cast<uint32_t>(wire::MessageType::kAck) && t.device() &&
        t.state == State::kAwaitingAck) {
      absl::Status s = wire::DecodeAck(payload);
      End(t, s.ok() ? s : Error(t, s.code(), std::string(s.message())));
      return true;
    }
    // Also an ACK on a tcp transfer or before the FINAL was written.
    End(t, Error(t, absl::StatusCode::kDataLoss,
                 absl::StrCat("unexpected ", wire::MessageTypeName(type),
                              " from the receiver "
                              "while ",
                              Doing(t.state), t.device() ? "" : " (a tcp transfer gets no ACK)")));
    return true;
  }

  // Writes what the socket takes: the HELLO's tail before ACCEPT, queued
  // messages after it. Ends the transfer OK once the FINAL is out.
  void WriteTo(Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (;;) {
      struct iovec iov[64];
      int n_iov = 0;
      if (t.state == State::kHandshake) {
        if (t.hello.empty()) return;
        iov[n_iov++] = {t.hello.data(), t.hello.size()};
      } else if (t.state == State::kStreaming) {
        size_t skip = t.front_written;
        for (std::string& m : t.out) {
          if (n_iov == 64) break;
          iov[n_iov++] = {m.data() + skip, m.size() - skip};
          skip = 0;
        }
        if (n_iov == 0) break;
      } else {
        return;
      }
      struct msghdr msg;
      std::memset(&msg, 0, sizeof(msg));
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n_iov);
      ssize_t sent = ::sendmsg(t.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        const int err = errno;
        ReadFrom(t);  // the receiver's REJECT, if it sent one, says why
        if (!t.result.has_value()) {
          End(t, Error(t, absl::StatusCode::kUnavailable,
                       absl::StrCat("connection failed while sending: ", std::strerror(err))));
        }
        return;
      }
      if (sent == 0) break;
      t.last_progress = Clock::now();
      t.last_sent = t.last_progress;
      size_t left = static_cast<size_t>(sent);
      if (t.state == State::kHandshake) {
        t.hello.erase(0, left);
        continue;
      }
      uint64_t done = 0;
      while (left > 0) {
        const size_t rest = t.out.front().size() - t.front_written;
        if (left < rest) {
          t.front_written += left;
          done += left;
          left = 0;
        } else {
          done += rest;
          left -= rest;
          t.out.pop_front();
          t.front_written = 0;
        }
      }
      t.queued -= done;
      Drained(t.endpoint, done);
    }
    if (t.state == State::kStreaming && t.out.empty() && t.final_queued) {
      if (!t.device()) {
        End(t, absl::OkStatus());
        return;
      }
      // A device transfer succeeds on D's ACK, which must come within
      // transfer_timeout_ms of the FINAL (Waiting()).
      t.state = State::kAwaitingAck;
      t.last_progress = Clock::now();
    }
  }

  void Run() {
    std::vector<struct pollfd> pfds;
    std::vector<TransferId> ids;
    for (;;) {
      // Connect new transfers (name resolution without the lock).
      std::vector<std::pair<TransferId, std::string>> fresh;
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
        for (auto& [id, t] : transfers_) {
          if (t.state == State::kNew) fresh.emplace_back(id, t.endpoint);
        }
      }
      for (const auto& [id, endpoint] : fresh) {
        absl::StatusOr<tcp::ScopedFd> fd = tcp::StartConnect(endpoint);
        absl::MutexLock lock(&mu_);
        auto it = transfers_.find(id);
        if (it == transfers_.end() || it->second.state != State::kNew) continue;
        Transfer& t = it->second;
        if (!fd.ok()) {
          End(t, Error(t, fd.status().code(), std::string(fd.status().message())));
          continue;
        }
        t.fd = *std::move(fd);
        t.state = State::kConnecting;
        t.last_progress = Clock::now();
      }
      // One poll over every live socket, bounded by the nearest deadline
      // or keepalive.
      pfds.assign(1, {wake_read_, POLLIN, 0});
      ids.assign(1, 0);
      int timeout_ms = -1;
      {
        absl::MutexLock lock(&mu_);
        const Clock::time_point now = Clock::now();
        const auto keepalive = std::chrono::milliseconds(keepalive_ms_);
        for (auto& [id, t] : transfers_) {
          if (t.Idle() && t.fd.valid()) {
            if (now - t.last_sent >= keepalive) {
              Push(t, wire::EncodeKeepalive());  // written below (POLLOUT)
            } else {
              const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                                    t.last_sent + keepalive - now)
                                    .count() +
                                1;
              timeout_ms = timeout_ms < 0 ? static_cast<int>(left)
                                          : std::min(timeout_ms, static_cast<int>(left));
            }
          }
          if (t.Waiting()) {
            const auto left =
                std::chrono::duration_cast<std::chrono::milliseconds>(
                    t.last_progress + std::chrono::milliseconds(options_.transfer_timeout_ms) - now)
                    .count() +
                1;
            const int ms = static_cast<int>(std::max<int64_t>(0, left));
            timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
          }
          if (!t.fd.valid()) continue;
          short events = POLLIN;
          if (t.state == State::kConnecting || (t.state == State::kHandshake && !t.hello.empty()) ||
              (t.state == State::kStreaming && !t.out.empty())) {
            events |= POLLOUT;
          }
          if (t.state == State::kConnecting) events = POLLOUT;
          pfds.push_back({t.fd.get(), events, 0});
          ids.push_back(id);
        }
      }
      int rc = ::poll(pfds.data(), pfds.size(), timeout_ms);
      if (rc < 0 && errno != EINTR) {
        absl::MutexLock lock(&mu_);
        for (auto& [id, t] : transfers_) {
          End(t, Error(t, absl::StatusCode::kUnavailable,
                       absl::StrCat("poll failed: ", std::strerror(errno))));
        }
        continue;
      }
      if (pfds[0].revents != 0) {
        char buf[256];
        while (::read(wake_read_, buf, sizeof(buf)) > 0) {
        }
      }
      absl::MutexLock lock(&mu_);
      for (size_t i = 1; i < pfds.size(); ++i) {
        auto it = transfers_.find(ids[i]);
        // Closed meanwhile, or a descriptor that now belongs to a new socket.
        if (it == transfers_.end() || it->second.fd.get() != pfds[i].fd) continue;
        Transfer& t = it->second;
        const short ev = pfds[i].revents;
        if (ev == 0 || t.result.has_value()) continue;
        if (t.state == State::kConnecting) {
          absl::Status s = tcp::FinishConnect(t.fd.get(), t.endpoint);
          if (!s.ok()) {
            End(t, Error(t, s.code(), std::string(s.message())));
            continue;
          }
          t.state = State::kHandshake;
          t.last_progress = Clock::now();
          WriteTo(t);
          continue;
        }
        if (ev & (POLLIN | POLLERR | POLLHUP)) ReadFrom(t);
        if (!t.result.has_value()) WriteTo(t);
      }
      // Silence bounds.
      const Clock::time_point now = Clock::now();
      for (auto& [id, t] : transfers_) {
        if (t.result.has_value() || !t.Waiting()) continue;
        if (now - t.last_progress >= std::chrono::milliseconds(options_.transfer_timeout_ms)) {
          End(t,
              absl::DeadlineExceededError(absl::StrCat(
                  "KV transfer of request ", t.request_id, " to ", t.endpoint, ": no progress for ",
                  options_.transfer_timeout_ms, " ms while ", Doing(t.state))));
        }
      }
    }
  }

  const Options options_;
  const int keepalive_ms_;  // KeepaliveIntervalMs(options_.transfer_timeout_ms)
  int wake_read_ = -1, wake_write_ = -1;
  std::thread thread_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  TransferId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<TransferId, Transfer> transfers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Destination> dests_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<KvSendQueue>> KvSendQueue::Start(const Options& options) {
  if (options.send_buffer_bytes == 0) {
    return absl::InvalidArgumentError("KvSendQueue: send_buffer_bytes must be > 0");
  }
  if (options.transfer_timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvSendQueue: transfer_timeout_ms must be > 0, got ", options.transfer_timeout_ms));
  }
  auto impl = std::make_unique<Impl>(options);
  absl::Status s = impl->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<KvSendQueue>(new KvSendQueue(std::move(impl)));
}

int KeepaliveIntervalMs(int transfer_timeout_ms) {
  return std::clamp(transfer_timeout_ms / 4, 1, 1000);
}

KvSendQueue::KvSendQueue(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvSendQueue::~KvSendQueue() = default;

absl::StatusOr<KvSendQueue::TransferId> KvSendQueue::Open(const std::string& endpoint,
                                                          const std::string& request_id,
                                                          uint32_t attempt, const KvLayout& layout,
                                                          const std::string& bit_exact_class,
                                                          Notify notify) {
  return impl_->Open(endpoint, request_id, attempt, layout, bit_exact_class, KvTransport::kTcp, "",
                     std::move(notify));
}
absl::StatusOr<KvSendQueue::TransferId> KvSendQueue::OpenWithTransport(
    const std::string& endpoint, const std::string& request_id, uint32_t attempt,
    const KvLayout& layout, const std::string& bit_exact_class, KvTransport transport,
    const std::string& transport_setup, Notify notify) {
  return impl_->Open(endpoint, request_id, attempt, layout, bit_exact_class, transport,
                     transport_setup, std::move(notify));
}
absl::Status KvSendQueue::EnqueueDescriptor(TransferId id, const FrameDescriptor& frame) {
  return impl_->EnqueueDescriptor(id, frame);
}
absl::StatusOr<bool> KvSendQueue::HasRoom(TransferId id) { return impl_->HasRoom(id); }
absl::StatusOr<bool> KvSendQueue::EnqueueFrame(TransferId id, uint32_t layer, uint32_t token_start,
                                               uint32_t token_count, const void* k, const void* v,
                                               Admit admit) {
  return impl_->EnqueueFrame(id, layer, token_start, token_count, k, v, admit);
}
absl::Status KvSendQueue::EnqueueFinal(TransferId id, const std::vector<FinalSample>& samples) {
  return impl_->EnqueueFinal(id, samples);
}
std::optional<absl::Status> KvSendQueue::Result(TransferId id) { return impl_->Result(id); }
void KvSendQueue::Close(TransferId id) { impl_->Close(id); }
uint64_t KvSendQueue::queued_bytes(const std::string& endpoint) {
  return impl_->queued_bytes(endpoint);
}

}  // namespace tandem::kvtransfer
