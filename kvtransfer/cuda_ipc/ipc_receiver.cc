#include "kvtransfer/cuda_ipc/ipc_receiver.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

// How often the poller asks the device about copies in flight, and how long
// it sleeps with none (to close idle peers).
constexpr absl::Duration kPollInterval = absl::Microseconds(100);
constexpr absl::Duration kIdleWait = absl::Seconds(1);

std::string FrameName(const TransferKey& key, const FrameDescriptor& f) {
  return absl::StrCat("frame of request ", key.request_id, " attempt ", key.attempt, " layer ",
                      f.layer, " tokens [", f.token_start, ", ",
                      static_cast<uint64_t>(f.token_start) + f.token_count, ")");
}

}  // namespace

// One prefill process (instance), mapped into this one.
struct CudaIpcReceiver::Peer {
  std::string instance_id;
  int64_t pid = 0;
  std::string k_handle, v_handle;
  kv::DevicePoolInfo pools;                        // k, v: the mappings here
  void* stream = nullptr;                          // this peer's copy stream
  absl::flat_hash_map<std::string, void*> events;  // handle -> opened event
  int open_transfers = 0;
  int in_flight = 0;
  bool dead = false;  // a copy missed its deadline
  absl::Time idle_since = absl::InfinitePast();
};

struct CudaIpcReceiver::Transfer {
  TransferKey key;
  std::shared_ptr<Peer> peer;
  DeviceKvTarget target;
  std::vector<std::string> event_handles;  // per layer, from the setup
  int in_flight = 0;
  bool closing = false;
  Callback quiesced;
};

struct CudaIpcReceiver::Copy {
  Transfer* transfer = nullptr;  // alive while in_flight > 0
  void* event = nullptr;         // D's event recorded after the copy
  absl::Time deadline;
  uint64_t bytes = 0;
  std::string what;  // FrameName
  std::function<void(absl::Status)> done;
};

CudaIpcReceiver::CudaIpcReceiver(Options options)
    : options_(std::move(options)), poller_([this] { PollerLoop(); }) {}

CudaIpcReceiver::~CudaIpcReceiver() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.Signal();
  }
  poller_.join();
}

void CudaIpcReceiver::Log(std::vector<std::string>& lines) {
  if (options_.log) {
    for (const std::string& line : lines) options_.log(line);
  }
  lines.clear();
}

absl::StatusOr<void*> CudaIpcReceiver::PeerEventLocked(Peer& peer, const std::string& handle) {
  auto it = peer.events.find(handle);
  if (it != peer.events.end()) return it->second;
  absl::StatusOr<void*> event = options_.api->OpenEvent(handle);
  if (!event.ok()) return event.status();
  peer.events.emplace(handle, *event);
  return *event;
}

absl::StatusOr<std::shared_ptr<CudaIpcReceiver::Peer>> CudaIpcReceiver::PeerLocked(
    const IpcSetup& setup) {
  auto it = peers_.find(setup.instance_id);
  if (it != peers_.end()) {
    Peer& peer = *it->second;
    if (peer.k_handle != setup.k_handle || peer.v_handle != setup.v_handle ||
        peer.pools.pool_bytes != setup.pool_bytes ||
        peer.pools.layer_blocks != setup.layer_blocks ||
        peer.pools.block_size != setup.block_size) {
      return absl::FailedPreconditionError(
          absl::StrCat("cuda_ipc: prefill worker instance ", setup.instance_id,
                       " announced other pools than at its first transfer"));
    }
    return it->second;
  }
  auto peer = std::make_shared<Peer>();
  peer->instance_id = setup.instance_id;
  peer->pid = setup.pid;
  peer->k_handle = setup.k_handle;
  peer->v_handle = setup.v_handle;
  peer->pools.pool_bytes = setup.pool_bytes;
  peer->pools.n_layers = setup.n_layers;
  peer->pools.layer_blocks = setup.layer_blocks;
  peer->pools.block_size = setup.block_size;
  peer->pools.kv_dim = setup.kv_dim;
  peer->pools.dtype = setup.dtype;
  absl::StatusOr<void*> k = options_.api->OpenMemory(setup.k_handle);
  if (!k.ok()) return k.status();
  absl::StatusOr<void*> v = options_.api->OpenMemory(setup.v_handle);
  if (!v.ok()) {
    options_.api->CloseMemory(*k);
    return v.status();
  }
  absl::StatusOr<void*> stream = options_.api->CreateStream();
  if (!stream.ok()) {
    options_.api->CloseMemory(*k);
    options_.api->CloseMemory(*v);
    return stream.status();
  }
  peer->pools.k = *k;
  peer->pools.v = *v;
  peer->stream = *stream;
  peers_.emplace(setup.instance_id, peer);
  pending_log_.push_back(absl::StrCat("cuda_ipc: mapped the KV pools of prefill worker pid ",
                                      setup.pid, " instance ", setup.instance_id));
  return peer;
}

