#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <cassert>
#include <cstdlib>

namespace tandem::scheduler {

const char* SeqStatusName(SeqStatus status) {
  switch (status) {
    case SeqStatus::kWaiting:
      return "WAITING";
    case SeqStatus::kWaitingForRemoteKv:
      return "WAITING_FOR_REMOTE_KV";
    case SeqStatus::kAbortingRemoteKv:
      return "ABORTING_REMOTE_KV";
    case SeqStatus::kRunning:
      return "RUNNING";
  }
  return "?";
}

Scheduler::Scheduler(const SchedulerOptions& options, kv::KvCacheManager* kv,
                     const StepModel* step_model)
    : options_(options), kv_(kv), step_model_(step_model) {}

void Scheduler::Add(SeqState seq) {
  const int64_t id = seq.id;
  assert(seqs_.count(id) == 0);
  seq.arrival = next_arrival_++;
  seq.num_computed = 0;
  seq.status = SeqStatus::kWaiting;
  PlaceBySloAtArrival(seq);
  seqs_.emplace(id, std::move(seq));
  waiting_.push_back(id);
}

int32_t Scheduler::LocalHitTokens(const SeqState& seq) const {
  if (!options_.enable_prefix_caching) return 0;
  const int32_t len = static_cast<int32_t>(seq.tokens.size());
  const int32_t bs = kv_->block_size();
  return kv_->FindCachedPrefix(seq.tokens, (len - 1) / bs * bs).num_tokens;
}

void Scheduler::PlaceBySloAtArrival(SeqState& seq) {
  if (options_.placement != PlacementPolicy::kSlo || seq.route != RouteChoice::kAuto ||
      !options_.remote_prefill_available || !seq.remote_estimate.has_value() ||
      step_model_ == nullptr || !step_model_->ready()) {
    return;
  }
  const int32_t len = static_cast<int32_t>(seq.tokens.size());
  const int32_t hit = LocalHitTokens(seq);
  // At or under the threshold a prompt is local in either mode.
  if (!PrefillRemotely(RouteChoice::kAuto, len, hit, options_.max_local_prefill_tokens)) return;
  PlacementInputs in;
  in.slo_ttft_ms = options_.slo_ttft_ms;
  in.slo_tpot_ms = options_.slo_tpot_ms;
  for (int64_t id : running_) {
    const SeqState& r = seqs_.at(id);
    const int32_t left = static_cast<int32_t>(r.tokens.size()) - r.num_computed;
    if (left <= 1) {
      ++in.decode_seqs;
      in.decode_context += static_cast<int64_t>(r.tokens.size());
    } else {
      in.queued_prefill_tokens += left;
    }
  }
  for (int64_t id : waiting_) {
    const SeqState& w = seqs_.at(id);
    if (w.route == RouteChoice::kRemote) continue;  // placed remotely: not D's prefill
    in.queued_prefill_tokens += static_cast<int64_t>(w.tokens.size()) - w.num_computed;
  }
  in.step_prefill_tokens = std::max(
      1, std::min(options_.prefill_chunk_tokens, options_.max_num_batched_tokens - in.decode_seqs));
  in.prompt_tokens = len;
  in.local_hit_tokens = hit;
  in.remote_queue_ms = seq.remote_estimate->queue_ms;
  in.remote_prefill_ms = seq.remote_estimate->prefill_ms;
  const std::optional<double> link =
      step_model_->LinkBytesPerSecond(seq.remote_estimate->prefill_worker);
  if (link.has_value() && *link > 0 && options_.kv_bytes_per_token > 0) {
    in.kv_transfer_ms =
        static_cast<double>(len - hit) * options_.kv_bytes_per_token / *link * 1000.0;
  }
  seq.placement = PlaceBySlo(*step_model_, in);
  seq.route = seq.placement->remote ? RouteChoice::kRemote : RouteChoice::kLocal;
}

int32_t Scheduler::BoundChunk(int32_t start, int32_t count, const StepPlan& plan) const {
  if (!(options_.slo_tpot_ms > 0) || step_model_ == nullptr || count <= 1) return count;
  const StepShape planned = ShapeOf(plan);
  if (planned.decode_seqs == 0) return count;
  return TpotChunkTokens(*step_model_, planned, start, count, options_.slo_tpot_ms);
}

void Scheduler::Remove(int64_t id) {
  if (seqs_.erase(id) == 0) return;
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  kv_->FreeSequence(id);
}

const SeqState* Scheduler::Find(int64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

size_t Scheduler::num_waiting_for_remote_kv() const {
  return seqs_.size() - waiting_.size() - running_.size();
}

bool Scheduler::HasSeqSlot() const {
  return running_.size() + num_waiting_for_remote_kv() < static_cast<size_t>(options_.max_num_seqs);
}

bool Scheduler::HasWork() const { return !waiting_.empty() || !running_.empty(); }

void Scheduler::InsertRunning(int64_t id) {
  // Keep running_ in arrival order (a resumed or remote sequence is older
  // than those that arrived after it).
  const uint64_t arrival = seqs_.at(id).arrival;
  auto pos =
      std::upper_bound(running_.begin(), running_.end(), arrival,
                       [&](uint64_t a, int64_t other) { return a < seqs_.at(other).arrival; });
  running_.insert(pos, id);
  seqs_.at(id).status = SeqStatus::kRunning;
}

void Scheduler::FinishRemoteKv(int64_t id, int32_t first_token) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second.status != SeqStatus::kWaitingForRemoteKv) std::abort();
  SeqState& seq = it->second;
  seq.num_computed = seq.num_prompt_tokens;
  kv_->CommitComputed(id, seq.tokens, seq.num_computed);  // publish the prompt
  seq.tokens.push_back(first_token);
  InsertRunning(id);
}

