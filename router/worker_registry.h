// The router's view of the cluster: which prefill and decode workers exist,
// whether each is healthy, and how loaded it is.
//
// Owns: worker entries (from RegisterWorker), their channels and stubs,
// health from GetStatus polls, each worker's last polled status, the
// per-role round-robin cursors. Does not touch: requests (GenerateCall picks
// workers through Pick), the workers' own state, the scores themselves
// (router/routing_policy.h).
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
// KV events: the registry owns the prefix index and one KvEvents watch per
// worker (kv_event_watcher.h), started when a worker registers (again when
// it re-registers at another address) and stopped, its index entries
// erased, when it is dropped.
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
#include <limits>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "auth/cluster_auth.h"
#include "router/routing_policy.h"
#include "router/kv_event_watcher.h"
#include "router/prefix_index.h"
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
  // The KV layout id it registered with (equal to the one the router
  // expects of it); a P feeds only a D with an equal one.
  std::string kv_layout_id;
  std::unique_ptr<v1::DecodeWorker::Stub> decode_stub;    // decode workers
  std::unique_ptr<v1::PrefillWorker::Stub> prefill_stub;  // prefill workers
  // Signs every call to this worker (rpc::SignCall); the registry's
  // RegistryOptions::auth (nullptr or open: calls carry no credential).
  const auth::ClusterAuth* auth = nullptr;
  std::atomic<int> active_requests{0};  // routed by this router, not finished
  // Prompt tokens of this router's Prefill calls to it not yet finished.
  std::atomic<int64_t> prefill_tokens_in_flight{0};

  // Requests using this worker register a callback that runs when the
  // registry marks the worker unhealthy: a frozen worker would otherwise
  // hold their streams until the client's deadline. Returns a token for
  // RemoveLostCallback, which waits for a running callback to return.
  uint64_t AddLostCallback(std::function<void()> callback);
  void RemoveLostCallback(uint64_t token);
  // Runs the callbacks. `why`: the error that made a request report the
  // worker unreachable (e.g. "decode worker decode-0 failed: device lost:
  // ..."), kept for lost_reason(); empty when it missed status polls.
  void NotifyLost(const std::string& why);
  // The `why` of the last NotifyLost ("" before any, or after missed polls).
  std::string lost_reason() const;
  // A role change's drain timeout (router/role_changer.h): NotifyLost for
  // a worker that is alive and keeps serving what it has. A decode stream
  // that can migrate moves; one that cannot (route REMOTE, no migrations
  // left) finishes where it is instead of failing.
  void NotifyLeaving(const std::string& why) {
    leaving_ = true;
    NotifyLost(why);
  }
  bool leaving() const { return leaving_.load(); }
  // Records the message of an UNAVAILABLE answer the live worker gave of its
  // own (e.g. "device lost: ..." just before it exits), so a request whose
  // stream then breaks without an answer can still name the cause.
  void NoteUnavailable(const std::string& message);
  // The last NoteUnavailable message if it came within `within` of now
  // (an old answer says nothing of a later failure), else "".
  std::string last_unavailable(absl::Duration within) const;

 private:
  std::atomic<bool> leaving_{false};
  mutable absl::Mutex reason_mu_;  // never held while a callback runs
  std::string lost_reason_ ABSL_GUARDED_BY(reason_mu_);
  std::string last_unavailable_ ABSL_GUARDED_BY(reason_mu_);
  absl::Time last_unavailable_at_ ABSL_GUARDED_BY(reason_mu_) = absl::InfinitePast();
  absl::Mutex lost_mu_;
  uint64_t next_lost_token_ ABSL_GUARDED_BY(lost_mu_) = 0;
  std::map<uint64_t, std::function<void()>> lost_callbacks_ ABSL_GUARDED_BY(lost_mu_);
};

struct RegistryOptions {
  std::string model_fingerprint;  // workers must serve the same file
  // KvLayout::LayoutId a worker must register with (ExpectedKvLayout of
  // the router's model and configuration, worker/worker_engine.h):
  // kv_layout_ids[name] for a worker the config lists (each follows its
  // entry's device and KV dtype, so CPU and GPU workers may mix), else
  // kv_layout_id (engine.device's).
  std::string kv_layout_id;
  std::map<std::string, std::string> kv_layout_ids;
  int32_t poll_interval_ms = 500;  // per worker, between poll starts
  int32_t unhealthy_after_missed_polls = 3;
  int32_t rpc_timeout_ms = 2000;  // deadline of each GetStatus
  int32_t drop_after_ms = 30000;  // unhealthy this long -> removed
  // router.policy, its weights and its normalisers (engine.max_num_seqs,
  // engine.max_num_batched_tokens).
  RoutingOptions routing;
  // The cluster credential signer/verifier (cluster.secret_file; nullptr
  // or open: none). Polls and every call through a WorkerHandle are signed
  // with it, RegisterWorker verified. Outlives the registry.
  const auth::ClusterAuth* auth = nullptr;
  // Where the registry's lines go (registrations, health transitions,
  // drops, prefix-index drops); rpc::Log when empty.
  std::function<void(const std::string&)> log;
  // Between a worker's KvEvents stream ending and the next Watch (doubling
  // while the worker stays away, up to 2 s).
  int32_t kv_watch_retry_ms = 200;
};

