// One communicator generation of a P-D pair: the NcclComm, its transfer
// stream, the frames queued on it in comm_seq order, the group being
// posted, the groups in flight (one event each) and the watchdog's
// deadlines. NcclSender (rank 0, sends) and NcclReceiver (rank 1,
// receives) each keep one Channel per peer.
//
// Ordering rule: frames are posted strictly in comm_seq order (0, 1, 2,
// ... per generation); a run of consecutive queued frames is posted as one
// group (ncclGroupStart, one Send/Recv each, ncclGroupEnd). When the next
// frame is missing while later ones are queued (D learned comm_seq 2
// before 1) nothing is posted until it comes, for at most
// transfer_timeout.
//
// Watchdog (PyTorch ProcessGroupNCCL's pattern): init must leave
// kInProgress before init_timeout; after every non-blocking call the
// communicator must leave kInProgress, and every group's event must fire,
// within transfer_timeout (a stopped peer raises no error); State()'s
// async error is checked on every turn. On failure every frame gets the
// error, the communicator is handed back for ncclCommAbort (never
// destroyed) and the channel only drains: buffers are released once their
// group's event fired after the abort (or transfer_timeout later, leaked
// and logged, if it never does).
//
// Threads: every method runs with the owner's mutex held; Progress,
// Start and the NCCL calls in it run on the NCCL thread only. FrameOp
// callbacks run under that mutex too (they only update the owner's
// state; user callbacks are deferred by the owner).
#ifndef TANDEM_KVTRANSFER_NCCL_CHANNEL_H_
#define TANDEM_KVTRANSFER_NCCL_CHANNEL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kvtransfer/nccl/nccl_comm.h"

namespace tandem::kvtransfer::nccl {

// One frame's bytes on the channel.
struct FrameOp {
  uint64_t comm_seq = 0;
  uint64_t bytes = 0;
  // P: the gathered send buffer (the channel frees it on release). D: null;
  // the channel allocates the staging buffer when it posts the receive.
  void* buffer = nullptr;
  // D: enqueues the scatter of `buffer` on the stream after the receive
  // (null, or returning OK without enqueuing, to discard the bytes). An
  // error fails only this frame.
  std::function<absl::Status(void* buffer, void* stream)> after_post;
  // Runs exactly once: OK when the frame's event fired, else the error.
  std::function<void(const absl::Status&)> on_result;
  // Runs exactly once, after on_result, when the device no longer touches
  // the buffer or (D) the frame's target.
  std::function<void()> on_release;
};

struct ChannelOptions {
  std::string peer;  // for messages, e.g. "decode worker 10.0.0.2:9000"
  uint64_t generation = 1;
  int rank = 0;  // 0: P, sends to 1; 1: D, receives from 0
  std::string unique_id;
  absl::Duration transfer_timeout = absl::Seconds(5);
  absl::Duration init_timeout = absl::Seconds(10);
};

class Channel {
 public:
  // `stream` is the channel's transfer stream (destroyed with the channel).
  Channel(ChannelOptions options, DeviceOps* device, void* stream, absl::Time now);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  uint64_t generation() const { return options_.generation; }
  const std::string& unique_id() const { return options_.unique_id; }
  void* stream() const { return stream_; }
  bool ready() const { return phase_ == Phase::kReady || phase_ == Phase::kPosting; }
  bool failed() const { return phase_ == Phase::kFailed; }
  const absl::Status& error() const { return error_; }
  // Failed and nothing left to release: the owner may drop it.
  bool drained() const;

  // Queues `op` (any thread). A comm_seq below the next one to post, or
  // one already queued, fails the frame with DATA_LOSS; a failed channel
  // fails it with its error.
  void Enqueue(FrameOp op);
  // The next comm_seq P assigns (P only; any thread).
  uint64_t TakeSendSeq() { return next_send_seq_++; }

  // One watchdog turn (NCCL thread): starts or polls init, posts the next
  // run of frames, polls the posting group and the events, enforces the
  // deadlines. Returns true while something is pending (poll again soon).
  bool Progress(NcclCommFactory& factory, absl::Time now);
  // Fails the channel (any thread); see the file comment.
  void Fail(const absl::Status& error, absl::Time now);
  // After Fail: the communicator to abort, once (null otherwise). The
  // caller aborts it without the lock, on the NCCL thread, then calls
  // MarkAborted.
  std::unique_ptr<NcclComm> TakeCommToAbort();
  void MarkAborted() { aborted_ = true; }
  // Shutdown (the NCCL thread stopped, the communicator aborted): releases
  // every frame now, which also drops the owners' references the frames
  // hold (FrameOp callbacks keep their transfer, and so this channel,
  // alive).
  void ReleaseAll();

 private:
  enum class Phase { kNew, kInit, kReady, kPosting, kFailed };
  struct Group {
    void* event = nullptr;
    absl::Time deadline;
    std::vector<FrameOp> ops;
  };

  void PostNextRun(absl::Time now);
  void FinishPosting(absl::Time now);
  void PollGroups(absl::Time now);
  static void Result(FrameOp& op, const absl::Status& status);
  void Release(FrameOp& op);
  [[nodiscard]] absl::Status Deadline(std::string_view what, absl::Duration limit) const;

  const ChannelOptions options_;
  DeviceOps* const device_;
  void* const stream_;

  Phase phase_ = Phase::kNew;
  absl::Status error_;
  std::unique_ptr<NcclComm> comm_;
  bool comm_taken_ = false;
  bool aborted_ = false;
  absl::Time init_deadline_;
  absl::Time post_deadline_;
  absl::Time drain_deadline_;
  absl::Time gap_since_ = absl::InfiniteFuture();
  uint64_t next_send_seq_ = 0;
  uint64_t next_post_seq_ = 0;
  std::map<uint64_t, FrameOp> queued_;
  std::vector<FrameOp> posting_;  // the group after GroupEnd, before it left kInProgress
  std::deque<Group> in_flight_;
};

}  // namespace tandem::kvtransfer::nccl

#endif  // TANDEM_KVTRANSFER_NCCL_CHANNEL_H_
