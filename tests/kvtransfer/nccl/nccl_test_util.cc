#include "nccl_test_util.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tandem::kvtransfer::nccl::testing {

// HostStream ---------------------------------------------------------------

void HostStream::Enqueue(Op op) {
  {
    absl::MutexLock lock(&mu_);
    ops_.push_back(std::move(op));
    ++enqueued_;
  }
  Pump();
}

void HostStream::Pump() {
  absl::MutexLock lock(&mu_);
  while (!ops_.empty() && ops_.front()()) {
    ops_.pop_front();
    ++completed_;
  }
}

uint64_t HostStream::enqueued() {
  absl::MutexLock lock(&mu_);
  return enqueued_;
}

uint64_t HostStream::completed() {
  absl::MutexLock lock(&mu_);
  return completed_;
}

// HostDeviceOps --------------------------------------------------------------

namespace {

struct HostEvent {
  HostStream* stream;
  uint64_t ticket;  // done once this many operations of the stream completed
};

HostStream* AsStream(void* stream) { return static_cast<HostStream*>(stream); }

// Runs `op` on `stream`, or now for a null stream.
void RunOn(void* stream, HostStream::Op op) {
  if (stream == nullptr) {
    op();
  } else {
    AsStream(stream)->Enqueue(std::move(op));
  }
}

}  // namespace

absl::StatusOr<void*> HostDeviceOps::CreateStream() {
  ++live_streams_;
  return static_cast<void*>(new HostStream());
}

void HostDeviceOps::DestroyStream(void* stream) {
  AsStream(stream)->Pump();
  delete AsStream(stream);
  --live_streams_;
}

absl::StatusOr<void*> HostDeviceOps::Allocate(uint64_t bytes, void* stream) {
  ++live_buffers_;
  return static_cast<void*>(new char[bytes == 0 ? 1 : bytes]);
}

void HostDeviceOps::Free(void* buffer, void* stream) {
  AsStream(stream)->Enqueue([this, buffer] {
    delete[] static_cast<char*>(buffer);
    --live_buffers_;
    return true;
  });
}

absl::StatusOr<void*> HostDeviceOps::RecordEvent(void* stream) {
  return static_cast<void*>(new HostEvent{AsStream(stream), AsStream(stream)->enqueued()});
}

EventState HostDeviceOps::QueryEvent(void* event, absl::Status* error) {
  auto* host = static_cast<HostEvent*>(event);
  host->stream->Pump();
  return host->stream->completed() >= host->ticket ? EventState::kDone : EventState::kPending;
}

void HostDeviceOps::DestroyEvent(void* event) { delete static_cast<HostEvent*>(event); }

absl::Status HostDeviceOps::StreamWaitEvent(void* stream, void* event) {
  AsStream(stream)->Enqueue([this, event] {
    return QueryEvent(event, nullptr) == EventState::kDone;
  });
  return absl::OkStatus();
}

// Fake communicator ---------------------------------------------------------

namespace {

class FakeComm final : public NcclComm {
 public:
  FakeComm(FakeNcclFactory* factory, std::shared_ptr<FakeLink> link, int rank, bool never_ready)
      : factory_(factory), link_(std::move(link)), rank_(rank), never_ready_(never_ready) {}

