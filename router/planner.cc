#include "router/planner.h"

#include <utility>

#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"
#include "common/server/log.h"
#include "router/role_changer.h"
#include "router/router_metrics.h"

namespace tandem::router {

PlannerOptions PlannerOptionsFromConfig(const ClusterConfig& config) {
  PlannerOptions o;
  o.config = config.planner;
  o.slo = config.slo;
  o.max_num_batched_tokens = config.engine.max_num_batched_tokens;
  o.max_num_seqs = config.engine.max_num_seqs;
  return o;
}

Planner::Planner(PlannerOptions options, WorkerRegistry* registry, RoleChanger* changer,
                 RouterMetrics* metrics)
    : Planner(
          options,
          [registry, metrics,
           window = std::max(kPlannerMinWindow, absl::Seconds(4 * options.config.interval_s))](
              absl::Time now) {
            PlannerInputs in;
            in.workers = registry->Workers();
            in.load = metrics->recent().Window(now, window);
            return in;
          },
          [changer](const std::string& name, v1::WorkerRole role) {
            return changer->Change(name, role, "planner").status();
          },
          metrics->registry()) {}

Planner::Planner(PlannerOptions options, Observe observe, Flip flip,
                 std::shared_ptr<prometheus::Registry> metrics_registry)
    : options_(std::move(options)),
      observe_(std::move(observe)),
      flip_(std::move(flip)),
      metrics_registry_(std::move(metrics_registry)) {
  auto& desired = prometheus::BuildGauge()
                      .Name("tandem_planner_desired_workers")
                      .Help(
                          "The role planner's wanted number of workers per role (planner.mode; "
                          "0 with mode off)")
                      .Register(*metrics_registry_);
  desired_prefill_ = &desired.Add({{"role", "prefill"}});
  desired_decode_ = &desired.Add({{"role", "decode"}});
  auto& changes = prometheus::BuildCounter()
                      .Name("tandem_planner_role_changes_total")
                      .Help("Workers the role planner moved to a role, by the role")
                      .Register(*metrics_registry_);
  to_prefill_ = &changes.Add({{"to", "prefill"}});
  to_decode_ = &changes.Add({{"to", "decode"}});
}

Planner::~Planner() { Stop(); }

void Planner::Log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    rpc::Log(line);
  }
}

void Planner::Start() {
  if (options_.config.mode == PlannerMode::kOff || thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    started_ = absl::Now();
    started_set_ = true;
  }
  Log(absl::StrCat("planner: mode ", PlannerModeName(options_.config.mode), ", every ",
                   options_.config.interval_s, " s, cooldown ", options_.config.cooldown_s,
                   " s, min ", options_.config.min_prefill_workers, " prefill / ",
                   options_.config.min_decode_workers, " decode",
                   options_.config.flip_roles ? "" : ", flip_roles false (export only)"));
  thread_ = std::thread([this] { Loop(); });
}

void Planner::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void Planner::Loop() {
  const absl::Duration interval = absl::Seconds(options_.config.interval_s);
  while (!stop_.WaitForNotificationWithTimeout(interval)) Tick(absl::Now());
}

void Planner::NoteManualChange(absl::Time now) {
  absl::MutexLock lock(&mu_);
  last_change_ = now;
}

void Planner::Tick(absl::Time now) {
  if (options_.config.mode == PlannerMode::kOff) return;
  const PlannerInputs inputs = observe_(now);
  PlannerDecision d = options_.config.mode == PlannerMode::kLoad ? DecideByLoad(options_, inputs)
                                                                 : DecideBySlo(options_, inputs);
  desired_prefill_->Set(d.desired_prefill);
  desired_decode_->Set(d.desired_decode);
  const absl::Duration cooldown = absl::Seconds(options_.config.cooldown_s);
  bool flip = false;
  std::string held;
  {
    absl::MutexLock lock(&mu_);
    if (!started_set_) {
      started_ = now;
      started_set_ = true;
    }
    if (!d.flip_worker.empty()) {
      if (!options_.config.flip_roles) {
        held = "flip_roles false";
      } else if (now - started_ < cooldown) {
        held = "in the first cooldown after start";
      } else if (now - last_change_ < cooldown) {
        held = "within the cooldown of the last role change";
      } else {
        flip = true;
      }
    }
    // Logged when the wanted split or the action changes (not every tick).
    const std::string action = d.flip_worker.empty() ? ""
                               : flip                ? absl::StrCat("; flipping ", d.flip_worker)
                                                     : absl::StrCat("; no flip (", held, ")");
    const std::string key = absl::StrCat(d.desired_prefill, "+", d.desired_decode, action);
    if (key != last_logged_) {
      last_logged_ = key;
      Log(absl::StrCat("planner: ", d.reason, action));
    }
    last_ = d;
    if (!held.empty()) last_.reason += absl::StrCat("; no flip (", held, ")");
  }
  if (!flip) return;
  const absl::Status flipped = flip_(d.flip_worker, d.flip_to);
  absl::MutexLock lock(&mu_);
  if (!flipped.ok()) {
    Log(absl::StrCat("planner: flipping ", d.flip_worker, " failed: ", flipped.message()));
    return;
  }
  last_change_ = now;
  ++flips_;
  (d.flip_to == v1::ROLE_PREFILL ? to_prefill_ : to_decode_)->Increment();
}

uint64_t Planner::flips() const {
  absl::MutexLock lock(&mu_);
  return flips_;
}

v1::PlannerStatus Planner::Status() const {
  v1::PlannerStatus s;
  s.set_mode(PlannerModeName(options_.config.mode));
  s.set_flip_roles(options_.config.flip_roles);
  s.set_interval_s(options_.config.interval_s);
  s.set_cooldown_s(options_.config.cooldown_s);
  absl::MutexLock lock(&mu_);
  s.set_desired_prefill_workers(static_cast<uint32_t>(last_.desired_prefill));
  s.set_desired_decode_workers(static_cast<uint32_t>(last_.desired_decode));
  s.set_role_changes_total(flips_);
  s.set_last_decision(last_.reason);
  s.set_seconds_since_last_flip(last_change_ == absl::InfinitePast()
                                    ? -1
                                    : absl::ToDoubleSeconds(absl::Now() - last_change_));
  return s;
}

}  // namespace tandem::router