void Scheduler::Fork(int64_t parent_id, int64_t child_id, int32_t first_token) {
  const SeqState& parent = seqs_.at(parent_id);
  if (seqs_.count(child_id) != 0 || parent.num_computed < parent.num_prompt_tokens) std::abort();
  SeqState child;
  child.id = child_id;
  child.tokens.assign(parent.tokens.begin(), parent.tokens.begin() + parent.num_prompt_tokens);
  child.tokens.push_back(first_token);
  child.num_prompt_tokens = parent.num_prompt_tokens;
  child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens;
  child.cached_counted = true;  // the request's hit counted with its parent
  child.route = RouteChoice::kLocal;
  child.preemptible = true;
  child.status = SeqStatus::kWaiting;
  child.arrival = parent.arrival;
  const int32_t shared_blocks = parent.num_prompt_tokens / kv_->block_size();
  // Nothing to share (a prompt shorter than a block): the child is admitted
  // like any waiting sequence.
  if (shared_blocks > 0) kv_->ForkSequence(parent_id, child_id, shared_blocks);
  child.num_computed = shared_blocks * kv_->block_size();
  seqs_.emplace(child_id, std::move(child));
  // Children of one fork keep their order at the head of the queue
  // (a waiting sequence with computed tokens is a forked child).
  size_t pos = 0;
  while (pos < waiting_.size() && seqs_.at(waiting_[pos]).num_computed > 0 &&
         seqs_.at(waiting_[pos]).arrival <= parent.arrival) {
    ++pos;
  }
  waiting_.insert(waiting_.begin() + static_cast<std::ptrdiff_t>(pos), child_id);
}

void Scheduler::RemoteKvToLocal(int64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second.status != SeqStatus::kWaitingForRemoteKv) std::abort();
  SeqState& seq = it->second;
  kv_->FreeSequence(id);
  seq.num_computed = 0;
  seq.route = RouteChoice::kLocal;
  seq.status = SeqStatus::kWaiting;
  waiting_.push_front(id);
}

void Scheduler::AbortRemoteKv(int64_t id) {
  auto it = seqs_.find(id);
  if (it != seqs_.end() && it->second.status == SeqStatus::kWaitingForRemoteKv) {
    it->second.status = SeqStatus::kAbortingRemoteKv;
  }
}

