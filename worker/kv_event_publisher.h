// A worker's KV event publisher (docs/architecture.md, "KV events and the
// router's prefix index"): numbers the engine's prefix-cache events, keeps
// the set of hashes they describe, and serves them to watchers
// (KvEvents.Watch: a snapshot, then event batches in order).
//
// Owns: the worker's instance id, the sequence counter, the cached-hash set
// (rebuilt from the events alone: the engine hands over every event since
// its start, so the set is the prefix cache's as of the last event and a
// snapshot taken under the same mutex is consistent with the sequence),
// the subscribers and the KvEvents service.
// Does not touch: the engine (it only receives events through
// EngineCoreOptions::kv_event_sink), routing.
// Threads: thread-safe. Publish runs on the engine's loop thread and never
// waits for a subscriber: each subscriber has a bounded queue; one that
// falls behind (max_queued_batches unsent) loses its queued batches and its
// stream ends with RESOURCE_EXHAUSTED, so the watcher sees a gap and watches
// again. gRPC's callback API serves Watch (no thread per subscriber).
#ifndef TANDEM_WORKER_KV_EVENT_PUBLISHER_H_
#define TANDEM_WORKER_KV_EVENT_PUBLISHER_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "auth/cluster_auth.h"
#include "engine/kv/kv_cache_manager.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

// Where one subscriber's batches go: a Watch stream (StreamSink) or, in
// tests, a fake. Called under the publisher's mutex: must not block and
// must not call back into the publisher.
class KvEventOutlet {
 public:
  virtual ~KvEventOutlet() = default;
  // Queues `batch`; false when the outlet is closed (the subscriber left).
  virtual bool Write(const v1::KvEventBatch& batch) = 0;
  // Batches queued and not yet sent.
  virtual size_t Queued() = 0;
  // Ends the stream with `status` (after what is queued).
  virtual void Finish(const grpc::Status& status) = 0;
};

struct KvEventPublisherOptions {
  int32_t block_size = 16;           // engine.block_size, sent in every batch (> 0)
  uint64_t instance_id = 0;          // 0: a random non-zero 64-bit id
  size_t max_queued_batches = 1024;  // per subscriber (>= 1)
  // Verifies every Watch call (cluster.secret_file: a call without the
  // router's credential is UNAUTHENTICATED); nullptr or open: none.
  // Outlives the publisher.
  const auth::ClusterAuth* auth = nullptr;
};

class KvEventPublisher {
 public:
  explicit KvEventPublisher(const KvEventPublisherOptions& options);
  ~KvEventPublisher();  // ends every subscriber's stream (UNAVAILABLE)
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Numbers `events` (the next sequence numbers, consecutive, from 1),
  // applies them to the hash set and queues one batch to every subscriber.
  // Empty: nothing happens. The EngineCoreOptions::kv_event_sink.
  void Publish(std::vector<kv::KvCacheEvent> events);

  // Adds a subscriber: its first batch is a snapshot (every hash cached
  // now, sequence = last_sequence()), then every later Publish's batch.
  void Subscribe(std::shared_ptr<KvEventOutlet> outlet);

  uint64_t instance_id() const { return instance_id_; }
  int32_t block_size() const { return options_.block_size; }
  // The sequence number of the last event published (0: none).
  uint64_t last_sequence() const;
  // Hashes cached now (the set the events describe).
  size_t num_cached() const;
  // Subscribers still attached (closed ones are pruned on Publish).
  size_t num_subscribers() const;

  // The KvEvents service (callback API, Watch registered raw so it shares
  // StreamSink); lives as long as the publisher.
  grpc::Service* service();

 private:
  class Service;
  // Writes `batch` to every subscriber; drops closed ones and ends those
  // that fell behind.
  void FanOutLocked(const v1::KvEventBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct HashKey {
    uint64_t hi, lo;
    bool operator==(const HashKey& o) const { return hi == o.hi && lo == o.lo; }
    template <typename H>
    friend H AbslHashValue(H h, const HashKey& k) {
      return H::combine(std::move(h), k.hi, k.lo);
    }
  };

  const KvEventPublisherOptions options_;
  const uint64_t instance_id_;
  mutable absl::Mutex mu_;
  uint64_t last_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<HashKey> cached_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<KvEventOutlet>> subscribers_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Service> service_;
};

}  // namespace tandem

#endif  // TANDEM_WORKER_KV_EVENT_PUBLISHER_H_
