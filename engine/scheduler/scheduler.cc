#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <cassert>
#include <limits>

namespace tandem::scheduler {

Scheduler::Scheduler(const SchedulerOptions& options, kv::KvCacheManager* kv)
    : options_(options), kv_(kv) {}

void Scheduler::Add(SeqState seq) {
  const int64_t id = seq.id;
  assert(seqs_.count(id) == 0);
  seq.arrival = next_arrival_++;
  seq.num_computed = 0;
  seqs_.emplace(id, std::move(seq));
  waiting_.push_back(id);
}

void Scheduler::AddRunning(SeqState seq) {
  const int64_t id = seq.id;
  assert(seqs_.count(id) == 0 && kv_->HasSequence(id));
  seq.arrival = next_arrival_++;
  seqs_.emplace(id, std::move(seq));
  running_.push_back(id);  // newest arrival: the end keeps arrival order
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

SeqState* Scheduler::FindMutable(int64_t id) {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

bool Scheduler::HasWork() const { return !waiting_.empty() || !running_.empty(); }

void Scheduler::Preempt(int64_t id, StepPlan* plan) {
  SeqState& seq = seqs_.at(id);
  kv_->FreeSequence(id);
  seq.num_computed = 0;
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

StepPlan Scheduler::Schedule() {
  StepPlan plan;
  const int32_t budget = options_.max_num_batched_tokens;
  auto remaining = [](const SeqState& s) {
    return static_cast<int32_t>(s.tokens.size()) - s.num_computed;
  };
  auto plan_chunk = [&](SeqState& seq, int32_t count) {
    const bool samples = seq.num_computed + count == static_cast<int32_t>(seq.tokens.size());
    plan.chunks.push_back(ScheduledChunk{seq.id, seq.num_computed, count, samples});
    plan.num_batched_tokens += count;
  };

  // 1. Decodes, oldest first; 2. running prefills. A sequence preempted
  // during the pass is skipped when its turn comes.
  for (const bool decode_pass : {true, false}) {
    const std::vector<int64_t> order = running_;
    for (int64_t id : order) {
      if (std::find(running_.begin(), running_.end(), id) == running_.end()) continue;
      SeqState& seq = seqs_.at(id);
      const int32_t left = remaining(seq);
      if (left <= 0 || (left == 1) != decode_pass) continue;
      const int32_t count = std::min({left, options_.prefill_chunk_tokens,
                                      budget - plan.num_batched_tokens});
      if (count <= 0) continue;
      if (!AllocateOrPreempt(seq, seq.num_computed + count, &plan)) continue;
      plan_chunk(seq, count);
    }
  }

  // 3. Admissions in FCFS order, not in a step that had to preempt.
  while (plan.preempted.empty() && !waiting_.empty() &&
         running_.size() < static_cast<size_t>(options_.max_num_seqs) &&
         plan.num_batched_tokens < budget) {
    const int64_t id = waiting_.front();
    SeqState& seq = seqs_.at(id);
    kv::PrefixHit hit;
    if (options_.enable_prefix_caching) {
      // The last token is always computed: it yields the logits.
      const int32_t bs = kv_->block_size();
      int32_t cap = (static_cast<int32_t>(seq.tokens.size()) - 1) / bs * bs;
      if (seq.max_hit_tokens > 0) cap = std::min(cap, seq.max_hit_tokens);
      hit = kv_->FindCachedPrefix(seq.tokens, cap);
    }
    kv_->StartSequence(id, hit);
    seq.num_computed = hit.num_tokens;
    if (seq.num_preemptions == 0) seq.num_cached_prompt_tokens = hit.num_tokens;
    const int32_t count = std::min({remaining(seq), options_.prefill_chunk_tokens,
                                    budget - plan.num_batched_tokens});
    const int32_t reserve = options_.reserve_whole_sequence_at_admission
                                ? static_cast<int32_t>(seq.tokens.size())
                                : seq.num_computed + count;
    if (!kv_->AllocateSlots(id, reserve)) {
      kv_->FreeSequence(id);  // the head waits for blocks (FCFS)
      seq.num_computed = 0;
      break;
    }
    waiting_.pop_front();
    // Keep running_ in arrival order (a resumed sequence is older).
    auto pos = std::upper_bound(running_.begin(), running_.end(), seq.arrival,
                                [&](uint64_t a, int64_t other) {
                                  return a < seqs_.at(other).arrival;
                                });
    running_.insert(pos, id);
    plan_chunk(seq, count);
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