  absl::Status GroupStart() override {
    absl::MutexLock lock(&link_->mu);
    link_->open_group[rank_] = 0;
    return absl::OkStatus();
  }
  absl::Status GroupEnd() override {
    absl::MutexLock lock(&link_->mu);
    link_->group_sizes[rank_].push_back(link_->open_group[rank_]);
    link_->open_group[rank_] = -1;
    if (link_->hold_posting[rank_]) link_->held[rank_] = true;
    return absl::OkStatus();
  }
  absl::Status Send(const void* buffer, uint64_t bytes, int peer, void* stream) override {
    if (rank_ != 0 || peer != 1) return absl::InvalidArgumentError("fake: only 0 -> 1");
    Count();
    AsStream(stream)->Enqueue([factory = factory_, buffer, bytes, link = link_] {
      absl::MutexLock lock(&link->mu);
      if (link->aborted[0]) return true;
      if (factory->stalled()) return false;
      link->messages.emplace_back(static_cast<const char*>(buffer), bytes);
      return true;
    });
    return absl::OkStatus();
  }
  absl::Status Recv(void* buffer, uint64_t bytes, int peer, void* stream) override {
    if (rank_ != 1 || peer != 0) return absl::InvalidArgumentError("fake: only 1 <- 0");
    Count();
    {
      absl::MutexLock lock(&link_->mu);
      link_->recv_sizes.push_back(bytes);
    }
    AsStream(stream)->Enqueue([factory = factory_, buffer, bytes, link = link_] {
      absl::MutexLock lock(&link->mu);
      if (link->aborted[1]) return true;
      if (factory->stalled() || link->messages.empty()) return false;
      const std::string& message = link->messages.front();
      if (message.size() != bytes) {
        link->error = absl::StrCat("fake: receive of ", bytes, " bytes matched a send of ",
                                   message.size());
      } else {
        std::memcpy(buffer, message.data(), bytes);
      }
      link->messages.pop_front();
      return true;
    });
    return absl::OkStatus();
  }
  CommState State(absl::Status* error) override {
    absl::MutexLock lock(&link_->mu);
    if (!link_->error.empty()) {
      if (error != nullptr) *error = absl::UnavailableError(link_->error);
      return CommState::kError;
    }
    if (!link_->hold_posting[rank_]) link_->held[rank_] = false;
    if (never_ready_ || !link_->joined[0] || !link_->joined[1] || link_->held[rank_]) {
      return CommState::kInProgress;
    }
    return CommState::kReady;
  }
  void Abort() override {
    factory_->CountAbort();
    absl::MutexLock lock(&link_->mu);
    link_->aborted[rank_] = true;
  }

 private:
  void Count() {
    absl::MutexLock lock(&link_->mu);
    if (link_->open_group[rank_] >= 0) ++link_->open_group[rank_];
  }

  FakeNcclFactory* const factory_;
  const std::shared_ptr<FakeLink> link_;
  const int rank_;
  const bool never_ready_;
};

}  // namespace

absl::StatusOr<std::string> FakeNcclFactory::GetUniqueId() {
  const int n = ++unique_ids_made_;
  std::string id(kNcclUniqueIdBytes, '\0');
  std::memcpy(id.data(), &n, sizeof(n));
  id[kNcclUniqueIdBytes - 1] = 'F';
  return id;
}

absl::StatusOr<std::unique_ptr<NcclComm>> FakeNcclFactory::InitRank(const std::string& unique_id,
                                                                    int nranks, int rank,
                                                                    absl::Time deadline) {
  if (unique_id.size() != kNcclUniqueIdBytes || nranks != 2 || rank < 0 || rank > 1) {
    return absl::InvalidArgumentError("fake: bad InitRank arguments");
  }
  std::shared_ptr<FakeLink> shared;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<FakeLink>& entry = links_[unique_id];
    if (entry == nullptr) {
      entry = std::make_shared<FakeLink>();
      order_.push_back(entry);
    }
    shared = entry;
  }
  {
    absl::MutexLock lock(&shared->mu);
    shared->joined[rank] = true;
  }
  return std::make_unique<FakeComm>(this, shared, rank, never_complete_init_.load());
}

std::shared_ptr<FakeLink> FakeNcclFactory::link(const std::string& unique_id) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(unique_id);
  return it == links_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<FakeLink>> FakeNcclFactory::links() {
  absl::MutexLock lock(&mu_);
  return order_;
}

// HostKv ---------------------------------------------------------------------

void HostKv::Run(void* stream, std::function<void()> copy) {
  RunOn(stream, [copy = std::move(copy)] {
    copy();
    return true;
  });
}

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace tandem::kvtransfer::nccl::testing
