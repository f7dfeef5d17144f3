// The planner's pure decisions (planner.h documents the rules).
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "router/planner.h"

namespace tandem::router {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The routable workers of `role`.
std::vector<const WorkerRegistry::WorkerView*> Routable(const PlannerInputs& inputs,
                                                        v1::WorkerRole role) {
  std::vector<const WorkerRegistry::WorkerView*> out;
  for (const WorkerRegistry::WorkerView& w : inputs.workers) {
    if (w.routable && w.role == role) out.push_back(&w);
  }
  return out;
}

// The decision that keeps the split as it is.
PlannerDecision Keep(int p, int d) {
  PlannerDecision k;
  k.prefill_workers = k.desired_prefill = p;
  k.decode_workers = k.desired_decode = d;
  return k;
}

// The least busy worker of `from` (fewest running requests, then least
// queued prefill), whose move does the least harm.
std::string LeastBusy(const std::vector<const WorkerRegistry::WorkerView*>& from) {
  const WorkerRegistry::WorkerView* best = nullptr;
  for (const WorkerRegistry::WorkerView* w : from) {
    if (best == nullptr ||
        std::pair(w->status.running_requests(), w->status.queued_prefill_tokens()) <
            std::pair(best->status.running_requests(), best->status.queued_prefill_tokens())) {
      best = w;
    }
  }
  return best == nullptr ? std::string() : best->name;
}

// Sets d's flip one step from the current split toward the desired one.
void FlipToward(const std::vector<const WorkerRegistry::WorkerView*>& prefill,
                const std::vector<const WorkerRegistry::WorkerView*>& decode, PlannerDecision* d) {
  if (d->desired_prefill > d->prefill_workers && !decode.empty()) {
    d->flip_worker = LeastBusy(decode);
    d->flip_to = v1::ROLE_PREFILL;
  } else if (d->desired_prefill < d->prefill_workers && !prefill.empty()) {
    d->flip_worker = LeastBusy(prefill);
    d->flip_to = v1::ROLE_DECODE;
  }
}

// The step model's mean coefficients over the workers that have one, in
// seconds (per token, per pair, per sequence, per context token).
struct Coefficients {
  double base = 0, per_token = 0, per_pair = 0, per_seq = 0, per_context = 0;
  bool known = false;
};
Coefficients MeanStepModel(const PlannerInputs& inputs) {
  Coefficients c;
  int n = 0;
  for (const WorkerRegistry::WorkerView& w : inputs.workers) {
    const v1::StepModel& m = w.status.step_model();
    if (!w.routable || m.samples() == 0) continue;
    ++n;
    c.base += m.base_ms() / 1e3;
    c.per_token += m.prefill_ms_per_token() / 1e3;
    c.per_pair += m.prefill_ms_per_kilo_pair() / 1e6;
    c.per_seq += m.decode_ms_per_seq() / 1e3;
    c.per_context += m.decode_ms_per_kilo_context() / 1e6;
  }
  if (n == 0) return c;
  c.base /= n;
  c.per_token /= n;
  c.per_pair /= n;
  c.per_seq /= n;
  c.per_context /= n;
  c.known = true;
  return c;
}

struct Prediction {
  double ttft_s = kInf;
  double tpot_s = kInf;
};

// TTFT and TPOT of a split of p prefill and d decode workers (planner.h).
Prediction Predict(const Coefficients& c, const RecentLoad& load, int p, int d) {
  Prediction out;
  if (d <= 0) return out;
  const double lambda = load.request_rate;
  const double l = load.mean_uncached_prompt_tokens;
  const double o = std::max(1.0, load.mean_output_tokens);
  const double t_p = c.base + c.per_token * l + c.per_pair * l * l / 2;
  const int prefill_servers = p > 0 ? p : d;
  const double rho_p = lambda * t_p / prefill_servers;
  if (rho_p < 1) out.ttft_s = t_p / (1 - rho_p);
  const double ctx = l + o / 2;
  const double rho_d = (c.per_seq + c.per_context * ctx) * lambda * o / d;
  if (rho_d < 1) out.tpot_s = c.base / (1 - rho_d);
  if (p == 0) out.tpot_s = rho_p < 1 ? out.tpot_s / (1 - rho_p) : kInf;
  return out;
}

// The predicted goodput of `pred` at rate `lambda` (planner.h).
double Goodput(const SloConfig& slo, const Prediction& pred, double lambda) {
  double f = 1;
  if (slo.ttft_ms.has_value()) f *= std::min(1.0, *slo.ttft_ms / 1e3 / pred.ttft_s);
  if (slo.tpot_ms.has_value()) f *= std::min(1.0, *slo.tpot_ms / 1e3 / pred.tpot_s);
  return lambda * f;
}

// Seconds as whole ms for the log: "inf" when unbounded, "n/a" when unknown (< 0).
std::string Ms(double s) {
  if (s < 0) return "n/a";
  return std::isfinite(s) ? absl::StrFormat("%.0f", s * 1e3) : "inf";
}

}  // namespace

