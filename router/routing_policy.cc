#include "router/routing_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::router {
namespace {

double Fraction(double part, double whole) { return whole > 0 ? part / whole : 0.0; }

std::string LoadText(const Candidate& c) {
  return absl::StrCat(c.running, " running, ", c.waiting, " waiting, ", c.in_flight, " in flight");
}

}  // namespace

int64_t CandidateLoad(const Candidate& c) {
  return std::max<int64_t>(0, int64_t{c.running} + c.waiting - c.in_flight_at_poll) + c.in_flight;
}

double PredictedQueueWaitSeconds(const Candidate& c) {
  if (c.prefill_tokens_per_s <= 0) return 0;
  return static_cast<double>(c.queued_prefill_tokens) / c.prefill_tokens_per_s;
}

int64_t QueuedPrefillTokensNow(const Candidate& c) {
  return std::max<int64_t>(0, static_cast<int64_t>(c.queued_prefill_tokens) -
                                  c.prefill_tokens_in_flight_at_poll) +
         c.prefill_tokens_in_flight;
}

double PredictedFinishSeconds(const Candidate& c, int64_t prompt_tokens) {
  if (c.prefill_tokens_per_s <= 0) return 0;
  const int64_t cached = std::clamp<int64_t>(c.cached_prefix_tokens, 0, prompt_tokens);
  return static_cast<double>(QueuedPrefillTokensNow(c) + prompt_tokens - cached) /
         c.prefill_tokens_per_s;
}

Scored ScoreCandidate(const Candidate& c, bool decode, int64_t prompt_tokens,
                      const RoutingOptions& options) {
  Scored out;
  if (!decode && options.prefill_by_finish_time) {
    const double finish_s = PredictedFinishSeconds(c, prompt_tokens);
    out.score = -finish_s;
    out.explanation = absl::StrFormat(
        "predicted finish %.1f ms: %d queued prefill tokens + %d of %d prompt tokens uncached at "
        "%.0f tokens/s",
        finish_s * 1000, QueuedPrefillTokensNow(c),
        prompt_tokens - std::clamp<int64_t>(c.cached_prefix_tokens, 0, prompt_tokens),
        prompt_tokens, c.prefill_tokens_per_s);
    return out;
  }
  switch (options.policy) {
    case RouterPolicy::kRoundRobin:
      out.explanation = "round_robin";
      return out;
    case RouterPolicy::kLeastLoaded:
      out.score = -static_cast<double>(CandidateLoad(c));
      out.explanation = absl::StrCat("least_loaded: ", LoadText(c));
      return out;
    case RouterPolicy::kKvAware:
      break;
  }
  const KvAwareWeights& w = options.weights;
  const int64_t cached = std::clamp<int64_t>(c.cached_prefix_tokens, 0, prompt_tokens);
  const std::string cached_text = absl::StrCat(cached, "/", prompt_tokens, " prompt tokens cached");
  out.score =
      w.prefix_weight * Fraction(static_cast<double>(cached), static_cast<double>(prompt_tokens));
  if (decode) {
    const uint32_t in_use = std::min(c.kv_blocks_in_use, c.kv_blocks_total);
    const uint32_t free_blocks = c.kv_blocks_total - in_use;
    const double free_fraction =
        c.kv_blocks_total == 0 ? 1.0 : Fraction(free_blocks, c.kv_blocks_total);
    const double load = static_cast<double>(CandidateLoad(c));
    out.score += w.free_blocks_weight * free_fraction -
                 w.load_weight * Fraction(load, std::max(options.max_num_seqs, 1));
    const std::string blocks_text =
        c.kv_blocks_total == 0 ? std::string("blocks not polled yet")
                               : absl::StrCat(free_blocks, "/", c.kv_blocks_total, " blocks free");
    out.explanation = absl::StrFormat("kv_aware score %.2f: %s, %s, %s", out.score, cached_text,
                                      blocks_text, LoadText(c));
  } else {
    out.score -= w.prefill_queue_weight * Fraction(static_cast<double>(c.queued_prefill_tokens),
                                                   std::max(options.max_num_batched_tokens, 1)) +
                 w.load_weight *
                     Fraction(static_cast<double>(c.in_flight), std::max(options.max_num_seqs, 1));
    out.explanation =
        absl::StrFormat("kv_aware score %.2f: %s, %d queued prefill tokens, %d in flight",
                        out.score, cached_text, c.queued_prefill_tokens, c.in_flight);
  }
  return out;
}

std::optional<Choice> ChooseCandidate(const std::vector<Candidate>& candidates, bool decode,
                                      int64_t prompt_tokens, const RoutingOptions& options,
                                      uint64_t* cursor) {
  if (candidates.empty()) return std::nullopt;
  std::vector<Scored> scored;
  scored.reserve(candidates.size());
  double best = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    scored.push_back(ScoreCandidate(candidates[i], decode, prompt_tokens, options));
    if (i == 0 || scored[i].score > best) best = scored[i].score;
  }
  std::vector<size_t> tied;
  for (size_t i = 0; i < scored.size(); ++i) {
    if (scored[i].score >= best - kScoreEpsilon) tied.push_back(i);
  }
  const size_t index = tied[*cursor % tied.size()];
  ++*cursor;
  return Choice{index, std::move(scored[index])};
}

}  // namespace tandem::router
