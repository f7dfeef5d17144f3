#include "kvtransfer/nccl/channel.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtransfer/nccl/transport_setup.h"

namespace tandem::kvtransfer::nccl {

Channel::Channel(ChannelOptions options, DeviceOps* device, void* stream, absl::Time now)
    : options_(std::move(options)),
      device_(device),
      stream_(stream),
      init_deadline_(now + options_.init_timeout) {}

Channel::~Channel() {
  ReleaseAll();
  if (comm_ != nullptr && !comm_taken_) comm_->Abort();
  if (stream_ != nullptr) device_->DestroyStream(stream_);
}

void Channel::ReleaseAll() {
  for (auto& [seq, op] : queued_) Release(op);
  queued_.clear();
  for (auto& op : posting_) Release(op);
  posting_.clear();
  for (auto& group : in_flight_) {
    for (auto& op : group.ops) Release(op);
    if (group.event != nullptr) device_->DestroyEvent(group.event);
  }
  in_flight_.clear();
}

bool Channel::drained() const {
  return phase_ == Phase::kFailed && comm_taken_ && queued_.empty() && posting_.empty() &&
         in_flight_.empty();
}

absl::Status Channel::Deadline(std::string_view what, absl::Duration limit) const {
  return absl::DeadlineExceededError(absl::StrCat(
      std::string(what), " on the NCCL communicator with ", options_.peer, " (generation ",
      options_.generation, ") did not complete within ", absl::ToInt64Milliseconds(limit),
      " ms; communicator aborted (a stopped peer raises no NCCL error)"));
}

void Channel::Result(FrameOp& op, const absl::Status& status) {
  if (!op.on_result) return;
  auto result = std::move(op.on_result);
  op.on_result = nullptr;
  result(status);
}

void Channel::Release(FrameOp& op) {
  if (op.buffer != nullptr) {
    device_->Free(op.buffer, stream_);
    op.buffer = nullptr;
  }
  if (op.on_release) {
    auto release = std::move(op.on_release);
    op.on_release = nullptr;
    release();
  }
}

void Channel::Enqueue(FrameOp op) {
  absl::Status refused;
  if (phase_ == Phase::kFailed) {
    refused = error_;
  } else if (op.comm_seq < next_post_seq_ || queued_.contains(op.comm_seq)) {
    refused = absl::DataLossError(absl::StrCat("comm_seq ", op.comm_seq,
                                               " already announced on the NCCL communicator with ",
                                               options_.peer, " (generation ", options_.generation,
                                               "; next to post ", next_post_seq_, ")"));
  }
  if (!refused.ok()) {
    Result(op, refused);
    Release(op);
    return;
  }
  queued_.emplace(op.comm_seq, std::move(op));
}

void Channel::Fail(const absl::Status& error, absl::Time now) {
  if (phase_ == Phase::kFailed) return;
  phase_ = Phase::kFailed;
  error_ = CommunicatorLost(error);
  drain_deadline_ = now + options_.transfer_timeout;
  for (auto& [seq, op] : queued_) {
    Result(op, error_);
    Release(op);
  }
  queued_.clear();
  for (auto& op : posting_) Result(op, error_);
  for (auto& group : in_flight_) {
    for (auto& op : group.ops) Result(op, error_);
  }
  if (comm_ == nullptr) {
    comm_taken_ = true;  // nothing to abort (init never started or failed)
    aborted_ = true;
  }
}

std::unique_ptr<NcclComm> Channel::TakeCommToAbort() {
  if (phase_ != Phase::kFailed || comm_taken_) return nullptr;
  comm_taken_ = true;
  return std::move(comm_);
}

bool Channel::Progress(NcclCommFactory& factory, absl::Time now) {
  absl::Status error;
  switch (phase_) {
    case Phase::kNew: {
      auto comm = factory.InitRank(options_.unique_id, 2, options_.rank, init_deadline_);
      if (!comm.ok()) {
        Fail(absl::UnavailableError(absl::StrCat("NCCL communicator init with ", options_.peer,
                                                 " failed: ", comm.status().message())),
             now);
        break;
      }
      comm_ = *std::move(comm);
      phase_ = Phase::kInit;
      [[fallthrough]];
    }
    case Phase::kInit:
      switch (comm_->State(&error)) {
        case CommState::kReady:
          phase_ = Phase::kReady;
          break;
        case CommState::kError:
          Fail(absl::UnavailableError(absl::StrCat("NCCL communicator init with ", options_.peer,
                                                   " failed: ", error.message())),
               now);
          break;
        case CommState::kInProgress:
          if (now >= init_deadline_) Fail(Deadline("init", options_.init_timeout), now);
          break;
      }
      break;
    case Phase::kReady:
    case Phase::kPosting:
      switch (comm_->State(&error)) {
        case CommState::kReady:
          if (phase_ == Phase::kPosting) FinishPosting(now);
          break;
        case CommState::kError:
          Fail(error, now);
          break;
        case CommState::kInProgress:
          if (phase_ == Phase::kPosting && now >= post_deadline_) {
            Fail(Deadline("posting a group", options_.transfer_timeout), now);
          }
          break;
      }
      break;
    case Phase::kFailed:
      break;
  }
  PollGroups(now);
  if (phase_ == Phase::kReady) PostNextRun(now);
  if (phase_ == Phase::kFailed) {
    if (aborted_) {
      for (auto& op : posting_) Release(op);
      posting_.clear();
    }
    return !drained();
  }
  return phase_ != Phase::kReady || !posting_.empty() || !in_flight_.empty() || !queued_.empty();
}

void Channel::PostNextRun(absl::Time now) {
  auto it = queued_.find(next_post_seq_);
  if (it == queued_.end()) {
    // A gap: later frames are known, the next one is not (yet).
    if (queued_.empty()) {
      gap_since_ = absl::InfiniteFuture();
    } else if (gap_since_ == absl::InfiniteFuture()) {
      gap_since_ = now;
    } else if (now - gap_since_ >= options_.transfer_timeout) {
      Fail(absl::DeadlineExceededError(absl::StrCat(
               "no descriptor for comm_seq ", next_post_seq_, " on the NCCL communicator with ",
               options_.peer, " (generation ", options_.generation, ") within ",
               absl::ToInt64Milliseconds(options_.transfer_timeout),
               " ms while later frames wait; communicator aborted")),
           now);
    }
    return;
  }
  gap_since_ = absl::InfiniteFuture();
  while (it != queued_.end() && it->first == next_post_seq_) {
    posting_.push_back(std::move(it->second));
    it = queued_.erase(it);
    ++next_post_seq_;
  }
  absl::Status status;
  for (auto& op : posting_) {
    if (op.buffer != nullptr) continue;
    auto buffer = device_->Allocate(op.bytes, stream_);
    if (!buffer.ok()) {
      status = buffer.status();
      break;
    }
    op.buffer = *buffer;
  }
  const int peer = 1 - options_.rank;
  if (status.ok()) status = comm_->GroupStart();
  for (size_t i = 0; status.ok() && i < posting_.size(); ++i) {
    status = options_.rank == 0 ? comm_->Send(posting_[i].buffer, posting_[i].bytes, peer, stream_)
                                : comm_->Recv(posting_[i].buffer, posting_[i].bytes, peer, stream_);
  }
  if (status.ok()) status = comm_->GroupEnd();
  if (!status.ok()) {
    Fail(status, now);
    return;
  }
  phase_ = Phase::kPosting;
  post_deadline_ = now + options_.transfer_timeout;
  absl::Status error;
  switch (comm_->State(&error)) {
    case CommState::kReady:
      FinishPosting(now);
      break;
    case CommState::kError:
      Fail(error, now);
      break;
    case CommState::kInProgress:
      break;
  }
}

void Channel::FinishPosting(absl::Time now) {
  phase_ = Phase::kReady;
  Group group;
  group.deadline = now + options_.transfer_timeout;
  group.ops = std::move(posting_);
  posting_.clear();
  for (auto& op : group.ops) {
    if (!op.after_post) continue;
    absl::Status status = op.after_post(op.buffer, stream_);
    if (!status.ok()) Result(op, status);
  }
  auto event = device_->RecordEvent(stream_);
  if (!event.ok()) {
    in_flight_.push_back(std::move(group));
    Fail(event.status(), now);
    return;
  }
  group.event = *event;
  in_flight_.push_back(std::move(group));
}

void Channel::PollGroups(absl::Time now) {
  while (!in_flight_.empty()) {
    Group& group = in_flight_.front();
    absl::Status error;
    EventState state =
        group.event == nullptr ? EventState::kError : device_->QueryEvent(group.event, &error);
    if (state == EventState::kPending) {
      if (phase_ == Phase::kFailed) {
        if (now < drain_deadline_) return;
        // The device never finished the group after the abort: leak its
        // buffers rather than free memory a kernel may still touch.
        for (auto& op : group.ops) {
          op.buffer = nullptr;
          Release(op);
        }
        in_flight_.pop_front();
        continue;
      }
      if (now >= group.deadline)
        Fail(Deadline("a send/receive group", options_.transfer_timeout), now);
      return;
    }
    if (state == EventState::kError && phase_ != Phase::kFailed) {
      Fail(error.ok() ? absl::InternalError("transfer stream event failed") : error, now);
    }
    if (phase_ != Phase::kFailed) {
      for (auto& op : group.ops) Result(op, absl::OkStatus());
    }
    for (auto& op : group.ops) Release(op);
    if (group.event != nullptr) device_->DestroyEvent(group.event);
    in_flight_.pop_front();
  }
}

}  // namespace tandem::kvtransfer::nccl