PlannerDecision DecideByLoad(const PlannerOptions& options, const PlannerInputs& inputs) {
  const auto prefill = Routable(inputs, v1::ROLE_PREFILL);
  const auto decode = Routable(inputs, v1::ROLE_DECODE);
  const int p = static_cast<int>(prefill.size()), d = static_cast<int>(decode.size());
  PlannerDecision out = Keep(p, d);
  // q: queued prefill per prefill worker (the decode workers' own when
  // there is none), in engine steps.
  double queued = 0;
  for (const auto* w : p > 0 ? prefill : decode) queued += w->status.queued_prefill_tokens();
  const double q =
      queued / std::max(1, p > 0 ? p : d) / std::max(1, options.max_num_batched_tokens);
  double u = 0;
  for (const auto* w : decode) {
    const v1::WorkerStatus& s = w->status;
    if (s.kv_blocks_total() > 0) {
      u = std::max(u, static_cast<double>(s.kv_blocks_in_use()) / s.kv_blocks_total());
    }
    u = std::max(u, static_cast<double>(s.running_requests()) / std::max(1, options.max_num_seqs));
  }
  const PlannerConfig& cfg = options.config;
  // Each role's own demand (what an autoscaler adds or removes)...
  const bool prefill_high = q > kLoadPrefillHigh, prefill_low = q < kLoadPrefillLow;
  const bool decode_high = u > kLoadDecodeHigh, decode_low = u < kLoadDecodeLow;
  out.desired_prefill = std::max(cfg.min_prefill_workers, prefill_high           ? p + 1
                                                          : prefill_low && p > 0 ? p - 1
                                                                                 : p);
  out.desired_decode = std::max(cfg.min_decode_workers, decode_high           ? d + 1
                                                        : decode_low && d > 1 ? d - 1
                                                                              : d);
  // ...and, in a fixed pool, the one flip toward the pressure.
  std::string rule = "steady";
  auto flip = [&](const std::vector<const WorkerRegistry::WorkerView*>& from, v1::WorkerRole to,
                  std::string why) {
    out.flip_worker = LeastBusy(from);
    out.flip_to = to;
    rule = std::move(why);
  };
  if (p < cfg.min_prefill_workers && d > cfg.min_decode_workers) {
    flip(decode, v1::ROLE_PREFILL, "below min_prefill_workers");
  } else if (d < cfg.min_decode_workers && p > 0) {
    flip(prefill, v1::ROLE_DECODE, "below min_decode_workers");
  } else if (prefill_high && !decode_high && d > cfg.min_decode_workers) {
    flip(decode, v1::ROLE_PREFILL,
         absl::StrFormat("prefill backlog > %.1f steps, decode pressure <= %.2f: flip to prefill",
                         kLoadPrefillHigh, kLoadDecodeHigh));
  } else if (decode_high && prefill_low && p > cfg.min_prefill_workers) {
    flip(prefill, v1::ROLE_DECODE,
         absl::StrFormat("decode pressure > %.2f, prefill backlog < %.1f steps: flip to decode",
                         kLoadDecodeHigh, kLoadPrefillLow));
  }
  out.reason = absl::StrFormat(
      "load: %d prefill + %d decode workers; prefill backlog %.2f steps/worker, decode "
      "pressure %.2f; %s; wants %d prefill + %d decode",
      p, d, q, u, rule, out.desired_prefill, out.desired_decode);
  return out;
}

