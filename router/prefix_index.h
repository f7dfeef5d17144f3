// The router's prefix index (docs/architecture.md, "KV events and the
// router's prefix index"): per worker, the block size and the set of
// prefix-cache block hashes its KvEvents stream says it holds. A hint for
// routing: the worker's own cache still decides what it reuses.
//
// Owns: the per-worker hash sets, each worker's instance id and last
// sequence number, and the gap rules below.
// Does not touch: the streams (KvEventWatchers feeds it), worker health.
// Threads: thread-safe (one mutex; queries take it shared).
//
// Rules: a snapshot replaces the worker's entries. An event batch is
// applied only on top of a snapshot or batch of the same instance whose
// last sequence is the batch's sequence - 1; otherwise (a gap, another
// instance, no snapshot yet, a bad block size) the worker's entries are
// dropped and Apply answers false: the watcher must watch again, which
// yields a fresh snapshot. Each drop, and each snapshot of a new instance
// of a known worker (a restart), is logged once, naming the worker and why.
#ifndef TANDEM_ROUTER_PREFIX_INDEX_H_
#define TANDEM_ROUTER_PREFIX_INDEX_H_

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::router {

class PrefixIndex {
 public:
  // `model_fingerprint` must be the one workers mix into their block hashes
  // (the model file's, ModelBundle::fingerprint, as EngineCoreOptions gets
  // it from CoreOptionsFromConfig). `log` takes the drop lines (rpc::Log
  // when empty).
  explicit PrefixIndex(std::string model_fingerprint,
                       std::function<void(const std::string&)> log = nullptr);

  // Applies one message of `worker`'s KvEvents stream (rules above).
  // Returns false when the worker's entries were dropped instead: the
  // caller ends the stream and watches again.
  bool Apply(const std::string& worker, const v1::KvEventBatch& batch);

  // Drops `worker`'s entries (its stream ended, it re-registered elsewhere
  // or left the registry); logs `why` once if it had a snapshot. The
  // instance id is remembered, so a later snapshot can tell a restart.
  void Drop(const std::string& worker, const std::string& why);

  // Forgets `worker` entirely (it left the registry); logs like Drop.
  void Erase(const std::string& worker, const std::string& why);

  // Tokens of `prompt` covered by the longest chain of its full blocks
  // (the worker's block size) that `worker` holds, from block 0 on: the
  // first missing block ends the chain. 0 for a worker without a snapshot.
  int32_t CachedPrefixTokens(const std::string& worker, std::span<const int32_t> prompt) const;

  // Blocks held for `worker` (0 without a snapshot).
  uint32_t NumBlocks(const std::string& worker) const;

 private:
  struct Worker {
    bool synced = false;       // a snapshot was applied and nothing dropped since
    uint64_t instance_id = 0;  // last seen (kept across drops)
    uint64_t last_sequence = 0;
    int32_t block_size = 0;
    absl::flat_hash_set<std::pair<uint64_t, uint64_t>> hashes;
  };
  // Clears `w`'s entries; logs "kv index: worker W: N blocks dropped (why)".
  void DropLocked(const std::string& name, Worker& w, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Log(const std::string& line) const;

  const std::string model_fingerprint_;
  const std::function<void(const std::string&)> log_;
  mutable absl::Mutex mu_;
  std::map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_PREFIX_INDEX_H_
