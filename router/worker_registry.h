// The router's view of the cluster: which prefill and decode workers exist,
// whether each is healthy, and how loaded it is.
//
// Owns: worker entries (from RegisterWorker), their channels and stubs,
// health from GetStatus polls. Does not touch: requests (GenerateCall picks
// workers through Pick*), the workers' own state.
// Threads: a poll thread; every public method is thread-safe (mu_).
//
// Health: a worker is healthy from a successful registration or poll until
// `unhealthy_after_missed_polls` polls in a row fail (DESIGN.md, Router);
// then its in-flight requests fail (NotifyLost). A poll answered with
// ready = false (the worker is draining) is not a failure: the worker gets
// no new requests but keeps finishing the ones it has.
#ifndef TANDEM_ROUTER_WORKER_REGISTRY_H_
#define TANDEM_ROUTER_WORKER_REGISTRY_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

// One worker as requests see it. Shared so a request keeps its stub alive
// even if the worker re-registers at another address meanwhile.
struct WorkerHandle {
  std::string name;
  v1::WorkerRole role = v1::ROLE_UNSPECIFIED;
  std::string address;
  std::string kv_endpoint;
  std::unique_ptr<v1::DecodeWorker::Stub> decode_stub;    // decode workers
  std::unique_ptr<v1::PrefillWorker::Stub> prefill_stub;  // prefill workers
  std::atomic<int> active_requests{0};  // routed by this router, not finished

  // Requests using this worker register a callback that runs when the
  // registry marks the worker unhealthy: a frozen worker would otherwise
  // hold their streams until the client's deadline. Returns a token for
  // RemoveLostCallback, which waits for a running callback to return.
  uint64_t AddLostCallback(std::function<void()> callback);
  void RemoveLostCallback(uint64_t token);
  void NotifyLost();

 private:
  absl::Mutex lost_mu_;
  uint64_t next_lost_token_ ABSL_GUARDED_BY(lost_mu_) = 0;
  std::map<uint64_t, std::function<void()>> lost_callbacks_ ABSL_GUARDED_BY(lost_mu_);
};

struct RegistryOptions {
  std::string model_fingerprint;       // workers must serve the same file
  int32_t poll_interval_ms = 500;
  int32_t unhealthy_after_missed_polls = 3;
  int32_t rpc_timeout_ms = 2000;
  bool prefill_required = true;        // remote prefill is configured
};

class WorkerRegistry {
 public:
  // on_health_change(can_serve) runs (poll/registration thread) whenever
  // CanServe() flips.
  WorkerRegistry(const RegistryOptions& options,
                 std::function<void(bool)> on_health_change);
  ~WorkerRegistry();  // stops the poll thread

  // Adds or refreshes a worker. FAILED_PRECONDITION when its model
  // fingerprint differs (both values named); INVALID_ARGUMENT for a missing
  // name/address or a role that is not prefill/decode.
  absl::Status Register(const v1::RegisterWorkerRequest& request);

  // The healthy (and not draining) worker of `role` whose name is not in
  // `avoid` with the fewest active requests (ties: name order), or nullptr.
  // `avoid` lets a retry or a migration skip the workers that already
  // failed the request.
  std::shared_ptr<WorkerHandle> Pick(v1::WorkerRole role,
                                     const std::vector<std::string>& avoid = {}) const;

  // >= 1 healthy decode worker, and >= 1 healthy prefill worker when
  // prefill_required.
  bool CanServe() const;

  // Fresh GetStatus of every worker (parallel, rpc_timeout_ms each); an
  // unreachable worker is reported with healthy = false.
  std::vector<v1::WorkerStatus> StatusAll() const;

 private:
  struct Entry {
    std::shared_ptr<WorkerHandle> handle;
    bool healthy = true;
    bool draining = false;  // last poll answered ready = false
    int missed_polls = 0;
    // Takes new requests.
    bool Routable() const { return healthy && !draining; }
  };
  void PollLoop();
  bool CanServeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyIfChanged(bool before);

  const RegistryOptions options_;
  const std::function<void(bool)> on_health_change_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread poller_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_WORKER_REGISTRY_H_