void CudaIpcReceiver::ClosePeerLocked(Peer& peer) {
  for (auto& [handle, event] : peer.events) options_.api->CloseEvent(event);
  peer.events.clear();
  if (peer.pools.k != nullptr) options_.api->CloseMemory(peer.pools.k);
  if (peer.pools.v != nullptr) options_.api->CloseMemory(peer.pools.v);
  if (peer.stream != nullptr) options_.api->DestroyStream(peer.stream);
  peer.pools.k = peer.pools.v = peer.stream = nullptr;
  pending_log_.push_back(absl::StrCat("cuda_ipc: closed the handles of prefill worker pid ",
                                      peer.pid, " instance ", peer.instance_id,
                                      peer.dead ? " (a copy missed its deadline)" : " (idle)"));
}

absl::Status CudaIpcReceiver::OpenTransfer(const TransferKey& key, std::string_view transport_setup,
                                           const DeviceKvTarget& target) {
  absl::StatusOr<IpcSetup> setup = DecodeSetup(transport_setup);
  if (!setup.ok()) return setup.status();
  const std::string host = options_.api->HostId();
  if (setup->host_id != host) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda_ipc needs one host: the prefill worker is on host ", setup->host_id,
                     ", this decode worker is on host ", host));
  }
  if (target.kv == nullptr) {
    return absl::FailedPreconditionError("cuda_ipc: 'target.kv' is null (no device KV)");
  }
  kv::DevicePoolInfo mine = target.kv->pool_info();
  struct {
    const char* name;
    int64_t theirs, ours;
  } fields[] = {{"n_layers", setup->n_layers, mine.n_layers},
                {"kv_dim", setup->kv_dim, mine.kv_dim},
                {"dtype", static_cast<int64_t>(setup->dtype), static_cast<int64_t>(mine.dtype)}};
  for (const auto& f : fields) {
    if (f.theirs != f.ours) {
      return absl::FailedPreconditionError(absl::StrCat("cuda_ipc: the prefill pools' '", f.name,
                                                        "' is ", f.theirs,
                                                        ", this decode worker's ", f.ours));
    }
  }
  std::vector<std::string> lines;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (transfers_.contains(key)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cuda_ipc: request ", key.request_id, " attempt ", key.attempt, " is already open"));
    }
    absl::StatusOr<std::shared_ptr<Peer>> peer = PeerLocked(*setup);
    if (peer.ok()) {
      for (const std::string& handle : setup->event_handles) {
        if (handle.empty()) continue;
        if (absl::StatusOr<void*> e = PeerEventLocked(**peer, handle); !e.ok()) {
          status = e.status();
          break;
        }
      }
    } else {
      status = peer.status();
    }
    if (status.ok()) {
      auto transfer = std::make_unique<Transfer>();
      transfer->key = key;
      transfer->peer = *peer;
      transfer->target = target;
      transfer->event_handles = std::move(setup->event_handles);
      ++(*peer)->open_transfers;
      transfers_.emplace(key, std::move(transfer));
    }
    lines.swap(pending_log_);
  }
  Log(lines);
  return status;
}

