// How the router chooses a worker for a request: router.policy
// (kv_aware | least_loaded | round_robin) over the routable workers of one
// role, as the registry last saw them (docs/architecture.md, "Choosing
// workers: the routing score").
//
// Owns: the scores and the choice. Does not touch: the registry's state or
// any RPC (the registry gathers the candidates and keeps the round-robin
// cursor). Threads: pure functions.
//
// kv_aware, higher is better (each term normalised to about [0, 1] so the
// weights router.kv_aware.* compare like with like):
//   decode  = prefix_weight      x cached_prefix_tokens / prompt_tokens
//           + free_blocks_weight x free_blocks / total_blocks
//           - load_weight        x load / max_num_seqs
// where load = max(0, running + waiting - in_flight_at_poll) + in_flight:
// the polled load less this router's requests it included, plus this
// router's requests now (fresh between polls, never counted twice).
//   prefill = prefix_weight        x cached_prefix_tokens / prompt_tokens
//           - prefill_queue_weight x queued_prefill_tokens / max_num_batched_tokens
//           - load_weight          x in_flight / max_num_seqs
// With RoutingOptions::prefill_by_finish_time (conditional.placement slo)
// a prefill pick under any policy scores -PredictedFinishSeconds: the
// prefill worker that would finish this prompt first.
// least_loaded: score = -load.
// round_robin: every candidate scores 0.
// Candidates whose scores are equal (within kScoreEpsilon) are taken in
// turn: the cursor advances on every choice.
#ifndef TANDEM_ROUTER_ROUTING_POLICY_H_
#define TANDEM_ROUTER_ROUTING_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/cluster_config.h"

namespace tandem::router {

// What a policy sees of one routable worker.
struct Candidate {
  std::string name;
  // Prompt tokens of this request whose KV the worker holds (the router's
  // prefix index, WorkerRegistry::CachedPrefixTokens); <= prompt_tokens.
  int64_t cached_prefix_tokens = 0;
  // Last polled WorkerStatus. kv_blocks_total 0: not polled yet (free
  // blocks count as a fraction of 1: a new worker is taken to be empty).
  uint32_t kv_blocks_total = 0;
  uint32_t kv_blocks_in_use = 0;
  uint32_t running = 0;  // scheduled: running_requests - waiting_requests
  uint32_t waiting = 0;  // waiting_requests
  uint64_t queued_prefill_tokens = 0;
  // The worker's prefill rate, tokens/s (WorkerRegistry: its step model's,
  // WorkerStatus.step_model, else measured from polls while it had prefill
  // queued); 0: not known yet.
  double prefill_tokens_per_s = 0;
  // Requests this router sent it that have not finished (fresh, not polled).
  int64_t in_flight = 0;
  // in_flight when the last poll's reply arrived: the part of running +
  // waiting that is this router's own requests.
  int64_t in_flight_at_poll = 0;
  // Prompt tokens of this router's prefill calls to the worker not yet
  // finished, now and when the last poll's reply arrived (fresh between
  // polls, as in_flight).
  int64_t prefill_tokens_in_flight = 0;
  int64_t prefill_tokens_in_flight_at_poll = 0;
};

// The candidate's load in sequences: max(0, running + waiting -
// in_flight_at_poll) + in_flight.
int64_t CandidateLoad(const Candidate& candidate);

// Seconds until a prefill worker would start a request sent now:
// queued_prefill_tokens / prefill_tokens_per_s (0 while the rate is not
// measured: a new or never busy worker is taken to start at once).
double PredictedQueueWaitSeconds(const Candidate& candidate);

// A prefill worker's queued prefill tokens now: max(0,
// queued_prefill_tokens - prefill_tokens_in_flight_at_poll) +
// prefill_tokens_in_flight (the polled queue less this router's calls it
// included, plus this router's calls now: a burst sent between two polls
// counts at once).
int64_t QueuedPrefillTokensNow(const Candidate& candidate);

// Seconds until a prefill worker would finish a prompt of `prompt_tokens`
// sent now: (QueuedPrefillTokensNow + prompt_tokens - cached_prefix_tokens)
// / prefill_tokens_per_s (0 while the rate is not known).
double PredictedFinishSeconds(const Candidate& candidate, int64_t prompt_tokens);

// The policy and the normalisers of its terms.
struct RoutingOptions {
  RouterPolicy policy = RouterPolicy::kKvAware;
  KvAwareWeights weights;
  int32_t max_num_seqs = 64;              // engine.max_num_seqs, >= 1
  int32_t max_num_batched_tokens = 2048;  // engine.max_num_batched_tokens, >= 1
  // Prefill picks by least PredictedFinishSeconds (conditional.placement slo).
  bool prefill_by_finish_time = false;
};

// Scores closer than this are equal (taken in turn).
inline constexpr double kScoreEpsilon = 1e-9;

// A candidate's score under options.policy for a decode (decode = true) or
// a prefill pick of a prompt of `prompt_tokens` tokens (0: the prefix term
// is 0), with a one-line explanation of its inputs, e.g. "kv_aware score
// 0.93: 192/200 prompt tokens cached, 1990/2048 blocks free, 0 running,
// 0 waiting, 0 in flight".
struct Scored {
  double score = 0;
  std::string explanation;
};
Scored ScoreCandidate(const Candidate& candidate, bool decode, int64_t prompt_tokens,
                      const RoutingOptions& options);

struct Choice {
  size_t index = 0;  // into the candidates
  Scored scored;
};

// The candidate with the highest score; among equal best ones the
// (*cursor % count)-th in the given order, and *cursor is incremented.
// nullopt (cursor unchanged) for no candidate.
std::optional<Choice> ChooseCandidate(const std::vector<Candidate>& candidates, bool decode,
                                      int64_t prompt_tokens, const RoutingOptions& options,
                                      uint64_t* cursor);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROUTING_POLICY_H_
