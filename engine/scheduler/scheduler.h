// Token-budget scheduler with chunked prefill, preemption by recompute and
// remote prefill as a waiting state (vLLM v1's Scheduler with its
// WAITING_FOR_REMOTE_KVS state; Sarathi-Serve's chunked prefill, Agrawal et
// al. 2024; DESIGN.md, Engine: Scheduler).
//
// Owns: every sequence's lifecycle state (SeqStatus), the waiting queue and
// running list, which sequences run in the next step and with how many new
// tokens, which are preempted, and where a new prompt is prefilled
// (prefill_placement.h). Does not touch: KV memory or block ids (asks
// KvCacheManager for slots), model execution, sampling, KV transfer,
// request I/O.
// Threads: not thread-safe; the engine-loop thread calls it.
//
// One step: Schedule() -> the engine runs the forward over the returned
// chunks and starts the returned remote KV loads -> OnStepDone() with what
// each chunk produced. Policy per step, with a budget of
// max_num_batched_tokens:
//   1. running decode sequences first, one token each (oldest first);
//   2. then running sequences still prefilling, a chunk of at most
//      prefill_chunk_tokens each;
//   3. then waiting sequences in arrival order (FCFS; the queue head blocks
//      those behind it). Admission looks the prompt up in the prefix cache
//      once, then places it (PrefillRemotely):
//      - local: its first chunk joins this step (needs a running slot and
//        budget). Non-preemptible sequences reserve blocks for every known
//        token at admission, so one admitted can always finish.
//      - remote (only with remote_prefill_available, and only for a prompt
//        that has never run here): blocks for L + 1 tokens are reserved
//        (token 0's K/V is computed here by the first decode step), with
//        every cached full block of L as the hit, and the sequence becomes
//        kWaitingForRemoteKv; no budget, but one of max_num_seqs slots
//        (it joins the running set when its KV arrives). The engine starts
//        the transfer; FinishRemoteKv() later makes it a running, decoding
//        sequence with its first token appended.
//      A sample forked from a running sequence (Fork, n > 1) waits at the
//      head of the queue holding its shared prompt blocks, and is admitted
//      like a local prefill of the rest.
// When KV blocks run out for a running sequence, the newest preemptible
// running sequence is preempted (its blocks freed, num_computed reset to 0,
// back to the head of the waiting queue to recompute prompt + generated
// tokens locally), repeatedly, until the allocation fits or the sequence
// itself is the newest. No admissions in a step that preempted.
#ifndef TANDEM_ENGINE_SCHEDULER_SCHEDULER_H_
#define TANDEM_ENGINE_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/kv/kv_cache_manager.h"
#include "engine/scheduler/prefill_placement.h"
#include "engine/scheduler/slo_placement.h"
#include "engine/scheduler/step_model.h"