void Scheduler::Preempt(int64_t id, StepPlan* plan) {
  SeqState& seq = seqs_.at(id);
  kv_->FreeSequence(id);
  seq.num_computed = 0;
  seq.status = SeqStatus::kWaiting;
  ++seq.num_preemptions;
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  waiting_.push_front(id);
  plan->preempted.push_back(id);
  // A victim already planned this step gives its tokens back.
  for (auto it = plan->chunks.begin(); it != plan->chunks.end();) {
    if (it->id == id) {
      plan->num_batched_tokens -= it->count;
      it = plan->chunks.erase(it);
    } else {
      ++it;
    }
  }
}

bool Scheduler::AllocateOrPreempt(SeqState& seq, int32_t num_tokens, StepPlan* plan) {
  while (!kv_->AllocateSlots(seq.id, num_tokens)) {
    // Victim: the newest preemptible running sequence (lowest priority).
    auto victim = std::find_if(running_.rbegin(), running_.rend(), [&](int64_t id) {
      return seqs_.at(id).preemptible || id == seq.id;
    });
    if (victim == running_.rend()) return false;
    const int64_t victim_id = *victim;
    Preempt(victim_id, plan);
    if (victim_id == seq.id) return false;
  }
  return true;
}

bool Scheduler::AdmitForked(SeqState& seq, StepPlan* plan) {
  const int32_t budget = options_.max_num_batched_tokens;
  if (!HasSeqSlot() || plan->num_batched_tokens >= budget) return false;
  const int32_t len = static_cast<int32_t>(seq.tokens.size());
  const int32_t count = BoundChunk(seq.num_computed,
                                   std::min({len - seq.num_computed, options_.prefill_chunk_tokens,
                                             budget - plan->num_batched_tokens}),
                                   *plan);
  if (count <= 0) return false;
  // On failure the child keeps its shared blocks and waits (FCFS).
  if (!kv_->AllocateSlots(seq.id, seq.num_computed + count)) return false;
  waiting_.pop_front();
  InsertRunning(seq.id);
  plan->chunks.push_back(
      ScheduledChunk{seq.id, seq.num_computed, count, seq.num_computed + count == len});
  plan->num_batched_tokens += count;
  return true;
}

void Scheduler::CountCached(SeqState& seq) {
  if (seq.cached_counted) return;
  seq.cached_counted = true;
  cached_prompt_tokens_total_ += static_cast<uint64_t>(seq.num_cached_prompt_tokens);
}