absl::StatusOr<void*> CudaIpcReceiver::EnqueueCopyLocked(Transfer& transfer,
                                                         const FrameDescriptor& frame) {
  const std::string what = FrameName(transfer.key, frame);
  Peer& peer = *transfer.peer;
  const kv::DevicePoolInfo& pools = peer.pools;
  auto loss = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(what, ": ", why));
  };
  absl::StatusOr<IpcLocator> locator = DecodeLocator(frame.locator);
  if (!locator.ok()) return loss(locator.status().message());
  if (frame.layer >= static_cast<uint32_t>(pools.n_layers) || frame.token_count == 0) {
    return loss(absl::StrCat("outside the prefill pools (", pools.n_layers, " layers)"));
  }
  const uint64_t end = static_cast<uint64_t>(frame.token_start) + frame.token_count;
  const uint64_t first = frame.token_start / static_cast<uint32_t>(pools.block_size);
  const uint64_t last = (end - 1) / static_cast<uint32_t>(pools.block_size);
  if (locator->first_block != first || locator->blocks.size() != last - first + 1) {
    return loss(absl::StrCat("cuda_ipc locator names blocks ", locator->first_block, "..+",
                             locator->blocks.size(), ", the range needs ", first, "..+",
                             last - first + 1, " (block size ", pools.block_size, ")"));
  }
  for (size_t i = 0; i < locator->blocks.size(); ++i) {
    if (locator->blocks[i] >= pools.layer_blocks) {
      return loss(absl::StrCat("cuda_ipc locator block ", locator->blocks[i], " outside [0, ",
                               pools.layer_blocks, ")"));
    }
  }
  const std::string& handle =
      locator->event_handle.empty() ? transfer.event_handles[frame.layer] : locator->event_handle;
  if (handle.empty()) return loss(absl::StrCat("no event handle for layer ", frame.layer));
  absl::StatusOr<void*> peer_event = PeerEventLocked(peer, handle);
  if (!peer_event.ok()) return peer_event.status();
  // Token addressing: entry t / block_size of P's table holds token t. The
  // entries before `first` are never read; they repeat a valid block.
  std::vector<int32_t> peer_table(last + 1, locator->blocks[0]);
  std::copy(locator->blocks.begin(), locator->blocks.end(), peer_table.begin() + first);
  void* event = nullptr;
  if (!free_events_.empty()) {
    event = free_events_.back();
    free_events_.pop_back();
  } else {
    absl::StatusOr<void*> created = options_.api->CreateEvent();
    if (!created.ok()) return created.status();
    event = *created;
  }
  absl::Status s = options_.api->StreamWaitEvent(peer.stream, *peer_event);
  if (s.ok()) {
    s = transfer.target.kv->CopyFromPeer(pools, peer_table, transfer.target.block_table,
                                         static_cast<int32_t>(frame.layer),
                                         static_cast<int32_t>(frame.token_start),
                                         static_cast<int32_t>(frame.token_count), peer.stream);
  }
  if (!s.ok()) {
    free_events_.push_back(event);
    return s;
  }
  if (s = options_.api->RecordEvent(event, peer.stream); !s.ok()) {
    // The copy is enqueued but cannot be tracked: this peer's stream is
    // not trusted again.
    options_.api->DestroyEvent(event);
    if (!peer.dead) {
      peer.dead = true;
      peers_.erase(peer.instance_id);
      dead_peers_.push_back(transfer.peer);
    }
    return s;
  }
  return event;
}

void CudaIpcReceiver::Receive(const TransferKey& key, const FrameDescriptor& frame,
                              std::function<void(absl::Status)> done) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(key);
  if (stop_)
    return FailLocked(std::move(done), absl::CancelledError("cuda_ipc receiver is shutting down"));
  if (it == transfers_.end() || it->second->closing) {
    return FailLocked(std::move(done),
                      absl::FailedPreconditionError(
                          absl::StrCat("cuda_ipc: no open transfer for ", FrameName(key, frame))));
  }
  Transfer& transfer = *it->second;
  if (transfer.peer->dead) {
    return FailLocked(
        std::move(done),
        absl::UnavailableError(absl::StrCat(
            "cuda_ipc: ", FrameName(key, frame), ": prefill worker pid ", transfer.peer->pid,
            " instance ", transfer.peer->instance_id, " stopped completing copies")));
  }
  absl::StatusOr<void*> event = EnqueueCopyLocked(transfer, frame);
  if (!event.ok()) return FailLocked(std::move(done), event.status());
  auto copy = std::make_unique<Copy>();
  copy->transfer = &transfer;
  copy->event = *event;
  copy->deadline = absl::Now() + absl::Milliseconds(options_.transfer_timeout_ms);
  kv::DevicePoolInfo mine = transfer.target.kv->pool_info();
  copy->bytes =
      2ull * frame.token_count * static_cast<uint64_t>(mine.kv_dim) * kv::KvDtypeBytes(mine.dtype);
  copy->what = FrameName(key, frame);
  copy->done = std::move(done);
  ++transfer.in_flight;
  ++transfer.peer->in_flight;
  copies_.push_back(std::move(copy));
  cv_.Signal();
}

void CudaIpcReceiver::FailLocked(std::function<void(absl::Status)> done, absl::Status status) {
  ready_.push_back([done = std::move(done), status = std::move(status)] { done(status); });
  cv_.Signal();
}

void CudaIpcReceiver::CloseTransfer(const TransferKey& key, std::function<void()> quiesced) {
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(key);
    if (it != transfers_.end() && it->second->in_flight > 0) {
      it->second->closing = true;
      it->second->quiesced = std::move(quiesced);
      return;
    }
    if (it != transfers_.end()) {
      Peer& peer = *it->second->peer;
      if (--peer.open_transfers == 0) peer.idle_since = absl::Now();
      transfers_.erase(it);
    }
  }
  if (quiesced) quiesced();
}

