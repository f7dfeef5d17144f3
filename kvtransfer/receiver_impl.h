// Private to kvtransfer: KvReceiver's implementation state, shared by
// receiver.cc (lifecycle, public API, ending transfers, the completion
// thread), receiver_loop.cc (the poll loop: accept, read, flush,
// deadlines) and receiver_conn.cc (one connection's messages: HELLO,
// FRAME, FINAL).
//
// Threads: two, whatever the number of connections.
//  - The I/O thread runs poll() over a wake eventfd, the listening socket
//    and every connection (all non-blocking). It alone owns the
//    connections (Conn: fd, MessageReader, unsent ACCEPT/REJECT bytes),
//    decodes and checks messages, calls KvWriter::WriteRows, and fires
//    every deadline: a connection's HELLO (handshake_timeout_ms after
//    accept), its silence (transfer_timeout_ms since its last byte), a
//    transfer's HELLO (handshake_timeout_ms after Expect) and the flush of
//    a last REJECT (kControlSendMs).
//  - The completion thread runs `done` callbacks one at a time, in the
//    order transfers completed, so a slow `done` never stalls I/O.
// Public methods run on the caller's thread under mu_; when a connection
// must act on what they did (its transfer was cancelled), they queue its
// id (KickLocked) and wake the I/O thread through the eventfd.
//
// Transfer lifecycle (DESIGN.md, Identity, retries and failures):
//   AWAITING_HELLO --HELLO accepted--> RECEIVING --end--> ABORTING
//   --no write in flight--> QUIESCED (done queued) --done ran--> FREED.
// ABORTING lasts only while the I/O thread is inside KvWriter::WriteRows
// for the transfer (mu_ released, Transfer::writing set); the I/O thread
// completes the transfer when the write returns, so `done` never races a
// write.
#ifndef TANDEM_KVTRANSFER_RECEIVER_IMPL_H_
#define TANDEM_KVTRANSFER_RECEIVER_IMPL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/message_reader.h"
#include "kvtransfer/tcp.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer {
namespace receiver_internal {

using tcp::Clock;
using tcp::Deadline;

// How long a finished (request_id, attempt) is remembered so that a late
// HELLO for it is rejected at once instead of looking unknown.
constexpr auto kFinishedMemory = std::chrono::seconds(60);
// How long a connection may take to flush its last REJECT (a few bytes
// into an idle socket) before it is closed anyway.
constexpr int kControlSendMs = 200;
// Longest poll() sleep; bounds how late finished keys are forgotten.
constexpr auto kMaxPollSleep = std::chrono::milliseconds(500);
// Bytes read from one connection per poll turn, so that one fast sender
// cannot starve the others (poll is level-triggered: the rest waits for
// the next turn).
constexpr size_t kReadBudgetBytes = 1 << 20;
// Connections accepted per poll turn, and the pause after accept() fails
// (EMFILE and the like) before the listener is polled again.
constexpr int kMaxAcceptsPerTurn = 256;
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

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
// rest is guarded by KvReceiver::Impl::mu_ (status and result are read
// without it once QUIESCED, when nothing writes them any more).
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
  bool writing = false;  // the I/O thread is inside WriteRows for it
  absl::Status status;   // final status, set when it leaves RECEIVING
  TransferResult result;
  Progress progress;
};

// What a connection is doing; decides what poll() waits for and which
// deadline applies.
enum class ConnPhase {
  kHandshake,  // waiting for HELLO; deadline: accept + handshake_timeout_ms
  kReceiving,  // ACCEPTed; deadline: last byte + transfer_timeout_ms
  kClosing,    // flushing a last REJECT; deadline: kControlSendMs
};

// One accepted socket. Owned and touched by the I/O thread only.
struct Conn {
  uint64_t id = 0;
  tcp::ScopedFd fd;  // invalid once closed (the Conn is erased that turn)
  std::string peer;  // the sender's address, for log lines
  ConnPhase phase = ConnPhase::kHandshake;
  Deadline deadline;
  MessageReader reader;
  // Largest payload accepted in this phase (wire::kMaxControlPayload before
  // HELLO; after it, a FRAME over all of [hit, L)).
  uint64_t max_payload = wire::kMaxControlPayload;
  wire::Hello hello;                   // kReceiving: the accepted HELLO
  std::shared_ptr<Transfer> transfer;  // kReceiving: the transfer it took
  std::string out;                     // ACCEPT / REJECT bytes to send
  size_t out_sent = 0;
};

struct Finished {
  uint32_t attempt = 0;
  absl::StatusCode code = absl::StatusCode::kOk;
  Clock::time_point at;
};

}  // namespace receiver_internal

class KvReceiver::Impl {
 public:
  using Transfer = receiver_internal::Transfer;
  using Conn = receiver_internal::Conn;
  using ConnPhase = receiver_internal::ConnPhase;
  using Finished = receiver_internal::Finished;
  using TransferState = receiver_internal::TransferState;
  using Clock = tcp::Clock;

  // Takes the bound listening socket and an eventfd (both non-blocking)
  // and starts the I/O and completion threads.
  Impl(const Options& options, const KvLayout& layout, tcp::ScopedFd listen_fd,
       int port, tcp::ScopedFd wake_fd);
  ~Impl();

