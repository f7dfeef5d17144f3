// Private to kvtransfer: KvReceiver's implementation state, shared by
// receiver.cc (lifecycle, public API, ending transfers, the completion
// thread), receiver_loop.cc (the poll loop: accept, read, flush,
// deadlines), receiver_conn.cc (one connection's messages: HELLO,
// FRAME, FINAL) and receiver_device.cc (device transports: the
// KvDataReceiver calls, FRAME_DESC, ACK).
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
// A device transfer (nccl, cuda_ipc) also gets callbacks on data-plane
// threads: KvDataReceiver::Receive's `done` and CloseTransfer's
// `quiesced`. They only update state under mu_; what a connection must do
// about it (ACK, REJECT) is queued with KickLocked for the I/O thread. The
// data receiver is never called with mu_ held: OpenTransfer, Receive and
// CloseTransfer run on the I/O thread (the last CloseTransfers as it
// stops), so the calls for one key come in order. The destructor waits
// for every outstanding Receive `done` and `quiesced`.
// Public methods run on the caller's thread under mu_; when a connection
// must act on what they did (its transfer was cancelled), they queue its
// id (KickLocked) and wake the I/O thread through the eventfd.
//
// Transfer lifecycle (DESIGN.md, Identity, retries and failures):
//   AWAITING_HELLO --HELLO accepted--> RECEIVING --end--> ABORTING
//   --no write in flight--> QUIESCED (done queued) --done ran--> FREED.
// ABORTING lasts while the I/O thread is inside KvWriter::WriteRows or a
// KvDataReceiver call for the transfer (mu_ released, Transfer::writing
// set) and, for a device transfer, until every attempt's CloseTransfer has
// run its `quiesced` (Transfer::quiescing); whoever clears the last of
// these completes the transfer, so `done` never races a write into the
// blocks. A device transfer succeeds (status OK, ACK sent) once FINAL
// checked out and no Receive is outstanding.
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
#include "kvtransfer/data_plane.h"
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

// One attempt of a transfer on a device data path (nccl, cuda_ipc).
// Guarded by KvReceiver::Impl::mu_ (key and data are const once made).
struct DeviceAttempt {
  TransferKey key;
  KvDataReceiver* data = nullptr;
  bool opened = false;       // OpenTransfer succeeded
  bool closing = false;      // CloseTransfer queued (or called)
  uint32_t outstanding = 0;  // Receive calls whose `done` has not run
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
  bool writing = false;  // the I/O thread is inside WriteRows or a data
                         // receiver call for it
  absl::Status status;   // final status, set when it leaves RECEIVING
  TransferResult result;
  Progress progress;
  // The accepted attempt's transport; `device` is its data path state
  // (null for tcp or before a HELLO).
  KvTransport transport = KvTransport::kTcp;
  std::shared_ptr<DeviceAttempt> device;
  // Attempts whose CloseTransfer has not run `quiesced` yet.
  uint32_t quiescing = 0;
  // A device attempt's FINAL checked out; waiting for its Receives.
  bool final_ok = false;
  // First FRAME/FRAME_DESC and the FINAL of the accepted attempt (for
  // transfer_seconds_total).
  bool any_frame = false;
  Clock::time_point first_frame_at;
  Clock::time_point final_at;
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
  wire::Hello hello;                          // kReceiving: the accepted HELLO
  KvTransport transport = KvTransport::kTcp;  // kReceiving: hello.transport
  bool final_seen = false;                    // kReceiving: FINAL arrived
  std::shared_ptr<Transfer> transfer;         // kReceiving: the transfer it took
  std::string out;                            // ACCEPT / REJECT bytes to send
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
  Impl(const Options& options, const KvLayout& layout, tcp::ScopedFd listen_fd, int port,
       tcp::ScopedFd wake_fd);
  ~Impl();

  int port() const { return port_; }
  [[nodiscard]] absl::Status Expect(const std::string& request_id, uint32_t attempt,
                                    uint32_t hit_tokens, uint32_t prompt_len, KvWriter* writer,
                                    DoneCallback done);
  void Cancel(const std::string& request_id);
  [[nodiscard]] absl::Status CancelAttempt(const std::string& request_id, uint32_t attempt,
                                           const std::string& reason);
  uint32_t in_flight() const { return in_flight_.load(); }
  // Per transport (KvReceiver::kv_bytes_received) and summed.
  uint64_t bytes(KvTransport t) const { return bytes_[static_cast<size_t>(t)].load(); }
  uint64_t bytes_total() const;
  double transfer_seconds_total() const;
  uint64_t transfers_completed_total() const;