namespace tandem::scheduler {

struct SchedulerOptions {
  int32_t max_num_batched_tokens = 2048;  // token budget per step
  // Running sequences at most, those waiting for remote KV included (they
  // join the running set when it arrives).
  int32_t max_num_seqs = 64;
  int32_t prefill_chunk_tokens = 512;  // prefill tokens per sequence per step
  bool enable_prefix_caching = true;   // false: admission never looks up
  // Whether prompts may be prefilled elsewhere (the engine has a remote KV
  // loader). false: every prompt is prefilled locally.
  bool remote_prefill_available = false;
  // kAuto prompts with more than this many tokens to compute after the
  // local prefix hit are prefilled remotely (conditional disaggregation).
  int32_t max_local_prefill_tokens = 32;
  // How kAuto prompts above max_local_prefill_tokens are placed
  // (prefill_placement.h): kThreshold sends them all remote; kSlo picks
  // the placement with the lower predicted SLO miss.
  PlacementPolicy placement = PlacementPolicy::kThreshold;
  // Latency objectives, ms; 0 = not set. slo_tpot_ms > 0 also bounds each
  // step's prefill chunk while decodes run (TpotChunkTokens).
  double slo_ttft_ms = 0;
  double slo_tpot_ms = 0;
  // K+V bytes of one token over all layers (the transfer a remote prefill
  // costs per prompt token); 0: transfers are not predicted.
  int64_t kv_bytes_per_token = 0;
};

// A sequence's lifecycle; transitions happen only in this class.
//   kWaiting --admit local--> kRunning --preempt--> kWaiting
//   kWaiting --admit remote--> kWaitingForRemoteKv --FinishRemoteKv--> kRunning
//   kWaitingForRemoteKv --AbortRemoteKv--> kAbortingRemoteKv
//   kWaitingForRemoteKv --RemoteKvToLocal--> kWaiting (prefilled here)
//   any state --Remove--> gone (blocks freed)
enum class SeqStatus {
  kWaiting,             // queued for admission (new, or preempted)
  kWaitingForRemoteKv,  // WAITING_FOR_REMOTE_KV: blocks reserved, KV incoming
  kAbortingRemoteKv,    // cancelled while receiving: blocks kept until the
                        // transfer has quiesced (then Remove)
  kRunning,             // prefilling or decoding
};
const char* SeqStatusName(SeqStatus status);

// The scheduler's view of one sequence. The engine keeps the rest of the
// request (sampling, outputs) keyed by `id`.
struct SeqState {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // prompt + generated so far
  int32_t num_prompt_tokens = 0;
  int32_t num_computed = 0;                 // tokens whose K/V are in the cache
  int32_t num_cached_prompt_tokens = 0;     // prefix-cache hit at first admission
  RouteChoice route = RouteChoice::kLocal;  // where the prompt is prefilled
  bool preemptible = true;
  SeqStatus status = SeqStatus::kWaiting;
  uint64_t arrival = 0;  // FCFS order, set by Add
  int32_t num_preemptions = 0;
  // num_cached_prompt_tokens went into cached_prompt_tokens_total() (at
  // the first admission; a fallback to a local prefill does not recount).
  bool cached_counted = false;
  // kAuto under placement kSlo: the router's estimate of a remote prefill
  // (without one, the threshold rule places the prompt).
  std::optional<RemotePrefillEstimate> remote_estimate;
  // Set by Add when placement kSlo decided the route (then kLocal or
  // kRemote): the decision and its predictions.
  std::optional<PlacementPrediction> placement;
};

// One entry of a step: compute tokens [start, start + count) of `id`.
struct ScheduledChunk {
  int64_t id;
  int32_t start;
  int32_t count;
  bool samples;  // start + count == tokens.size(): the step yields a token
};

// A sequence admitted for remote prefill this step: its blocks cover L + 1
// tokens, the first hit_tokens of them already hold cached K/V.
struct RemoteKvStart {
  int64_t id;
  int32_t hit_tokens;
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;           // decodes first, then prefill chunks
  std::vector<RemoteKvStart> remote_kv_starts;  // now kWaitingForRemoteKv
  std::vector<int64_t> preempted;               // moved back to waiting this step
  int32_t num_batched_tokens = 0;
  // Whether anything changed: a step that does nothing will do nothing
  // again until a sequence is added, removed or finishes its remote load.
  bool progress() const {
    return !chunks.empty() || !remote_kv_starts.empty() || !preempted.empty();
  }
};

class Scheduler {
 public:
  // `kv` and `step_model` (may be null: no SLO placement, no TPOT bound)
  // must outlive the scheduler; the owner updates the model between steps.
  Scheduler(const SchedulerOptions& options, kv::KvCacheManager* kv,
            const StepModel* step_model = nullptr);

  // Queues a sequence (FCFS) in kWaiting. Its id must be new. Under
  // placement kSlo a kAuto prompt with remote_estimate, remote prefill
  // available, a step model with samples and more than
  // max_local_prefill_tokens to compute after its local prefix hit is
  // placed now, by PlaceBySlo over this worker's queue and decodes: its
  // route becomes kLocal or kRemote and `placement` holds why.
  void Add(SeqState seq);
  // Removes a sequence in any state and frees its blocks. No-op if unknown.
  void Remove(int64_t id);

  // Plans the next step and reserves the KV slots it needs. Running
  // sequences in `held` get no chunk this step (the engine's KV export of
  // that sequence has no room: it waits, the others run).
  StepPlan Schedule(const std::set<int64_t>& held = {});
  // After the forward: chunks' tokens are computed. For each chunk with
  // `samples`, `sampled` holds the new token (same order as the plan's
  // sampling chunks); it is appended to the sequence. Publishes completed
  // blocks to the prefix cache.
  void OnStepDone(const StepPlan& plan, const std::vector<int32_t>& sampled);