PlannerDecision DecideBySlo(const PlannerOptions& options, const PlannerInputs& inputs) {
  const auto prefill = Routable(inputs, v1::ROLE_PREFILL);
  const auto decode = Routable(inputs, v1::ROLE_DECODE);
  const int p = static_cast<int>(prefill.size()), d = static_cast<int>(decode.size());
  PlannerDecision out = Keep(p, d);
  const Coefficients c = MeanStepModel(inputs);
  const RecentLoad& load = inputs.load;
  if (!c.known || load.count == 0 || load.request_rate <= 0) {
    out.reason = absl::StrFormat("slo: %d prefill + %d decode workers; %s: keep", p, d,
                                 !c.known ? "no step model yet" : "no recent requests");
    return out;
  }
  // Calibration: the measured p90 over the prediction of the split now.
  const Prediction now = Predict(c, load, p, d);
  auto scale = [](double measured, double predicted) {
    if (measured <= 0 || !std::isfinite(predicted) || predicted <= 0) return 1.0;
    return std::clamp(measured / predicted, 0.5, 4.0);
  };
  const double k_ttft = scale(load.ttft_p90_s, now.ttft_s);
  const double k_tpot = scale(load.tpot_p90_s, now.tpot_s);
  const int n = p + d;
  const PlannerConfig& cfg = options.config;
  double current = -1, best = -1;
  int best_p = p;
  std::string table;
  for (int sp = std::min(cfg.min_prefill_workers, n); sp <= n - cfg.min_decode_workers; ++sp) {
    Prediction pred = Predict(c, load, sp, n - sp);
    pred.ttft_s *= k_ttft;
    pred.tpot_s *= k_tpot;
    const double g = Goodput(options.slo, pred, load.request_rate);
    absl::StrAppend(&table, table.empty() ? "" : ", ",
                    absl::StrFormat("%d+%d: ttft %s ms tpot %s ms goodput %.2f", sp, n - sp,
                                    Ms(pred.ttft_s), Ms(pred.tpot_s), g));
    if (sp == p) current = g;
    if (g > best + 1e-12) {
      best = g;
      best_p = sp;
    }
  }
  // Outside the minimums now, or the best beats the split now by the margin.
  const bool outside = current < 0;
  if (outside || best > current * (1 + kSloMargin) + 0.01) out.desired_prefill = best_p;
  out.desired_decode = n - out.desired_prefill;
  FlipToward(prefill, decode, &out);
  // Beyond the pool (an autoscaler's signal): when even the wanted split
  // is predicted to miss the SLOs for more than a tenth of the requests,
  // one more worker of the role that helps more.
  const int wp = out.desired_prefill, wd = out.desired_decode;
  auto goodput_of = [&](int sp, int sd) {
    Prediction pred = Predict(c, load, sp, sd);
    pred.ttft_s *= k_ttft;
    pred.tpot_s *= k_tpot;
    return Goodput(options.slo, pred, load.request_rate);
  };
  if (goodput_of(wp, wd) < 0.9 * load.request_rate) {
    if (goodput_of(wp + 1, wd) > goodput_of(wp, wd + 1)) {
      ++out.desired_prefill;
    } else {
      ++out.desired_decode;
    }
  }
  out.reason = absl::StrFormat(
      "slo: %d prefill + %d decode workers; %.2f req/s, %.0f uncached prompt / %.0f output "
      "tokens, p90 ttft %s ms tpot %s ms (calibration x%.2f, x%.2f); %s; wants %d prefill + %d "
      "decode",
      p, d, load.request_rate, load.mean_uncached_prompt_tokens, load.mean_output_tokens,
      Ms(load.ttft_p90_s), Ms(load.tpot_p90_s), k_ttft, k_tpot, table, out.desired_prefill,
      out.desired_decode);
  return out;
}

}  // namespace tandem::router
