#include "kvtransfer/nccl/nccl_receiver.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvtransfer/nccl/transport_setup.h"

namespace tandem::kvtransfer::nccl {
namespace {

std::string Describe(const TransferKey& key) {
  return absl::StrCat("request ", key.request_id, " attempt ", key.attempt);
}

}  // namespace

NcclReceiver::NcclReceiver(const NcclDataPlaneOptions& options,
                           std::shared_ptr<NcclCommFactory> factory,
                           std::shared_ptr<DeviceOps> device)
    : NcclEndpoint(options, std::move(factory), std::move(device), /*rank=*/1) {}

absl::Status NcclReceiver::OpenTransfer(const TransferKey& key, std::string_view transport_setup,
                                        const DeviceKvTarget& target) {
  auto setup = DecodeNcclSetup(transport_setup);
  if (!setup.ok()) return setup.status();
  if (target.kv == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "nccl transfer for ", Describe(key), ": this decode worker has no device KV target"));
  }
  absl::MutexLock lock(&mu_);
  if (transfers_.contains(key)) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl transfer for ", Describe(key), " is already open"));
  }
  const std::string who = absl::StrCat("prefill worker instance ", setup->p_instance);
  auto found = peers_.find(setup->p_instance);
  std::shared_ptr<Channel> known = found == peers_.end() ? nullptr : found->second;
  std::shared_ptr<Channel> channel;
  if (known != nullptr && known->generation() == setup->generation) {
    if (known->failed()) {
      return absl::UnavailableError(
          absl::StrCat("the NCCL communicator with ", who, " (generation ", setup->generation,
                       ") failed here: ", known->error().message()));  // carries the marker
    }
    channel = known;
  } else if (known != nullptr && known->generation() > setup->generation) {
    return CommunicatorLost(absl::UnavailableError(
        absl::StrCat("NCCL communicator generation ", setup->generation, " of ", who,
                     " is older than this decode worker's generation ", known->generation())));
  } else {
    if (setup->unique_id.empty()) {
      return CommunicatorLost(absl::UnavailableError(
          absl::StrCat("no NCCL communicator with ", who, " generation ", setup->generation,
                       " here, and the HELLO carried no ncclUniqueId to make one")));
    }
    if (known != nullptr) {
      known->Fail(absl::UnavailableError(
                      absl::StrCat("NCCL communicator generation ", known->generation(), " of ",
                                   who, " replaced by generation ", setup->generation)),
                  absl::Now());
    }
    auto made = NewChannel(who, setup->generation, setup->unique_id);
    if (!made.ok()) return made.status();
    channel = *made;
    peers_[setup->p_instance] = channel;
  }
  auto transfer = std::make_shared<Transfer>();
  transfer->channel = std::move(channel);
  transfer->target = target;
  transfer->pool = target.kv->pool_info();
  closed_.erase(key);
  transfers_[key] = std::move(transfer);
  return absl::OkStatus();
}

void NcclReceiver::Report(Entry& entry, absl::Status status) {
  if (!entry.done) return;
  if (status.ok()) bytes_total_ += entry.bytes;
  Defer([done = std::move(entry.done), status = std::move(status)] { done(status); });
  entry.done = nullptr;
}

void NcclReceiver::Receive(const TransferKey& key, const FrameDescriptor& frame,
                           std::function<void(absl::Status)> done) {
  absl::MutexLock lock(&mu_);
  auto entry = std::make_shared<Entry>();
  entry->done = std::move(done);
  auto it = transfers_.find(key);
  std::shared_ptr<Transfer> transfer;
  if (it != transfers_.end()) {
    transfer = it->second;
  } else if (auto closed = closed_.find(key); closed != closed_.end()) {
    transfer = closed->second;  // announced before the cancel: discard
    Report(*entry,
           absl::CancelledError(absl::StrCat("nccl transfer for ", Describe(key),
                                             " is closed; the frame goes to a discard buffer")));
  }
  if (transfer == nullptr || frame.token_count == 0) {
    Report(*entry, absl::FailedPreconditionError(
                       absl::StrCat("nccl Receive for ", Describe(key), ": ",
                                    transfer == nullptr ? "no open transfer" : "token_count 0")));
    thread_->Wake();
    return;
  }
  entry->bytes = DeviceFrameBytes(transfer->pool, frame.token_count);
  if (!transfer->closed) transfer->entries.push_back(entry);
  FrameOp op;
  op.comm_seq = frame.comm_seq;
  op.bytes = entry->bytes;
  op.after_post = [transfer, entry, frame](void* buffer, void* stream) -> absl::Status {
    if (transfer->closed) return absl::OkStatus();  // the discard buffer
    absl::Status status = transfer->target.kv->ScatterRows(
        transfer->target.block_table, static_cast<int32_t>(frame.layer),
        static_cast<int32_t>(frame.token_start), static_cast<int32_t>(frame.token_count), buffer,
        stream);
    if (status.ok()) {
      entry->scattered = true;
      ++transfer->writing;
    }
    return status;
  };
  // FrameOp callbacks run under mu_ (channel.h).
  op.on_result = [this, entry](const absl::Status& status) {
    mu_.AssertHeld();
    Report(*entry, status);
  };
  op.on_release = [this, transfer, entry]() {
    mu_.AssertHeld();
    if (!entry->scattered) return;
    entry->scattered = false;
    if (--transfer->writing == 0 && transfer->closed && transfer->quiesced) {
      Defer(std::move(transfer->quiesced));
      transfer->quiesced = nullptr;
    }
  };
  transfer->channel->Enqueue(std::move(op));
  thread_->Wake();
}

void NcclReceiver::CloseTransfer(const TransferKey& key, std::function<void()> quiesced) {
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(key);
    if (it != transfers_.end()) {
      std::shared_ptr<Transfer> transfer = std::move(it->second);
      transfers_.erase(it);
      transfer->closed = true;
      for (auto& entry : transfer->entries) {
        Report(*entry, absl::CancelledError(
                           absl::StrCat("nccl transfer for ", Describe(key),
                                        " closed; its announced frames go to a discard buffer")));
      }
      transfer->entries.clear();
      if (transfer->writing > 0) {
        transfer->quiesced = std::move(quiesced);
        quiesced = nullptr;
      }
      if (closed_order_.size() >= kClosedMemory) {
        closed_.erase(closed_order_.front());
        closed_order_.pop_front();
      }
      closed_order_.push_back(key);
      closed_[key] = std::move(transfer);
    }
    thread_->Wake();
  }
  if (quiesced) quiesced();
}

void NcclReceiver::ForgetAll() {
  peers_.clear();
  transfers_.clear();
  closed_.clear();
  closed_order_.clear();
}

}  // namespace tandem::kvtransfer::nccl