  // kWaitingForRemoteKv -> kRunning: every prompt token's K/V is in the
  // sequence's blocks. Publishes the prompt's full blocks and appends
  // `first_token` (sampled by the prefill worker); the next step decodes.
  // Other states: a caller bug (aborts).
  void FinishRemoteKv(int64_t id, int32_t first_token);
  // Starts sequence `child_id` as another sample of `parent_id`'s prompt
  // (parallel sampling, n > 1): its tokens are the parent's prompt then
  // `first_token`; it shares the parent's full prompt blocks (one more
  // reference each, no copy, whether or not prefix caching is on) and
  // recomputes the rest of the prompt (the partial last block, at most
  // block_size - 1 tokens) plus first_token's K/V when admitted. It
  // queues at the head of the waiting queue (after children forked before
  // it) with the parent's arrival, so it is admitted before anything that
  // arrived later. The parent must have computed its whole prompt
  // (kRunning after its first sample, or right after FinishRemoteKv);
  // otherwise, or for a live child_id, aborts (caller bug).
  void Fork(int64_t parent_id, int64_t child_id, int32_t first_token);
  // kWaitingForRemoteKv -> kWaiting, at the head of the queue, route
  // kLocal (a failed remote prefill falls back to a local one: the engine
  // calls it once the load has quiesced). Frees its blocks: the partial
  // bytes of the failed transfer were never published, cached prefix
  // blocks stay cached; admission looks the prefix up again. Other states:
  // a caller bug (aborts).
  void RemoteKvToLocal(int64_t id);
  // kWaitingForRemoteKv -> kAbortingRemoteKv (the engine has cancelled the
  // transfer and calls Remove once it quiesced). Other states: no-op.
  void AbortRemoteKv(int64_t id);

  const SeqState* Find(int64_t id) const;
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  // Sequences in kWaitingForRemoteKv or kAbortingRemoteKv.
  size_t num_waiting_for_remote_kv() const;
  // Whether Schedule() may have something to do: sequences waiting or
  // running (those waiting for remote KV wait for FinishRemoteKv).
  bool HasWork() const;
  // Sum of num_cached_prompt_tokens over sequences at their first admission
  // (forked samples share their parent's and add nothing): prompt tokens
  // whose KV came from the prefix cache.
  uint64_t cached_prompt_tokens_total() const { return cached_prompt_tokens_total_; }

 private:
  bool AllocateOrPreempt(SeqState& seq, int32_t num_tokens, StepPlan* plan);
  // Add's SLO placement of `seq` (see Add).
  void PlaceBySloAtArrival(SeqState& seq);
  // The prefill chunk at token `start` this step: at most `count` tokens,
  // bounded by slo_tpot_ms while the plan has decodes (TpotChunkTokens);
  // 0: none.
  int32_t BoundChunk(int32_t start, int32_t count, const StepPlan& plan) const;
  // Tokens of the local prefix hit of `seq` (every full block before its
  // last token that the prefix cache holds).
  int32_t LocalHitTokens(const SeqState& seq) const;
  void Preempt(int64_t id, StepPlan* plan);
  // Admits the waiting head if it can be; false when it must wait (the
  // queue stops there).
  bool AdmitHead(StepPlan* plan);
  // AdmitHead for a forked sample, which holds its shared blocks already.
  bool AdmitForked(SeqState& seq, StepPlan* plan);
  // Adds seq.num_cached_prompt_tokens to cached_prompt_tokens_total_ once.
  void CountCached(SeqState& seq);
  // Whether running plus remote-KV-waiting sequences leave one of the
  // max_num_seqs slots free.
  bool HasSeqSlot() const;
  void InsertRunning(int64_t id);

  const SchedulerOptions options_;
  kv::KvCacheManager* const kv_;
  const StepModel* const step_model_;
  uint64_t next_arrival_ = 0;
  uint64_t cached_prompt_tokens_total_ = 0;
  std::map<int64_t, SeqState> seqs_;
  // FCFS; preempted and forked sequences go to the front. A waiting
  // sequence with num_computed > 0 is a forked child holding shared blocks.
  std::deque<int64_t> waiting_;
  std::vector<int64_t> running_;  // arrival order, oldest first
};

}  // namespace tandem::scheduler

#endif  // TANDEM_ENGINE_SCHEDULER_SCHEDULER_H_
