// Token-budget scheduler with chunked prefill and preemption by recompute
// (vLLM v1's Scheduler; Sarathi-Serve's chunked prefill, Agrawal et al.
// 2024; DESIGN.md, Engine: Scheduler).
//
// Owns: the waiting queue and running list, which sequences run in the next
// step and with how many new tokens, and which are preempted. Does not
// touch: KV memory or block ids (asks KvCacheManager for slots), model
// execution, sampling, request I/O.
// Threads: not thread-safe; the engine-loop thread calls it.
//
// One step: Schedule() -> the engine runs the forward over the returned
// entries -> OnStepDone() with what each entry produced. Policy per step,
// with a budget of max_num_batched_tokens:
//   1. running decode sequences first, one token each (oldest first);
//   2. then running sequences still prefilling, a chunk of at most
//      prefill_chunk_tokens each;
//   3. then waiting sequences in arrival order (FCFS): prefix-cache lookup,
//      then their first chunk; the queue head blocks those behind it.
// When KV blocks run out for a running sequence, the newest running
// sequence is preempted (its blocks freed, its num_computed reset to 0, and
// it goes back to the head of the waiting queue to recompute prompt +
// generated tokens), repeatedly, until the allocation fits or the sequence
// itself is the newest. Sequences marked non-preemptible (e.g. receiving a
// KV transfer) are skipped as victims. No admissions in a step that
// preempted.
#ifndef TANDEM_ENGINE_SCHEDULER_SCHEDULER_H_
#define TANDEM_ENGINE_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "engine/kv/kv_cache_manager.h"

namespace tandem::scheduler {

struct SchedulerOptions {
  int32_t max_num_batched_tokens = 2048;  // token budget per step
  int32_t max_num_seqs = 64;              // running sequences at most
  int32_t prefill_chunk_tokens = 512;     // prefill tokens per sequence per step
  bool enable_prefix_caching = true;
  // Admission reserves blocks for the whole known sequence instead of its
  // first chunk. For the prefill worker, whose sequences are not
  // preemptible (their K/V is already on the wire): a sequence admitted
  // can always finish, so non-preemptible sequences cannot deadlock.
  bool reserve_whole_sequence_at_admission = false;
};

// The scheduler's view of one sequence. The engine keeps the rest of the
// request (sampling, sinks) keyed by `id`.
struct SeqState {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // prompt + generated so far
  int32_t num_prompt_tokens = 0;
  int32_t num_computed = 0;     // tokens whose K/V are in the cache
  int32_t num_cached_prompt_tokens = 0;  // prefix-cache hit at admission
  int32_t max_hit_tokens = 0;   // cap for the prefix lookup (see KvCacheManager)
  bool preemptible = true;
  uint64_t arrival = 0;         // FCFS order, set by Add
  int32_t num_preemptions = 0;
};

// One entry of a step: compute tokens [start, start + count) of `id`.
struct ScheduledChunk {
  int64_t id;
  int32_t start;
  int32_t count;
  bool samples;  // start + count == tokens.size(): the step yields a token
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;  // decodes first, then prefill chunks
  std::vector<int64_t> preempted;      // moved back to waiting this step
  int32_t num_batched_tokens = 0;
};

class Scheduler {
 public:
  // `kv` must outlive the scheduler.
  Scheduler(const SchedulerOptions& options, kv::KvCacheManager* kv);

  // Queues a sequence (FCFS). Its id must be new.
  void Add(SeqState seq);
  // Adds a sequence that is already running (e.g. its KV arrived by
  // transfer): its block table already exists in the KV manager.
  void AddRunning(SeqState seq);
  // Removes a sequence wherever it is and frees its blocks. No-op if unknown.
  void Remove(int64_t id);

  // Plans the next step and reserves the KV slots it needs.
  StepPlan Schedule();
  // After the forward: chunks' tokens are computed. For each chunk with
  // `samples`, `sampled` holds the new token (same order as the plan's
  // sampling chunks); it is appended to the sequence. Publishes completed
  // blocks to the prefix cache.
  void OnStepDone(const StepPlan& plan, const std::vector<int32_t>& sampled);

  const SeqState* Find(int64_t id) const;
  SeqState* FindMutable(int64_t id);
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool HasWork() const;

 private:
  bool AllocateOrPreempt(SeqState& seq, int32_t num_tokens, StepPlan* plan);
  void Preempt(int64_t id, StepPlan* plan);

  const SchedulerOptions options_;
  kv::KvCacheManager* const kv_;
  uint64_t next_arrival_ = 0;
  std::map<int64_t, SeqState> seqs_;
  std::deque<int64_t> waiting_;    // FCFS; preempted go to the front
  std::vector<int64_t> running_;   // arrival order, oldest first
};

}  // namespace tandem::scheduler

#endif  // TANDEM_ENGINE_SCHEDULER_SCHEDULER_H_
