#include "router/prefix_index.h"

#include "absl/strings/str_cat.h"
#include "common/server/log.h"
#include "engine/kv/kv_cache_manager.h"

namespace tandem::router {

PrefixIndex::PrefixIndex(std::string model_fingerprint, std::function<void(const std::string&)> log)
    : model_fingerprint_(std::move(model_fingerprint)), log_(std::move(log)) {}

void PrefixIndex::Log(const std::string& line) const {
  if (log_) {
    log_(line);
  } else {
    rpc::Log(line);
  }
}

void PrefixIndex::DropLocked(const std::string& name, Worker& w, const std::string& why) {
  if (w.synced) {
    Log(absl::StrCat("kv index: worker ", name, ": ", w.hashes.size(), " blocks dropped (", why,
                     ")"));
  }
  w.synced = false;
  w.hashes.clear();
  w.last_sequence = 0;
}

bool PrefixIndex::Apply(const std::string& worker, const v1::KvEventBatch& batch) {
  absl::MutexLock lock(&mu_);
  Worker& w = workers_[worker];
  if (batch.block_size() == 0 || batch.block_size() > (1u << 20)) {
    DropLocked(worker, w, absl::StrCat("block_size ", batch.block_size(), " is invalid"));
    return false;
  }
  if (batch.snapshot()) {
    if (w.instance_id != 0 && w.instance_id != batch.instance_id()) {
      Log(absl::StrCat("kv index: worker ", worker, " is a new instance (", w.instance_id, " -> ",
                       batch.instance_id(), "): restarted, its old entries are gone"));
    }
    w.hashes.clear();
    w.instance_id = batch.instance_id();
    w.block_size = static_cast<int32_t>(batch.block_size());
    w.last_sequence = batch.sequence();
    for (const v1::KvBlockEvent& e : batch.events()) {
      if (e.kind() == v1::KvBlockEvent::STORED) w.hashes.insert({e.hash().hi(), e.hash().lo()});
    }
    w.synced = true;
    return true;
  }
  if (!w.synced) {
    DropLocked(worker, w, "event batch before a snapshot");
    return false;
  }
  if (batch.instance_id() != w.instance_id) {
    DropLocked(worker, w,
               absl::StrCat("instance changed from ", w.instance_id, " to ", batch.instance_id(),
                            " without a snapshot"));
    return false;
  }
  if (batch.sequence() != w.last_sequence + 1) {
    DropLocked(
        worker, w,
        absl::StrCat("gap: expected sequence ", w.last_sequence + 1, ", got ", batch.sequence()));
    return false;
  }
  if (static_cast<int32_t>(batch.block_size()) != w.block_size) {
    DropLocked(worker, w,
               absl::StrCat("block_size changed from ", w.block_size, " to ", batch.block_size()));
    return false;
  }
  for (const v1::KvBlockEvent& e : batch.events()) {
    const std::pair<uint64_t, uint64_t> key{e.hash().hi(), e.hash().lo()};
    if (e.kind() == v1::KvBlockEvent::STORED) {
      w.hashes.insert(key);
    } else if (e.kind() == v1::KvBlockEvent::REMOVED) {
      w.hashes.erase(key);
    }
  }
  w.last_sequence += static_cast<uint64_t>(batch.events_size());
  return true;
}

void PrefixIndex::Drop(const std::string& worker, const std::string& why) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker);
  if (it != workers_.end()) DropLocked(worker, it->second, why);
}

void PrefixIndex::Erase(const std::string& worker, const std::string& why) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end()) return;
  DropLocked(worker, it->second, why);
  workers_.erase(it);
}

int32_t PrefixIndex::CachedPrefixTokens(const std::string& worker,
                                        std::span<const int32_t> prompt) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end() || !it->second.synced || it->second.hashes.empty()) return 0;
  const Worker& w = it->second;
  const size_t bs = static_cast<size_t>(w.block_size);
  // The chain hash of engine/kv (kv::HashBlock, as HashFullBlocks chains it),
  // stopping at the first block the worker does not hold.
  kv::BlockHash parent;
  size_t blocks = 0;
  for (; (blocks + 1) * bs <= prompt.size(); ++blocks) {
    parent = kv::HashBlock(parent, prompt.subspan(blocks * bs, bs), model_fingerprint_);
    if (!w.hashes.contains({parent.hi, parent.lo})) break;
  }
  return static_cast<int32_t>(blocks * bs);
}

uint32_t PrefixIndex::NumBlocks(const std::string& worker) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = workers_.find(worker);
  return it == workers_.end() ? 0 : static_cast<uint32_t>(it->second.hashes.size());
}

}  // namespace tandem::router