bool Scheduler::AdmitHead(StepPlan* plan) {
  const int64_t id = waiting_.front();
  SeqState& seq = seqs_.at(id);
  // A forked sample (Fork) holds its shared prompt blocks while it waits.
  if (seq.num_computed > 0) return AdmitForked(seq, plan);
  const int32_t budget = options_.max_num_batched_tokens;
  // A sequence waiting for remote KV holds one of the max_num_seqs slots:
  // it joins the running set when its KV arrives.
  if (!HasSeqSlot()) return false;
  const bool has_slot = plan->num_batched_tokens < budget;
  // Only a prompt that never ran here may be prefilled elsewhere: a
  // preempted sequence recomputes its prompt and generated tokens itself.
  const bool may_go_remote = options_.remote_prefill_available &&
                             seq.route != RouteChoice::kLocal && seq.num_preemptions == 0 &&
                             static_cast<int32_t>(seq.tokens.size()) == seq.num_prompt_tokens;
  if (!has_slot && !may_go_remote) return false;

  // One prefix lookup per admission. A remote hit may cover every full block
  // of L (P then sends only [hit, L)); a local prefill keeps the blocks
  // before the last token, which it must compute for its logits.
  const int32_t len = static_cast<int32_t>(seq.tokens.size());
  const int32_t bs = kv_->block_size();
  const int32_t local_cap = (len - 1) / bs * bs;
  kv::PrefixHit hit;
  if (options_.enable_prefix_caching) {
    hit = kv_->FindCachedPrefix(seq.tokens, may_go_remote ? len / bs * bs : local_cap);
  }
  kv::PrefixHit local_hit = hit;
  if (local_hit.num_tokens > local_cap) {
    local_hit.blocks.resize(static_cast<size_t>(local_cap / bs));
    local_hit.num_tokens = local_cap;
  }

  if (may_go_remote &&
      PrefillRemotely(seq.route, len, local_hit.num_tokens, options_.max_local_prefill_tokens)) {
    kv_->StartSequence(id, hit);
    if (!kv_->AllocateSlots(id, len + 1)) {
      kv_->FreeSequence(id);  // the head waits for blocks (FCFS)
      return false;
    }
    waiting_.pop_front();
    seq.status = SeqStatus::kWaitingForRemoteKv;
    seq.num_computed = hit.num_tokens;
    seq.num_cached_prompt_tokens = hit.num_tokens;
    CountCached(seq);
    plan->remote_kv_starts.push_back(RemoteKvStart{id, hit.num_tokens});
    return true;
  }
  if (!has_slot) return false;

  const int32_t count =
      BoundChunk(local_hit.num_tokens,
                 std::min({len - local_hit.num_tokens, options_.prefill_chunk_tokens,
                           budget - plan->num_batched_tokens}),
                 *plan);
  if (count <= 0) return false;  // the TPOT bound leaves no room this step
  kv_->StartSequence(id, local_hit);
  seq.num_computed = local_hit.num_tokens;
  if (seq.num_preemptions == 0) seq.num_cached_prompt_tokens = local_hit.num_tokens;
  // A non-preemptible sequence reserves all its known tokens now, so every
  // admitted one can finish (they can never deadlock each other).
  const int32_t reserve = seq.preemptible ? seq.num_computed + count : len;
  if (!kv_->AllocateSlots(id, reserve)) {
    kv_->FreeSequence(id);  // the head waits for blocks (FCFS)
    seq.num_computed = 0;
    return false;
  }
  waiting_.pop_front();
  CountCached(seq);
  InsertRunning(id);
  plan->chunks.push_back(
      ScheduledChunk{id, seq.num_computed, count, seq.num_computed + count == len});
  plan->num_batched_tokens += count;
  return true;
}

StepPlan Scheduler::Schedule(const std::set<int64_t>& held) {
  StepPlan plan;
  const int32_t budget = options_.max_num_batched_tokens;

  // 1. Decodes, oldest first; 2. running prefills. A sequence preempted
  // during the pass is skipped when its turn comes.
  for (const bool decode_pass : {true, false}) {
    const std::vector<int64_t> order = running_;
    for (int64_t id : order) {
      if (std::find(running_.begin(), running_.end(), id) == running_.end()) continue;
      if (held.count(id) != 0) continue;
      SeqState& seq = seqs_.at(id);
      const int32_t left = static_cast<int32_t>(seq.tokens.size()) - seq.num_computed;
      if (left <= 0 || (left == 1) != decode_pass) continue;
      int32_t count =
          std::min({left, options_.prefill_chunk_tokens, budget - plan.num_batched_tokens});
      if (!decode_pass) count = BoundChunk(seq.num_computed, count, plan);
      if (count <= 0) continue;
      if (!AllocateOrPreempt(seq, seq.num_computed + count, &plan)) continue;
      plan.chunks.push_back(ScheduledChunk{id, seq.num_computed, count, count == left});
      plan.num_batched_tokens += count;
    }
  }

  // 3. Admissions in FCFS order, not in a step that had to preempt.
  while (plan.preempted.empty() && !waiting_.empty() && AdmitHead(&plan)) {
  }
  return plan;
}

void Scheduler::OnStepDone(const StepPlan& plan, const std::vector<int32_t>& sampled) {
  size_t next = 0;
  for (const ScheduledChunk& chunk : plan.chunks) {
    const int32_t* token = nullptr;
    if (chunk.samples) {
      assert(next < sampled.size());
      token = &sampled[next++];
    }
    auto it = seqs_.find(chunk.id);
    if (it == seqs_.end()) continue;  // removed meanwhile
    SeqState& seq = it->second;
    seq.num_computed = chunk.start + chunk.count;
    kv_->CommitComputed(seq.id, seq.tokens, seq.num_computed);
    if (token != nullptr) seq.tokens.push_back(*token);
  }
}

}  // namespace tandem::scheduler
