// The router's view of the cluster: which prefill and decode workers exist,
// whether each is healthy, and how loaded it is.
//
// Owns: worker entries (from RegisterWorker), their channels and stubs,
// health from GetStatus polls. Does not touch: requests (GenerateCall picks
// workers through Pick), the workers' own state.
// Threads: one poll thread, which drives every status poll asynchronously
// through one grpc::CompletionQueue (no thread per worker); StatusAllAsync
// uses gRPC's callback API. Every public method is thread-safe (mu_).
//
// Health: a worker is healthy from its first registration (at an address)
// or a successful poll until `unhealthy_after_missed_polls` polls in a row
// fail (DESIGN.md, Router) or a request reports it unreachable; then its
// in-flight requests are told (NotifyLost: failover, migration). Heartbeat
// re-registrations at the same address do not make it healthy again. Each worker is polled on
// its own schedule, every poll_interval_ms with a deadline of
// rpc_timeout_ms, so a frozen worker delays no other worker's health. A poll
// answered with ready = false (the worker is draining) is not a failure: the
// worker gets no new requests but keeps finishing the ones it has. A worker
// unhealthy for drop_after_ms is removed (its handle lives on in the
// requests holding it); it may register again.
//
// Serving: the router can serve with >= 1 healthy decode worker; prefill
// workers are optional (without one, decode workers prefill every prompt
// themselves). Each change of "a prefill worker is available" is logged once.
#ifndef TANDEM_ROUTER_WORKER_REGISTRY_H_
#define TANDEM_ROUTER_WORKER_REGISTRY_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth/cluster_auth.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

// One worker as requests see it. Shared so a request keeps its stub alive
// even if the worker re-registers at another address, or is dropped from
// the registry, meanwhile.
struct WorkerHandle {
  std::string name;
  v1::WorkerRole role = v1::ROLE_UNSPECIFIED;
  std::string address;
  std::string kv_endpoint;
  std::unique_ptr<v1::DecodeWorker::Stub> decode_stub;    // decode workers
  std::unique_ptr<v1::PrefillWorker::Stub> prefill_stub;  // prefill workers
  // Signs every call to this worker (rpc::SignCall); the registry's
  // RegistryOptions::auth (nullptr or open: calls carry no credential).
  const auth::ClusterAuth* auth = nullptr;
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
  // KvLayout::LayoutId every worker must register with (ExpectedKvLayout
  // of the router's model and configuration, common/server/worker_engine.h).
  std::string kv_layout_id;
  int32_t poll_interval_ms = 500;      // per worker, between poll starts
  int32_t unhealthy_after_missed_polls = 3;
  int32_t rpc_timeout_ms = 2000;       // deadline of each GetStatus
  int32_t drop_after_ms = 30000;       // unhealthy this long -> removed
  // The cluster credential signer/verifier (cluster.secret_file; nullptr
  // or open: none). Polls and every call through a WorkerHandle are signed
  // with it, RegisterWorker verified. Outlives the registry.
  const auth::ClusterAuth* auth = nullptr;
  // Where the registry's lines go (registrations, health transitions,
  // drops); rpc::Log when empty.
  std::function<void(const std::string&)> log;
};

class WorkerRegistry {
 public:
  // on_health_change(can_serve) runs (poll/registration thread, one call at
  // a time, in order) whenever CanServe() flips.
  WorkerRegistry(const RegistryOptions& options,
                 std::function<void(bool)> on_health_change);
  ~WorkerRegistry();  // cancels polls in flight and stops the poll thread

  // Adds or refreshes a worker. INVALID_ARGUMENT for a missing
  // name/address or a role that is not prefill/decode; FAILED_PRECONDITION
  // when its model fingerprint or its kv_layout_id differs from the
  // router's (the field, the worker's and the router's values named).
  absl::Status Register(const v1::RegisterWorkerRequest& request);

  // A request found `handle`'s worker unreachable (a call failed at the
  // transport and a status probe failed too): it is unhealthy at once,
  // without waiting for missed polls (its other requests are told, as for
  // missed polls); a later successful poll makes it healthy again. No-op
  // if the worker re-registered elsewhere or is already unhealthy.
  void ReportUnreachable(const std::shared_ptr<WorkerHandle>& handle, const std::string& why);

  // The healthy (and not draining) worker of `role` whose name is not in
  // `avoid` with the fewest active requests (ties: name order), or nullptr.
  // `avoid` lets a retry or a migration skip the workers that already
  // failed the request.
  std::shared_ptr<WorkerHandle> Pick(v1::WorkerRole role,
                                     const std::vector<std::string>& avoid = {}) const;

  // >= 1 healthy, not draining decode worker (prefill workers are optional).
  bool CanServe() const;

  // RegistryOptions::auth (nullptr when unset).
  const auth::ClusterAuth* auth() const { return options_.auth; }

  // Whether `name` is in the registry now (dropped workers are not).
  bool Contains(const std::string& name) const;

  // A fresh GetStatus of every worker, all in flight at once, each with a
  // deadline of rpc_timeout_ms; never blocks. `done` runs exactly once with
  // one status per worker in name order, on a gRPC thread (on the caller's
  // when there is no worker). A worker that did not answer is reported with
  // only name, role and address; healthy is the registry's health and the
  // poll's success.
  void StatusAllAsync(std::function<void(std::vector<v1::WorkerStatus>)> done) const;

 private:
  struct Entry {
    std::shared_ptr<WorkerHandle> handle;
    bool healthy = true;
    bool draining = false;  // last poll answered ready = false
    int missed_polls = 0;
    absl::Time unhealthy_since;  // when healthy became false
    // Takes new requests.
    bool Routable() const { return healthy && !draining; }
  };
  struct PollCall;  // one GetStatus in flight on cq_

  // The poll thread: starts due polls, applies results, drops workers.
  void PollLoop();
  // Starts a GetStatus of `handle` on cq_ (deadline rpc_timeout_ms).
  PollCall* StartPoll(const std::shared_ptr<WorkerHandle>& handle);
  void OnPollDone(PollCall* call);
  // Removes workers unhealthy for drop_after_ms; returns the earliest time
  // another may be due (InfiniteFuture when none).
  absl::Time DropExpired(absl::Time now);
  bool CanServeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PrefillAvailableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Compares the current state with the last one reported: logs a change of
  // prefill availability, calls on_health_change_ on a change of CanServe.
  void ReportHealth();
  void Log(const std::string& line) const;

  const RegistryOptions options_;
  const std::function<void(bool)> on_health_change_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
  // Held while ReportHealth compares and reports, so reports stay in order.
  absl::Mutex report_mu_;
  bool reported_can_serve_ ABSL_GUARDED_BY(report_mu_) = false;
  bool reported_prefill_ ABSL_GUARDED_BY(report_mu_) = false;
  grpc::CompletionQueue cq_;  // the poll thread's GetStatus calls
  grpc::Alarm wake_;          // set by the destructor: the poll thread stops
  std::thread poller_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_WORKER_REGISTRY_H_