void CudaIpcReceiver::FinishCopyLocked(Copy& copy, absl::Status status,
                                       std::vector<Callback>* out) {
  Transfer& transfer = *copy.transfer;
  std::shared_ptr<Peer> peer = transfer.peer;
  if (status.ok()) {
    bytes_total_ += copy.bytes;
    free_events_.push_back(copy.event);
  } else {
    options_.api->DestroyEvent(copy.event);  // its record may still be pending
  }
  out->push_back([done = std::move(copy.done), status = std::move(status)] { done(status); });
  --peer->in_flight;
  if (--transfer.in_flight == 0 && transfer.closing) {
    if (transfer.quiesced) out->push_back(std::move(transfer.quiesced));
    if (--peer->open_transfers == 0) peer->idle_since = absl::Now();
    TransferKey key = transfer.key;
    transfers_.erase(key);  // destroys `transfer`
  }
}

void CudaIpcReceiver::PollerLoop() {
  absl::MutexLock lock(&mu_);
  std::vector<Callback> callbacks;
  std::vector<std::string> lines;
  while (true) {
    if (!stop_ && ready_.empty()) {
      cv_.WaitWithTimeout(&mu_, copies_.empty() ? kIdleWait : kPollInterval);
    }
    callbacks.swap(ready_);
    const absl::Time now = absl::Now();
    // Copies, in the order they were enqueued (a peer's stream is FIFO).
    std::vector<std::unique_ptr<Copy>> pending;
    for (std::unique_ptr<Copy>& copy : copies_) {
      Peer& peer = *copy->transfer->peer;
      absl::Status status;
      bool finished = true;
      absl::StatusOr<bool> ready = options_.api->QueryEvent(copy->event);
      if (!ready.ok()) {
        status = ready.status();
      } else if (*ready) {
        status = absl::OkStatus();
      } else if (stop_) {
        status = absl::CancelledError(
            absl::StrCat("cuda_ipc receiver shut down before the ", copy->what, " was copied"));
      } else if (peer.dead) {
        status = absl::DeadlineExceededError(absl::StrCat(
            "cuda_ipc: the ", copy->what, " was queued behind a copy from prefill worker pid ",
            peer.pid, " that missed its deadline"));
      } else if (now >= copy->deadline) {
        status = absl::DeadlineExceededError(
            absl::StrCat("cuda_ipc: the ", copy->what, " did not complete within ",
                         options_.transfer_timeout_ms, " ms (prefill worker pid ", peer.pid,
                         " instance ", peer.instance_id, " may have stopped)"));
        peer.dead = true;
        auto it = peers_.find(peer.instance_id);
        if (it != peers_.end()) {
          dead_peers_.push_back(it->second);
          peers_.erase(it);
        }
        lines.push_back(std::string(status.message()));
      } else {
        finished = false;
      }
      if (finished) {
        FinishCopyLocked(*copy, std::move(status), &callbacks);
      } else {
        pending.push_back(std::move(copy));
      }
    }
    copies_.swap(pending);
    // Timed-out peers close once nothing of theirs is in flight; idle ones
    // after idle_close_ms (or all at shutdown).
    for (auto it = dead_peers_.begin(); it != dead_peers_.end();) {
      if ((*it)->in_flight == 0) {
        ClosePeerLocked(**it);
        it = dead_peers_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = peers_.begin(); it != peers_.end();) {
      Peer& peer = *it->second;
      bool idle = peer.open_transfers == 0 && peer.in_flight == 0 &&
                  now - peer.idle_since >= absl::Milliseconds(options_.idle_close_ms);
      if (stop_ || idle) {
        ClosePeerLocked(peer);
        peers_.erase(it++);
      } else {
        ++it;
      }
    }
    lines.insert(lines.end(), pending_log_.begin(), pending_log_.end());
    pending_log_.clear();
    const bool exit = stop_ && copies_.empty() && ready_.empty();
    if (!callbacks.empty() || !lines.empty()) {
      mu_.Unlock();
      for (Callback& cb : callbacks) cb();
      callbacks.clear();
      Log(lines);
      mu_.Lock();
    }
    if (exit && ready_.empty()) break;
  }
  for (void* event : free_events_) options_.api->DestroyEvent(event);
  free_events_.clear();
}

}  // namespace tandem::kvtransfer::cuda_ipc