// A worker wanted for one request.
struct PickRequest {
  v1::WorkerRole role = v1::ROLE_UNSPECIFIED;  // ROLE_DECODE or ROLE_PREFILL
  // The request's prompt token ids (BOS included): its cached prefix on
  // each worker is a score input. Must outlive the Pick call.
  std::span<const int32_t> prompt;
  // Workers that already failed this request (a retry or a migration
  // skips them).
  std::vector<std::string> avoid;
  // Not empty: only workers registered with this KV layout id (the
  // router picks a prefill worker for a decode worker with D's: KV moves
  // only between equal layouts, issue #16).
  std::string kv_layout_id;
  // A prefill worker whose queue would hold the request longer than this
  // (PredictedQueueWaitSeconds, from its measured prefill rate) is not
  // picked: it cannot serve before the request's deadline.
  double max_queue_wait_s = std::numeric_limits<double>::infinity();
};

// The chosen worker (null: no routable worker of the role outside avoid,
// or, with `explanation` saying so, none whose queue fits
// max_queue_wait_s), its score under router.policy and the inputs that
// gave it, e.g.
// "kv_aware score 0.93: 192/200 prompt tokens cached, 1990/2048 blocks free,
// 0 running, 0 waiting, 0 in flight" (routing_policy.h).
struct PickResult {
  std::shared_ptr<WorkerHandle> worker;
  double score = 0;
  std::string explanation;
};

class WorkerRegistry {
 public:
  // on_health_change(can_serve) runs (poll/registration thread, one call at
  // a time, in order) whenever CanServe() flips.
  WorkerRegistry(const RegistryOptions& options, std::function<void(bool)> on_health_change);
  ~WorkerRegistry();  // cancels polls in flight and stops the poll thread

  // Adds or refreshes a worker. INVALID_ARGUMENT for a missing
  // name/address or a role that is not prefill/decode; FAILED_PRECONDITION
  // when its model fingerprint or its kv_layout_id differs from the
  // router's (the field, the worker's and the router's values named).
  // ALREADY_EXISTS when the name is held by a healthy worker at another
  // address (two processes started with one --name): the entry is left
  // alone and the refusal logged once per (name, address). A registration
  // at the holder's address, or once the holder is unhealthy (missed polls
  // or reported unreachable: the old process died), takes the name over.
  [[nodiscard]] absl::Status Register(const v1::RegisterWorkerRequest& request);

  // A request found `handle`'s worker unreachable (a call failed at the
  // transport and a status probe failed too): it is unhealthy at once,
  // without waiting for missed polls (its other requests are told, as for
  // missed polls); a later successful poll makes it healthy again. No-op
  // if the worker re-registered elsewhere or is already unhealthy.
  void ReportUnreachable(const std::shared_ptr<WorkerHandle>& handle, const std::string& why);

  // Chooses the routable (healthy, not draining) worker of request.role
  // not in request.avoid (and with request.kv_layout_id when set) with the
  // best score under options.routing
  // (routing_policy.h) from its last polled status, this router's
  // in-flight requests on it and CachedPrefixTokens of the prompt; equal
  // scores are taken in turn (one cursor per role). Workers not polled yet
  // count as idle and empty.
  PickResult Pick(const PickRequest& request);

  // The router's prediction of a remote prefill of `prompt` (BOS
  // included) on the routable prefill worker that would finish it first
  // (routing_policy.h PredictedFinishSeconds; its cached prefix from the
  // prefix index), for the decode worker's placement
  // (DecodeGenerateRequest.prefill_estimate). nullopt when no routable
  // prefill worker has a known prefill rate.
  std::optional<v1::PrefillEstimate> EstimatePrefill(std::span<const int32_t> prompt);

  // Whether a routable worker of `role` exists (cheap; no score).
  bool HasRoutable(v1::WorkerRole role) const;

  // ---- Role changes (issue #35; router/role_changer.h runs them) ----
  struct RoleChangeStart {
    std::shared_ptr<WorkerHandle> handle;  // the worker as its requests hold it
    v1::WorkerRole previous_role = v1::ROLE_UNSPECIFIED;
    bool no_op = false;  // it already has the role: nothing was changed
  };
  // Takes worker `name` out of routing for a change to `role` (its
  // requests go on; new ones go elsewhere). Errors: NOT_FOUND "no worker
  // named X"; FAILED_PRECONDITION when it is unhealthy, draining or
  // already changing role, or when it is the last routable decode worker
  // and `role` is prefill (the router needs a decode worker to serve).
  [[nodiscard]] absl::StatusOr<RoleChangeStart> BeginRoleChange(const std::string& name,
                                                                v1::WorkerRole role);
  // Ends BeginRoleChange's change. `changed`: the worker serves `role` now
  // (a new handle with that role, routable at once; a heartbeat still
  // carrying the old role within kRoleSettle is ignored); else it is
  // routable again in its old role. No-op for a worker dropped meanwhile.
  void EndRoleChange(const std::string& name, v1::WorkerRole role, bool changed);
  // How long after a role change a registration with the old role counts
  // as a heartbeat sent before the change (not a change back).
  static constexpr absl::Duration kRoleSettle = absl::Seconds(3);

