#include "nccl_test_util.h"

#include <cstring>
#include <random>
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

HostKv::HostKv(int32_t n_layers, int32_t layer_blocks, int32_t block_size, int32_t kv_dim,
               kv::KvDtype dtype)
    : n_layers_(n_layers),
      layer_blocks_(layer_blocks),
      block_size_(block_size),
      kv_dim_(kv_dim),
      dtype_(dtype),
      row_bytes_(uint64_t{static_cast<uint32_t>(kv_dim)} * kv::KvDtypeBytes(dtype)),
      k_(static_cast<size_t>(n_layers) * layer_blocks * block_size * row_bytes_),
      v_(k_.size()) {}

void HostKv::FillRandom(uint32_t seed) {
  std::mt19937 rng(seed);
  for (char& c : k_) c = static_cast<char>(rng());
  for (char& c : v_) c = static_cast<char>(rng());
}

kv::DevicePoolInfo HostKv::pool_info() const {
  kv::DevicePoolInfo info;
  info.k = const_cast<char*>(k_.data());
  info.v = const_cast<char*>(v_.data());
  info.pool_bytes = k_.size();
  info.n_layers = n_layers_;
  info.layer_blocks = layer_blocks_;
  info.block_size = block_size_;
  info.kv_dim = kv_dim_;
  info.dtype = dtype_;
  return info;
}

absl::Status HostKv::Check(std::span<const int32_t> table, int32_t layer, int32_t start,
                           int32_t count) const {
  if (layer < 0 || layer >= n_layers_ || start < 0 || count <= 0 ||
      static_cast<int64_t>(start) + count > static_cast<int64_t>(table.size()) * block_size_) {
    return absl::InvalidArgumentError(absl::StrCat("HostKv: range layer ", layer, " [", start,
                                                   ", +", count, ") outside the table"));
  }
  for (int32_t t = start; t < start + count; ++t) {
    int32_t block = table[t / block_size_];
    if (block < 0 || block >= layer_blocks_) {
      return absl::InvalidArgumentError(absl::StrCat("HostKv: block ", block, " outside the pool"));
    }
  }
  return absl::OkStatus();
}

void HostKv::Copy(const std::vector<int32_t>& table, int32_t layer, int32_t start, int32_t count,
                  char* frame, bool gather) {
  for (int32_t i = 0; i < count; ++i) {
    const int32_t t = start + i;
    const size_t row = (static_cast<size_t>(layer) * layer_blocks_ + table[t / block_size_]) *
                           block_size_ + t % block_size_;
    char* k = k_.data() + row * row_bytes_;
    char* v = v_.data() + row * row_bytes_;
    char* fk = frame + i * row_bytes_;
    char* fv = frame + (count + i) * row_bytes_;
    if (gather) {
      std::memcpy(fk, k, row_bytes_);
      std::memcpy(fv, v, row_bytes_);
    } else {
      std::memcpy(k, fk, row_bytes_);
      std::memcpy(v, fv, row_bytes_);
    }
  }
}

std::string HostKv::Rows(const std::vector<int32_t>& table, int32_t layer, int32_t start,
                         int32_t count) {
  std::string frame(2 * count * row_bytes_, '\0');
  Copy(table, layer, start, count, frame.data(), /*gather=*/true);
  return frame;
}

absl::Status HostKv::GatherRows(std::span<const int32_t> block_table, int32_t layer,
                                int32_t token_start, int32_t count, void* dst, void* stream) {
  if (absl::Status ok = Check(block_table, layer, token_start, count); !ok.ok()) return ok;
  std::vector<int32_t> table(block_table.begin(), block_table.end());
  RunOn(stream, [this, table, layer, token_start, count, dst] {
    Copy(table, layer, token_start, count, static_cast<char*>(dst), /*gather=*/true);
    return true;
  });
  return absl::OkStatus();
}

absl::Status HostKv::ScatterRows(std::span<const int32_t> block_table, int32_t layer,
                                 int32_t token_start, int32_t count, const void* src,
                                 void* stream) {
  if (absl::Status ok = Check(block_table, layer, token_start, count); !ok.ok()) return ok;
  std::vector<int32_t> table(block_table.begin(), block_table.end());
  RunOn(stream, [this, table, layer, token_start, count, src] {
    Copy(table, layer, token_start, count, static_cast<char*>(const_cast<void*>(src)),
         /*gather=*/false);
    return true;
  });
  return absl::OkStatus();
}

absl::Status HostKv::CopyFromPeer(const kv::DevicePoolInfo& peer,
                                  std::span<const int32_t> peer_table,
                                  std::span<const int32_t> block_table, int32_t layer,
                                  int32_t token_start, int32_t count, void* stream) {
  return absl::UnimplementedError("HostKv: CopyFromPeer is not used by the NCCL path");
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
