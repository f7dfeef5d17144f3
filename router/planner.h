// The role planner (issue #35; config `planner`, common/planner_config.h):
// every interval_s it reads the workers (WorkerRegistry::Workers: role,
// queued prefill tokens, KV use, batch, step model) and the router's recent
// requests (RecentRequests: rate, lengths, TTFT/TPOT p90), decides the
// prefill/decode split it wants, exports it, and, with flip_roles, moves
// one worker toward it through the RoleChanger.
//
// Modes (docs/architecture.md "Roles that follow the load"):
// - load (Dynamo's load mode): P's backlog q = queued prefill tokens per
//   prefill worker in steps of engine.max_num_batched_tokens (the decode
//   workers' own queue when there is no prefill worker) and D's pressure
//   u = the largest of KV blocks in use / total and running / max_num_seqs
//   over decode workers. Each role wants one worker more above its high
//   threshold and one fewer below its low one (down to its minimum): the
//   exported split, which an autoscaler follows. In a fixed pool the
//   planner flips: q > kLoadPrefillHigh with u <= kLoadDecodeHigh, a
//   decode worker becomes a prefill worker; u > kLoadDecodeHigh with
//   q < kLoadPrefillLow, the reverse. The gaps between the high and low
//   thresholds are the hysteresis.
// - slo: for every split of the routable workers (within the minimums) the
//   workers' step models (mean coefficients) predict TTFT and TPOT at the
//   window's arrival rate λ, uncached prompt length L and output length O:
//     prefill of one prompt  t_p = base + a*L + b*L^2/2     (step model)
//     split with P > 0: TTFT = t_p / (1 - λ t_p / P)        (M/M/1 wait)
//       TPOT = base / (1 - (d + c*ctx) λ O / D)   with ctx = L + O/2
//       (Little: D's batch = λ O TPOT / D; its step = base + batch (d + c ctx))
//     split with P = 0: the decode workers also prefill: TTFT as above
//       with D servers, TPOT divided by (1 - λ t_p / D)
//   scaled by the measured p90 / predicted of the current split (clamped to
//   [0.5, 4]). Predicted goodput = λ x min(1, ttft_slo / TTFT) x min(1,
//   tpot_slo / TPOT) (DistServe's goodput with a smooth miss). The best
//   split is wanted; a flip needs it to beat the current one by
//   kSloMargin (hysteresis). When even the wanted split is predicted to
//   serve under 90% of the requests within the SLOs, the exported split
//   asks for one worker more, of the role whose addition predicts the
//   higher goodput (an autoscaler's signal; the pool itself cannot grow).
// No flapping in either mode: at most one flip per cooldown_s, none in
// the first cooldown_s after start nor within cooldown_s of any role
// change (a manual `tandem role` included); min_prefill_workers /
// min_decode_workers bind the planner only.
//
// Exports (the router's /metrics): tandem_planner_desired_workers{role}
// (gauge: the wanted split) and tandem_planner_role_changes_total{to}
// (counter: the planner's flips). Each decision that changes the wanted
// split or flips is logged with its inputs; the last one is in
// ClusterStatus.planner (`tandem status`).
//
// Owns: its thread, the decision state. Does not touch: routing, the
// workers (flips go through the RoleChanger). Threads: one loop thread;
// Status/NoteManualChange from gRPC threads (mu_).
#ifndef TANDEM_ROUTER_PLANNER_H_
#define TANDEM_ROUTER_PLANNER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/cluster_config.h"
#include "router/recent_requests.h"
#include "router/worker_registry.h"
#include "tandem/v1/common.pb.h"

