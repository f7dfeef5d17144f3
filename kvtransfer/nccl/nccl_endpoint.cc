#include "kvtransfer/nccl/nccl_endpoint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::kvtransfer::nccl {

NcclEndpoint::NcclEndpoint(const NcclDataPlaneOptions& options,
                           std::shared_ptr<NcclCommFactory> factory,
                           std::shared_ptr<DeviceOps> device, int rank)
    : options_(options), factory_(std::move(factory)), device_(std::move(device)), rank_(rank) {}

NcclEndpoint::~NcclEndpoint() = default;

absl::StatusOr<std::shared_ptr<Channel>> NcclEndpoint::NewChannel(std::string peer,
                                                                  uint64_t generation,
                                                                  std::string unique_id) {
  auto stream = device_->CreateStream();
  if (!stream.ok()) return stream.status();
  ChannelOptions channel;
  channel.peer = std::move(peer);
  channel.generation = generation;
  channel.rank = rank_;
  channel.unique_id = std::move(unique_id);
  channel.transfer_timeout = absl::Milliseconds(options_.transfer_timeout_ms);
  channel.init_timeout = absl::Milliseconds(options_.init_timeout_ms);
  auto created = std::make_shared<Channel>(std::move(channel), device_.get(), *stream, absl::Now());
  channels_.push_back(created);
  if (thread_ != nullptr) thread_->Wake();
  return created;
}

bool NcclEndpoint::Tick() {
  struct Abort {
    std::shared_ptr<Channel> channel;
    std::unique_ptr<NcclComm> comm;
  };
  std::vector<Abort> aborts;
  std::vector<std::function<void()>> deferred;
  bool busy = false;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (auto& channel : channels_) {
      busy = channel->Progress(*factory_, now) || busy;
      if (auto comm = channel->TakeCommToAbort()) {
        aborts.push_back({channel, std::move(comm)});
      }
    }
    std::erase_if(channels_, [](const auto& channel) { return channel->drained(); });
    deferred.swap(deferred_);
  }
  for (auto& callback : deferred) callback();
  if (aborts.empty()) return busy;
  for (auto& abort : aborts) {
    Log(absl::StrCat("kv nccl: aborting communicator generation ", abort.channel->generation(),
                     ": ", abort.channel->error().ToString()));
    abort.comm->Abort();
  }
  absl::MutexLock lock(&mu_);
  for (auto& abort : aborts) abort.channel->MarkAborted();
  return true;
}

void NcclEndpoint::Shutdown() {
  std::vector<std::unique_ptr<NcclComm>> comms;
  std::vector<std::function<void()>> deferred;
  std::vector<std::shared_ptr<Channel>> channels;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (auto& channel : channels_) {
      channel->Fail(absl::CancelledError("NCCL data plane shut down"), now);
      if (auto comm = channel->TakeCommToAbort()) comms.push_back(std::move(comm));
      channel->MarkAborted();
    }
    channels.swap(channels_);
    deferred.swap(deferred_);
  }
  for (auto& comm : comms) comm->Abort();
  for (auto& callback : deferred) callback();
  // The channels' destructors release what is left (after the aborts).
  {
    absl::MutexLock lock(&mu_);
    ForgetAll();
    for (auto& channel : channels) channel->ReleaseAll();
    channels.clear();
    deferred.clear();
    deferred.swap(deferred_);
  }
  for (auto& callback : deferred) callback();
}

}  // namespace tandem::kvtransfer::nccl