 private:
  // ---- receiver.cc: ending transfers, the completion thread ----
  // Ends a live transfer with `status` (OK only after a good FINAL): marks
  // ABORTING, kicks its connection, and completes at once unless a write
  // is in flight. No-op when it already ended.
  void EndLocked(std::shared_ptr<Transfer> t, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ABORTING -> QUIESCED: forgets the key, queues `done`.
  void CompleteLocked(std::shared_ptr<Transfer> t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CompleteLocked once an ABORTING transfer has no write, data receiver
  // call or quiesce pending.
  void MaybeCompleteLocked(const std::shared_ptr<Transfer>& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the I/O thread to look at connection `conn_id` (its transfer
  // ended or was taken over).
  void KickLocked(uint64_t conn_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompletionLoop();
  bool CompletionReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !completions_.empty() || completion_stop_;
  }
  // Options::log, if set. Never called with mu_ held.
  void LogLine(const std::string& line) const;

  // ---- receiver_device.cc: device transports ----
  // The data receiver for `transport` (nullptr for tcp or none).
  KvDataReceiver* DataReceiverFor(KvTransport transport) const;
  // The HELLO's transport checks (Handshake, under mu_): OK and *a set to
  // a new, unopened attempt for a device transport (null for tcp), or
  // FAILED_PRECONDITION (unknown name, not offered, no device target).
  [[nodiscard]] absl::Status CheckTransportLocked(
      const Transfer& t, const wire::Hello& hello,
      std::shared_ptr<receiver_internal::DeviceAttempt>* a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After an accepted HELLO of a device transport: KvDataReceiver::
  // OpenTransfer (mu_ released). OK, or the status to REJECT with (the
  // transfer ended with it unless it had already ended).
  [[nodiscard]] absl::Status OpenDevice(const std::shared_ptr<Transfer>& t,
                                        const wire::Hello& hello);
  // A FRAME_DESC on c: checked, then handed to KvDataReceiver::Receive.
  void OnFrameDesc(Conn& c);
  // Receive's `done` (any thread).
  void OnReceived(const std::shared_ptr<Transfer>& t,
                  const std::shared_ptr<receiver_internal::DeviceAttempt>& a, uint64_t bytes,
                  absl::Status status);
  // CloseTransfer's `quiesced` (any thread).
  void OnQuiesced(const std::shared_ptr<Transfer>& t);
  // Queues CloseTransfer for attempt `a` of `t` (opened, not yet closing)
  // for the I/O thread; t stays ABORTING until its `quiesced`.
  void CloseAttemptLocked(const std::shared_ptr<Transfer>& t,
                          const std::shared_ptr<receiver_internal::DeviceAttempt>& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls the queued CloseTransfers (I/O thread, or the destructor after
  // it stopped); mu_ not held.
  void RunCloses();
  // A device transfer whose FINAL checked out and whose Receives are all
  // done: ends it OK (its connection sends ACK).
  void SucceedLocked(const std::shared_ptr<Transfer>& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends ACK on c and closes it once sent (device transfer succeeded).
  void SendAck(Conn& c);
  // Whether nothing of the data plane is pending (destructor's wait).
  bool DataPlaneIdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return outstanding_total_ == 0 && quiesce_pending_ == 0 && pending_closes_.empty();
  }
  bool DataPlaneIdleOrCloseLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return DataPlaneIdleLocked() || !pending_closes_.empty();
  }

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
  [[nodiscard]] absl::Status Handshake(const Conn& c, wire::Hello* hello,
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
  [[nodiscard]] absl::Status CheckFrame(const Transfer& t, const wire::Hello& hello,
                                        const wire::FrameView& f) const;
  // CheckFrame without the payload size (FRAME_DESC has none).
  [[nodiscard]] absl::Status CheckFrameRange(const Transfer& t, const wire::Hello& hello,
                                             const wire::FrameHeader& h) const;
  // Checks FINAL's totals and every layer's coverage; DATA_LOSS otherwise.
  [[nodiscard]] absl::Status CheckFinalLocked(const Transfer& t, const wire::Hello& hello,
                                              const TransferResult& final_msg) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool OwnsLocked(const Transfer& t, const Conn& c) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return t.state == TransferState::kReceiving && t.conn_id == c.id;
  }
  // Why connection `c` no longer owns `t` (cancelled, failed, superseded).
  [[nodiscard]] absl::Status LostLocked(const Transfer& t, const wire::Hello& hello) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Const after construction.
  const Options options_;
  const KvLayout layout_;
  const tcp::ScopedFd listen_fd_;
  const int port_;
  const tcp::ScopedFd wake_fd_;
  // Options::transports, {tcp} when empty.
  const std::vector<KvTransport> offered_;

  std::atomic<uint32_t> in_flight_{0};
  // K+V payload bytes per KvTransport: tcp FRAMEs accepted, device
  // descriptors whose Receive succeeded.
  std::atomic<uint64_t> bytes_[kNumKvTransports] = {};

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
  // CloseTransfer calls for the I/O thread to make.
  std::vector<
      std::pair<std::shared_ptr<Transfer>, std::shared_ptr<receiver_internal::DeviceAttempt>>>
      pending_closes_ ABSL_GUARDED_BY(mu_);
  uint64_t outstanding_total_ ABSL_GUARDED_BY(mu_) = 0;  // Receives not done
  uint64_t quiesce_pending_ ABSL_GUARDED_BY(mu_) = 0;    // CloseTransfers not quiesced
  double transfer_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t transfers_completed_ ABSL_GUARDED_BY(mu_) = 0;

  // Declared last: started by the constructor once everything above exists.
  std::thread io_;
  std::thread completion_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_RECEIVER_IMPL_H_
