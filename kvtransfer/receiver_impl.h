// Private to kvtransfer: KvReceiver's implementation state, shared by
// receiver.cc (lifecycle, acceptor, reaper, public API) and
// receiver_conn.cc (one connection: HELLO, frames, FINAL).
//
// KvReceiver (kv_transfer.h) runs an acceptor thread, one thread per
// connection, and a reaper thread that fires handshake deadlines, runs
// `done` callbacks, forgets old finished keys and joins finished connection
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
#ifndef TANDEM_KVTRANSFER_RECEIVER_IMPL_H_
#define TANDEM_KVTRANSFER_RECEIVER_IMPL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/kv_transfer.h"
#include "kvtransfer/tcp.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer {
namespace receiver_internal {

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

}  // namespace receiver_internal

class KvReceiver::Impl {
 public:
  using Transfer = receiver_internal::Transfer;
  using Conn = receiver_internal::Conn;
  using Finished = receiver_internal::Finished;
  using TransferState = receiver_internal::TransferState;

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
  // Reads and answers the HELLO into *hello. OK: *out owns the transfer
  // now. Otherwise the status to REJECT with; a HELLO refused for its
  // content (unknown dtype, layout mismatch) also ends the transfer it
  // names if that attempt could have taken it.
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

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_RECEIVER_IMPL_H_