namespace tandem::router {

class RoleChanger;
class RouterMetrics;

// Thresholds of the load mode (see above), in max_num_batched_tokens steps
// per prefill worker and in fractions of a decode worker's capacity.
inline constexpr double kLoadPrefillHigh = 4.0;
inline constexpr double kLoadPrefillLow = 1.0;
inline constexpr double kLoadDecodeHigh = 0.8;
inline constexpr double kLoadDecodeLow = 0.5;
// The slo mode's hysteresis: the best split's predicted goodput must beat
// the current one's by this fraction (and 0.01 req/s).
inline constexpr double kSloMargin = 0.10;
// The window of recent requests the slo mode reads: max(this, 4 x interval).
inline constexpr absl::Duration kPlannerMinWindow = absl::Seconds(10);

struct PlannerOptions {
  PlannerConfig config;
  SloConfig slo;
  int32_t max_num_batched_tokens = 2048;  // engine.*
  int32_t max_num_seqs = 64;
  std::function<void(const std::string&)> log;  // rpc::Log when empty
};
PlannerOptions PlannerOptionsFromConfig(const ClusterConfig& config);

// What one decision sees.
struct PlannerInputs {
  std::vector<WorkerRegistry::WorkerView> workers;
  RecentLoad load;
};

// What one decision wants.
struct PlannerDecision {
  int prefill_workers = 0;  // routable now
  int decode_workers = 0;
  int desired_prefill = 0;  // the wanted split
  int desired_decode = 0;
  std::string flip_worker;  // empty: no flip wanted
  v1::WorkerRole flip_to = v1::ROLE_UNSPECIFIED;
  std::string reason;  // the inputs and the rule, one line
};

// The pure decisions (unit-tested): the split `inputs` call for under the
// load and slo modes, and the worker to flip toward it (none when the
// split is already the wanted one). Workers that are not routable are
// neither counted nor flipped.
PlannerDecision DecideByLoad(const PlannerOptions& options, const PlannerInputs& inputs);
PlannerDecision DecideBySlo(const PlannerOptions& options, const PlannerInputs& inputs);

class Planner {
 public:
  // Observes the inputs now; the loop's source (tests give their own).
  using Observe = std::function<PlannerInputs(absl::Time now)>;
  // Flips a worker (RoleChanger::Change); its error is logged.
  using Flip = std::function<absl::Status(const std::string& name, v1::WorkerRole role)>;

  // With the router's registry, role changer and metrics (metrics: where
  // the planner's series are registered and the recent requests read).
  Planner(PlannerOptions options, WorkerRegistry* registry, RoleChanger* changer,
          RouterMetrics* metrics);
  // The seams alone (tests): `registry` null, flips and inputs from these.
  Planner(PlannerOptions options, Observe observe, Flip flip,
          std::shared_ptr<prometheus::Registry> metrics_registry);
  ~Planner();  // Stop()
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  // Starts the loop (mode off: nothing runs). Stop ends and joins it.
  void Start();
  void Stop();
  // One decision at `now` (the loop calls it every interval_s; tests call
  // it with their own clock). `start` of the cooldown is the first Tick's
  // `now` unless Start ran.
  void Tick(absl::Time now);
  // A manual role change happened at `now`: no planner flip for cooldown_s.
  void NoteManualChange(absl::Time now = absl::Now());
  v1::PlannerStatus Status() const;
  // The planner's flips so far.
  uint64_t flips() const;

 private:
  void Loop();
  void Log(const std::string& line) const;

  const PlannerOptions options_;
  Observe observe_;
  Flip flip_;
  // Owns the series below (kept alive with them).
  std::shared_ptr<prometheus::Registry> metrics_registry_;
  prometheus::Gauge* desired_prefill_ = nullptr;
  prometheus::Gauge* desired_decode_ = nullptr;
  prometheus::Counter* to_prefill_ = nullptr;
  prometheus::Counter* to_decode_ = nullptr;
  mutable absl::Mutex mu_;
  absl::Time started_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool started_set_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_change_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  PlannerDecision last_ ABSL_GUARDED_BY(mu_);
  std::string last_logged_ ABSL_GUARDED_BY(mu_);
  uint64_t flips_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_PLANNER_H_