  int port() const { return port_; }
  absl::Status Expect(const std::string& request_id, uint32_t attempt,
                      uint32_t hit_tokens, uint32_t prompt_len, KvWriter* writer,
                      DoneCallback done);
  void Cancel(const std::string& request_id);
  absl::Status CancelAttempt(const std::string& request_id, uint32_t attempt,
                             const std::string& reason);
  uint32_t in_flight() const { return in_flight_.load(); }
  uint64_t bytes_total() const { return bytes_total_.load(); }

 private:
  // ---- receiver.cc: ending transfers, the completion thread ----
  // Ends a live transfer with `status` (OK only after a good FINAL): marks
  // ABORTING, kicks its connection, and completes at once unless a write
  // is in flight. No-op when it already ended.
  void EndLocked(std::shared_ptr<Transfer> t, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ABORTING -> QUIESCED: forgets the key, queues `done`.
  void CompleteLocked(std::shared_ptr<Transfer> t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the I/O thread to look at connection `conn_id` (its transfer
  // ended or was taken over).
  void KickLocked(uint64_t conn_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompletionLoop();
  bool CompletionReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !completions_.empty() || completion_stop_;
  }
  // Options::log, if set. Never called with mu_ held.
  void LogLine(const std::string& line) const;

  // ---- receiver_loop.cc: the I/O thread ----
  void IoLoop();
  // Wakes the I/O thread (eventfd write); any thread, any lock state.
  void Wake();
  // Accepts pending connections (at most kMaxAcceptsPerTurn).
  void AcceptAll();
  // Reads what `c` has (at most kReadBudgetBytes) and handles every whole
  // message.
  void OnReadable(Conn& c);
  // A read failed (peer gone, bad length prefix): ends `c` and, mid
  // transfer, the transfer it owns.
  void OnReadError(Conn& c, absl::Status status);
  // Fires connection and transfer deadlines due at `now`, forgets old
  // finished keys.
  void FireDeadlines(Clock::time_point now);
  // Handles the connections kicked by other threads.
  void HandleKicks();
  // When poll() must return at the latest.
  Clock::time_point NextWakeup(Clock::time_point now);
  // Queues bytes for `c` and tries to send them.
  void Queue(Conn& c, const std::string& bytes);
  // Sends what is queued for `c` as far as the socket takes it; closes `c`
  // once a closing connection's bytes are out (or the send failed).
  void Flush(Conn& c);
  // Ends connection `c`: OK closes it now (after a good FINAL); an error
  // queues REJECT(status) and closes once it is sent or kControlSendMs
  // passed. Logs a refused connection (no HELLO accepted) and one that
  // lost its transfer to a newer attempt; a failed transfer is logged when
  // its `done` runs. Must not be called with mu_ held.
  void Close(Conn& c, const absl::Status& status);
  void CloseNow(Conn& c);

  // ---- receiver_conn.cc: one connection's messages ----
  // A whole message is buffered in c.reader: HELLO in kHandshake, FRAME or
  // FINAL in kReceiving.
  void OnMessage(Conn& c);
  // Answers the HELLO in c.reader: ACCEPT (c takes the transfer) or REJECT.
  void OnHello(Conn& c);
  // Decides on the HELLO into *hello. OK: *out is the transfer c now owns.
  // Otherwise the status to REJECT with; a HELLO refused for its content
  // (unknown dtype, layout mismatch) also ends the transfer it names if
  // that attempt could have taken it.
  absl::Status Handshake(const Conn& c, wire::Hello* hello,
                         std::shared_ptr<Transfer>* out);
  // A FRAME: checked, then written into the transfer's writer (mu_
  // released, Transfer::writing set); a bad one ends transfer and c.
  void OnFrame(Conn& c);
  // A FINAL: checked against what arrived; ends the transfer (OK or
  // DATA_LOSS) and c.
  void OnFinal(Conn& c);
  // Ends c's transfer with `status` if c still owns it (else c learns why
  // it lost it), then closes c with the resulting status.
  void FailTransfer(Conn& c, absl::Status status);
  // Checks one frame against the agreed range; DATA_LOSS names the check.
  absl::Status CheckFrame(const Transfer& t, const wire::Hello& hello,
                          const wire::FrameView& f) const;
  // Checks FINAL's totals and every layer's coverage; DATA_LOSS otherwise.
  absl::Status CheckFinalLocked(const Transfer& t, const wire::Hello& hello,
                                const TransferResult& final_msg) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool OwnsLocked(const Transfer& t, const Conn& c) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return t.state == TransferState::kReceiving && t.conn_id == c.id;
  }
  // Why connection `c` no longer owns `t` (cancelled, failed, superseded).
  absl::Status LostLocked(const Transfer& t, const wire::Hello& hello) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Const after construction.
  const Options options_;
  const KvLayout layout_;
  const tcp::ScopedFd listen_fd_;
  const int port_;
  const tcp::ScopedFd wake_fd_;

  std::atomic<uint32_t> in_flight_{0};
  std::atomic<uint64_t> bytes_total_{0};

  // I/O thread only.
  std::map<uint64_t, std::unique_ptr<Conn>> conns_;
  uint64_t next_conn_id_ = 0;
  Clock::time_point accept_paused_until_;
  std::vector<char> k_, v_;  // K and V of the frame being written, aligned

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool completion_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Finished> finished_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> kicked_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Transfer>> completions_ ABSL_GUARDED_BY(mu_);

  // Declared last: started by the constructor once everything above exists.
  std::thread io_;
  std::thread completion_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_RECEIVER_IMPL_H_