  // One worker as the planner sees it (router/planner.h).
  struct WorkerView {
    std::string name;
    v1::WorkerRole role = v1::ROLE_UNSPECIFIED;
    bool routable = false;  // healthy, not draining, not changing role
    bool changing_role = false;
    v1::WorkerStatus status;          // the last successful poll (empty before one)
    double prefill_tokens_per_s = 0;  // measured (0: not yet)
  };
  // Every registered worker, in name order.
  std::vector<WorkerView> Workers() const;

  // >= 1 healthy, not draining decode worker (prefill workers are optional).
  bool CanServe() const;

  // RegistryOptions::auth (nullptr when unset).
  const auth::ClusterAuth* auth() const { return options_.auth; }

  // Whether `name` is in the registry now (dropped workers are not).
  bool Contains(const std::string& name) const;

  // Tokens of `prompt` covered by the longest chain of its full blocks
  // that the router's prefix index says `worker` holds (PrefixIndex::
  // CachedPrefixTokens): a hint; 0 for an unknown worker or one whose
  // event stream is down.
  int32_t CachedPrefixTokens(const std::string& worker, std::span<const int32_t> prompt) const;

  // A fresh GetStatus of every worker, all in flight at once, each with a
  // deadline of rpc_timeout_ms; never blocks. `done` runs exactly once with
  // one status per worker in name order, on a gRPC thread (on the caller's
  // when there is no worker). A worker that did not answer is reported with
  // only name, role and address, and unreachable = true (its load is
  // unknown, not 0); healthy is the registry's health and the poll's
  // success. A dropped worker (drop_after_ms) is not reported. kv_index_blocks is the prefix index's block count for
  // the worker when the call started.
  void StatusAllAsync(std::function<void(std::vector<v1::WorkerStatus>)> done) const;

 private:
  struct Entry;
  // The routable workers `request` may go to (role, avoid, layout), as
  // candidates with their handles, their cached prefix of request.prompt
  // filled under kv_aware or `with_prefix`; prefill workers whose queue
  // outlasts max_queue_wait_s are left out and described in *too_busy.
  void GatherCandidates(const PickRequest& request, bool with_prefix,
                        std::vector<std::shared_ptr<WorkerHandle>>* handles,
                        std::vector<Candidate>* candidates,
                        std::vector<std::string>* too_busy) const;

  struct Entry {
    std::shared_ptr<WorkerHandle> handle;
    bool healthy = true;
    bool draining = false;  // last poll answered ready = false
    int missed_polls = 0;
    absl::Time unhealthy_since;  // when healthy became false
    // The last successful poll's reply (load and KV blocks for Pick);
    // empty until the first one.
    v1::WorkerStatus status;
    // The handle's active_requests when that reply arrived (this router's
    // requests the status counts).
    int in_flight_at_poll = 0;
    int64_t prefill_tokens_in_flight_at_poll = 0;  // likewise, prefill tokens
    absl::Time status_at = absl::InfinitePast();   // when `status` arrived
    // Prefill tokens/s over the polls after which prefill was still queued
    // (an exponential moving average, weight kRateWeight per new poll);
    // 0 until measured.
    double prefill_tokens_per_s = 0;
    // Out of routing for a role change (BeginRoleChange .. EndRoleChange).
    bool changing_role = false;
    // When the last role change ended (kRoleSettle).
    absl::Time role_changed_at = absl::InfinitePast();
    // Takes new requests.
    bool Routable() const { return healthy && !draining && !changing_role; }
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
  bool HasRoutableLocked(v1::WorkerRole role) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  // (name, address) of duplicate registrations already logged; a name's
  // pairs are forgotten when it gets a new holder.
  std::set<std::pair<std::string, std::string>> duplicate_logged_ ABSL_GUARDED_BY(mu_);
  // Round-robin cursor of Pick per role (ties, round_robin).
  std::map<v1::WorkerRole, uint64_t> cursors_ ABSL_GUARDED_BY(mu_);
  // Held while ReportHealth compares and reports, so reports stay in order.
  absl::Mutex report_mu_;
  bool reported_can_serve_ ABSL_GUARDED_BY(report_mu_) = false;
  bool reported_prefill_ ABSL_GUARDED_BY(report_mu_) = false;
  PrefixIndex index_;
  KvEventWatchers watchers_;  // after index_: stopped (and waited for) first
  grpc::CompletionQueue cq_;  // the poll thread's GetStatus calls
  grpc::Alarm wake_;          // set by the destructor: the poll thread stops
  std::thread poller_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_WORKER_REGISTRY_H_
