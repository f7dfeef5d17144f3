// A worker's registration with every router replica (DESIGN.md,
// Processes; docs/architecture.md "Registration and health"): the router
// address (--router, or the config's router.listen) is a HOST:PORT whose
// host may name several routers, as a Kubernetes headless Service does
// (one A/AAAA record per router pod). The host is resolved at Start and
// again every kRouterResolveInterval; each resolved address gets its own
// registration loop, the same as a single router's: RegisterWorker with a
// 1 s deadline, repeated every second as a heartbeat once registered or
// while the name is held elsewhere, every 200 ms otherwise.
//
// Owns: one thread that resolves, one thread per resolved address (its
// stub and its registered / held-elsewhere state, its log-once lines), the
// first refusal.
// Does not touch: the worker's server, its health, its drain; a refusal is
// handed to Options::on_refusal (RunWorkerMain: SIGTERM to itself).
// Threads: Start/Stop/refusal from any thread; the loops run on their own
// threads and log through rpc::Log.
//
// Log lines ("LABEL" is HOST:PORT as given when the address is that same
// text, an IP literal; else "HOST:PORT (ADDR)"):
//   registered with router LABEL                  (each time it becomes so)
//   router LABEL refused registration: WHY        (then on_refusal)
//   router LABEL refused registration: WHY (retrying until the name frees)
//   router HOST:PORT no longer resolves to ADDR; stopped registering there
//   router HOST:PORT does not resolve: WHY; retrying   (once per outage)
//   router LABEL: cannot register (CODE: WHY); retrying (once until the
//                                                       next success)
#ifndef TANDEM_WORKER_ROUTER_REGISTRATION_H_
#define TANDEM_WORKER_ROUTER_REGISTRATION_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "auth/cluster_auth.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

// How often the router's host is resolved again: a router replica that
// appears (scale-up, a rescheduled pod with a new IP) is registered with
// within this time, one that disappears stops being heartbeated.
inline constexpr absl::Duration kRouterResolveInterval = absl::Seconds(5);

// Every address `router` ("HOST:PORT", "[V6]:PORT") names, as "ADDR:PORT"
// ("[V6]:PORT" for IPv6), sorted and without duplicates: getaddrinfo over
// IPv4 and IPv6; an IP literal resolves to itself. Errors: INVALID_ARGUMENT
// when `router` is no HOST:PORT; UNAVAILABLE with gai_strerror's text when
// the host does not resolve.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ResolveRouterAddresses(
    const std::string& router);

// Resolver seam (tests give fixed answers); ResolveRouterAddresses's contract.
using RouterResolver =
    std::function<absl::StatusOr<std::vector<std::string>>(const std::string& router)>;

struct RouterRegistrationOptions {
  // HOST:PORT as the user gave it (--router, or router.listen).
  std::string router;
  // What to register (name, role, address, KV endpoint, fingerprint, layout).
  v1::RegisterWorkerRequest request;
  // Signs every attempt (rpc::SignCall); nullptr or open: unsigned. Must
  // outlive the RouterRegistration.
  const auth::ClusterAuth* auth = nullptr;
  // Default: ResolveRouterAddresses.
  RouterResolver resolve;
  // How often `resolve` runs again (default kRouterResolveInterval).
  absl::Duration resolve_interval = kRouterResolveInterval;
  // Called once, on the loop thread, with the reason of the first refusal
  // that cannot heal by retrying: FAILED_PRECONDITION (another model or KV
  // layout), INVALID_ARGUMENT, UNAUTHENTICATED (another cluster secret, a
  // clock outside cluster.auth_max_skew_ms), or an acceptance by an open
  // router when this worker has a secret. That address's loop ends; the
  // others go on until Stop. Default: nothing.
  std::function<void(const std::string& reason)> on_refusal;
  // Called when the worker becomes registered with at least one router
  // (true) or with none any more (false: every router refused or stopped
  // answering, or the ones it had left the DNS answer). Calls are
  // serialised, on a loop thread, under the registration's lock: the
  // callback must not call back into it. RunWorkerMain turns readiness
  // (grpc.health service "") on and off with it. Default: nothing.
  std::function<void(bool registered)> on_registered_change;
  // Where the log lines above go (any thread). Default: rpc::Log.
  std::function<void(const std::string& line)> log;
};

class RouterRegistration {
 public:
  explicit RouterRegistration(RouterRegistrationOptions options);
  RouterRegistration(const RouterRegistration&) = delete;
  RouterRegistration& operator=(const RouterRegistration&) = delete;
  ~RouterRegistration();  // Stop()

  // Resolves the router's host and starts registering (returns at once).
  // Call once.
  void Start();
  // Ends every loop (an attempt in flight ends within its 1 s deadline)
  // and joins the threads. Idempotent.
  void Stop();

  // The role every later attempt registers (a role change at run time,
  // issue #35); the heartbeat carries it within a second.
  void SetRole(v1::WorkerRole role);
  // The first refusal's reason ("" when none).
  std::string refusal() const;
  // How many routers this worker is registered with now.
  int registered_routers() const;

 private:
  // One resolved address's registration loop.
  struct Peer {
    absl::Notification stop;
    std::thread thread;
  };
  void ResolveLoop();
  void RegisterLoop(const std::string& address, absl::Notification* stop);
  // One loop's registered state changed: keeps registered_ and calls
  // on_registered_change when it crosses zero.
  void SetRegistered(bool now, bool* was);
  // "HOST:PORT" or "HOST:PORT (ADDR)": names `address` in log lines.
  std::string Label(const std::string& address) const;

  const RouterRegistrationOptions options_;
  absl::Notification stop_;
  std::thread resolver_;
  // Only the resolver thread touches peers_ (until Stop joins it).
  std::map<std::string, std::unique_ptr<Peer>> peers_;
  mutable absl::Mutex mu_;
  std::string refusal_ ABSL_GUARDED_BY(mu_);
  int registered_ ABSL_GUARDED_BY(mu_) = 0;  // loops whose last attempt succeeded
  // options_.request.role() until SetRole.
  v1::WorkerRole role_ ABSL_GUARDED_BY(mu_) = options_.request.role();
};

}  // namespace tandem

#endif  // TANDEM_WORKER_ROUTER_REGISTRATION_H_
