// The router's KvEvents watchers (docs/architecture.md, "KV events and the
// router's prefix index"): one KvEvents.Watch stream per registered worker,
// feeding the PrefixIndex.
//
// Owns: the streams (one grpc::ClientReadReactor each, gRPC's callback API:
// no thread per worker) and their restart timers (callback grpc::Alarm).
// Does not touch: worker health or registration (WorkerRegistry calls
// Watch/Stop), routing.
// Threads: thread-safe; Watch/Stop never block (callable under the
// registry's mutex). Stream callbacks run on gRPC threads and touch only
// their own watch and the index.
//
// A stream that ends (the worker died or restarted, the router fell behind
// and the worker cut it off, a gap the index refused) drops the worker's
// index entries at once and is started again after `retry_ms` while the
// worker is still watched; the new stream begins with a snapshot.
#ifndef TANDEM_ROUTER_KV_EVENT_WATCHER_H_
#define TANDEM_ROUTER_KV_EVENT_WATCHER_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "auth/cluster_auth.h"
#include "router/prefix_index.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

struct KvEventWatcherOptions {
  int32_t retry_ms = 200;  // between a stream's end and the next Watch
  // Signs every Watch call (cluster.secret_file); nullptr or open: none.
  // Outlives the watchers.
  const auth::ClusterAuth* auth = nullptr;
};

class KvEventWatchers {
 public:
  // `index` must outlive this object.
  KvEventWatchers(PrefixIndex* index, const KvEventWatcherOptions& options);
  // Stops every watch and waits until each stream and timer has ended.
  ~KvEventWatchers();
  KvEventWatchers(const KvEventWatchers&) = delete;
  KvEventWatchers& operator=(const KvEventWatchers&) = delete;

  // Watches `worker` at gRPC `address`. A worker already watched at the
  // same address is left alone; at another one its old stream is stopped
  // (entries dropped) and a new one starts.
  void Watch(const std::string& worker, const std::string& address);
  // Stops watching `worker` and erases its index entries (`why` logged if
  // it had some). Unknown names are ignored.
  void Stop(const std::string& worker, const std::string& why);

 private:
  class Stream;  // one worker's watch: its current call and restart timer
  // The one place a Watch call is created (and where its metadata, e.g.
  // credentials, is added).
  void StartCall(v1::KvEvents::Stub* stub, grpc::ClientContext* context,
                 const v1::WatchKvEventsRequest* request,
                 grpc::ClientReadReactor<v1::KvEventBatch>* reactor);
  // A Stream was destroyed (its last call and timer ended): one fewer to
  // wait for in the destructor.
  void StreamEnded();
  // Keeps a dead Stream's stub (and so its channel) until ClearGraveyard,
  // which Watch, Stop and the destructor call on their caller's thread: a
  // channel must not be destroyed on one of its own callback threads.
  void Bury(std::unique_ptr<v1::KvEvents::Stub> stub);
  void ClearGraveyard();

  PrefixIndex* const index_;
  const KvEventWatcherOptions options_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  absl::Mutex live_mu_;
  int live_ ABSL_GUARDED_BY(live_mu_) = 0;  // Streams not destroyed yet
  absl::Mutex grave_mu_;
  std::vector<std::unique_ptr<v1::KvEvents::Stub>> graveyard_ ABSL_GUARDED_BY(grave_mu_);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_KV_EVENT_WATCHER_H_
