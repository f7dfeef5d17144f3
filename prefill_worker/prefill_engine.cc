#include "prefill_worker/prefill_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/server/request_validation.h"

namespace tandem::prefill {

PrefillEngine::PrefillEngine(const PrefillEngineOptions& options,
                             const model::LlamaModel* model)
    : options_(options),
      model_(model),
      pool_(model->kv_shape(options.block_size), options.num_kv_blocks),
      kv_(&pool_, kv::KvCacheManagerOptions{options.enable_prefix_caching,
                                            options.model_fingerprint}),
      scheduler_(
          [&] {
            scheduler::SchedulerOptions s;
            s.max_num_batched_tokens = options.max_num_batched_tokens;
            s.max_num_seqs = options.max_num_seqs;
            s.prefill_chunk_tokens = options.prefill_chunk_tokens;
            s.enable_prefix_caching = options.enable_prefix_caching;
            s.reserve_whole_sequence_at_admission = true;
            return s;
          }(),
          &kv_) {
  stats_.kv_blocks_total = static_cast<uint32_t>(options.num_kv_blocks);
  thread_ = std::thread([this] { Loop(); });
}

PrefillEngine::~PrefillEngine() {
  Shutdown();
  if (thread_.joinable()) thread_.join();
}

void PrefillEngine::Submit(PrefillRequest request, Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      cancelled_.erase(request.request_id);
      Job job;
      job.request = std::move(request);
      job.done = std::move(done);
      inbox_.push_back(std::move(job));
      ++stats_.running_requests;  // UpdateStats recounts it on the engine thread
      cv_.Signal();
      return;
    }
  }
  done(absl::UnavailableError("prefill worker is shutting down"));
}

void PrefillEngine::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  cancelled_.insert(request_id);
  cv_.Signal();
}

void PrefillEngine::Shutdown() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  cv_.Signal();
}

PrefillStats PrefillEngine::GetStats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool PrefillEngine::IsCancelled(const std::string& request_id) const {
  absl::MutexLock lock(&mu_);
  return stop_ || cancelled_.count(request_id) != 0;
}

void PrefillEngine::UpdateStats() {
  stats_.running_requests = static_cast<uint32_t>(inbox_.size() + jobs_.size());
  stats_.transfers_in_flight = static_cast<uint32_t>(jobs_.size());
  stats_.kv_blocks_in_use = static_cast<uint32_t>(kv_.num_blocks_in_use());
  stats_.kv_blocks_cached = static_cast<uint32_t>(kv_.num_blocks_cached());
}

void PrefillEngine::Loop() {
  for (;;) {
    std::deque<Job> arrivals;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && inbox_.empty() && cancelled_.empty() && !scheduler_.HasWork()) {
        cv_.Wait(&mu_);
      }
      arrivals.swap(inbox_);
      stopping = stop_;
    }
    if (stopping) {
      for (Job& job : arrivals) job.done(absl::UnavailableError("prefill worker is shutting down"));
      std::vector<int64_t> ids;
      for (const auto& [id, job] : jobs_) ids.push_back(id);
      for (int64_t id : ids) FinishJob(id, absl::UnavailableError("prefill worker is shutting down"));
      return;
    }
    for (Job& job : arrivals) {
      job.seq_id = next_seq_id_++;
      if (!StartJob(job)) continue;
      scheduler::SeqState s;
      s.id = job.seq_id;
      s.tokens = job.request.prompt;
      s.num_prompt_tokens = static_cast<int32_t>(job.request.prompt.size());
      s.preemptible = false;
      scheduler_.Add(std::move(s));
      jobs_.emplace(job.seq_id, std::move(job));
    }
    std::vector<int64_t> cancelled;
    for (const auto& [id, job] : jobs_) {
      if (IsCancelled(job.request.request_id)) cancelled.push_back(id);
    }
    for (int64_t id : cancelled) FinishJob(id, absl::CancelledError("prefill cancelled"));
    {
      absl::MutexLock lock(&mu_);
      // Ids of requests that are gone no longer need remembering.
      for (auto it = cancelled_.begin(); it != cancelled_.end();) {
        bool live = false;
        for (const auto& [id, job] : jobs_) live |= job.request.request_id == *it;
        it = live ? std::next(it) : cancelled_.erase(it);
      }
      UpdateStats();
    }
    RunStep();
  }
}

bool PrefillEngine::StartJob(Job& job) {
  const PrefillRequest& request = job.request;
  const model::LlamaConfig& config = model_->config();
  absl::Status status = ValidateGeneration(request.prompt, request.max_tokens,
                                           config.context_length, config.vocab_size,
                                           request.sampling);
  const int32_t prompt_len = static_cast<int32_t>(request.prompt.size());
  if (status.ok() && request.hit_tokens > static_cast<uint32_t>(prompt_len)) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "kv_target.hit_tokens: ", request.hit_tokens, " exceeds the prompt length ", prompt_len));
  }
  const int32_t blocks = kv::BlocksForTokens(prompt_len, options_.block_size);
  if (status.ok() && blocks > options_.num_kv_blocks) {
    status = absl::ResourceExhaustedError(absl::StrCat(
        "prompt needs ", blocks, " KV blocks but the prefill worker's pool has only ",
        options_.num_kv_blocks));
  }
  if (status.ok()) {
    auto sender = kvtransfer::KvSender::Connect(
        request.kv_endpoint, request.request_id, request.attempt,
        KvLayoutForModel(config, options_.model_fingerprint), options_.transfer_timeout_ms);
    if (sender.ok()) {
      job.sender = std::move(*sender);
    } else {
      status = absl::Status(sender.status().code(),
                            absl::StrCat("KV handshake with ", request.kv_endpoint, ": ",
                                         sender.status().message()));
    }
  }
  if (!status.ok()) {
    job.done(status);
    return false;
  }
  return true;
}

void PrefillEngine::SendRows(Job& job, int32_t layer, int32_t from, int32_t to) {
  if (!job.error.ok() || from >= to) return;
  if (IsCancelled(job.request.request_id)) {
    job.error = absl::CancelledError("prefill cancelled");
    return;
  }
  if (options_.fault_stall_after_frames >= 0 && job.frames >= options_.fault_stall_after_frames) {
    // Injected stall: hold the connection open and send nothing.
    while (!IsCancelled(job.request.request_id)) absl::SleepFor(absl::Milliseconds(20));
    job.error = absl::CancelledError("prefill cancelled during injected stall");
    return;
  }
  const int32_t kv_dim = model_->config().n_head_kv * model_->config().head_dim;
  const size_t n = static_cast<size_t>(to - from) * static_cast<size_t>(kv_dim);
  k_rows_.resize(n);
  v_rows_.resize(n);
  kv::ReadKvRows(pool_, kv_.BlockTable(job.seq_id), layer, from, to - from, k_rows_.data(),
                 v_rows_.data());
  job.error = job.sender->SendFrame(static_cast<uint32_t>(layer), static_cast<uint32_t>(from),
                                    static_cast<uint32_t>(to - from), k_rows_.data(),
                                    v_rows_.data());
  ++job.frames;
}

void PrefillEngine::RunStep() {
  const scheduler::StepPlan plan = scheduler_.Schedule();
  if (plan.chunks.empty()) return;
  const int32_t n_layers = model_->config().n_layers;
  std::vector<Job*> entry_jobs;
  std::vector<model::SequenceBatch> batch;
  for (const scheduler::ScheduledChunk& chunk : plan.chunks) {
    Job& job = jobs_.at(chunk.id);
    const int32_t d_hit = static_cast<int32_t>(job.request.hit_tokens);
    if (!job.cached_rows_sent) {
      // The first chunk starts at P's own prefix hit: [D_hit, P_hit) come
      // from cached blocks (DESIGN.md, step 5).
      job.cached_rows_sent = true;
      for (int32_t layer = 0; layer < n_layers; ++layer) {
        SendRows(job, layer, d_hit, chunk.start);
      }
    }
    const scheduler::SeqState* s = scheduler_.Find(chunk.id);
    model::SequenceBatch entry;
    entry.tokens = std::span<const int32_t>(s->tokens.data() + chunk.start,
                                            static_cast<size_t>(chunk.count));
    entry.start_pos = chunk.start;
    entry.block_table = &kv_.BlockTable(chunk.id);
    entry.want_logits = chunk.samples;
    batch.push_back(entry);
    entry_jobs.push_back(&job);
  }
  // Per-layer hook: ship [max(start, D_hit), end) of each chunk as soon as
  // that layer is written.
  model::LayerHook hook = [&](size_t entry, int32_t layer, int32_t start, int32_t count) {
    Job& job = *entry_jobs[entry];
    SendRows(job, layer, std::max<int32_t>(start, static_cast<int32_t>(job.request.hit_tokens)),
             start + count);
  };
  model_->Forward(batch, pool_, &logits_, &hook);

  const int32_t vocab = model_->config().vocab_size;
  std::vector<int32_t> sampled;
  std::vector<std::pair<int64_t, absl::StatusOr<PrefillResult>>> finished;
  uint64_t computed = 0;
  size_t row = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const scheduler::ScheduledChunk& chunk = plan.chunks[i];
    Job& job = *entry_jobs[i];
    computed += static_cast<uint64_t>(chunk.count);
    if (!chunk.samples) {
      if (!job.error.ok()) finished.emplace_back(chunk.id, job.error);
      continue;
    }
    std::span<const float> logits(logits_.data() + row * vocab, static_cast<size_t>(vocab));
    ++row;
    PrefillResult result;
    result.first_token = sampling::Sample(logits, job.request.sampling, /*output_index=*/0);
    sampled.push_back(result.first_token.token_id);
    const int32_t prompt_len = static_cast<int32_t>(job.request.prompt.size());
    const scheduler::SeqState* s = scheduler_.Find(chunk.id);
    result.prompt_tokens_computed =
        static_cast<uint32_t>(prompt_len - s->num_cached_prompt_tokens);
    if (result.first_token.token_id == options_.eos_token_id) {
      result.finish_reason = FinishReason::kStop;
    } else if (job.request.max_tokens <= 1) {
      result.finish_reason = FinishReason::kLength;
    } else if (prompt_len + 1 >= model_->config().context_length) {
      result.finish_reason = FinishReason::kContext;
    }
    if (job.error.ok()) {
      job.error = job.sender->SendFinal(result.first_token.token_id, result.first_token.logprob,
                                        static_cast<uint32_t>(result.finish_reason));
    }
    result.kv_bytes_sent = job.sender->bytes_sent();
    if (job.error.ok()) {
      finished.emplace_back(chunk.id, result);
    } else {
      finished.emplace_back(chunk.id, job.error);
    }
  }
  scheduler_.OnStepDone(plan, sampled);  // publishes completed blocks
  {
    absl::MutexLock lock(&mu_);
    stats_.prefill_tokens_computed_total += computed;
  }
  for (auto& [id, result] : finished) FinishJob(id, std::move(result));
}

void PrefillEngine::FinishJob(int64_t seq_id, absl::StatusOr<PrefillResult> result) {
  auto it = jobs_.find(seq_id);
  if (it == jobs_.end()) return;
  Job job = std::move(it->second);
  jobs_.erase(it);
  scheduler_.Remove(seq_id);  // blocks back; full ones stay in the prefix cache
  const uint64_t bytes = job.sender != nullptr ? job.sender->bytes_sent() : 0;
  job.sender.reset();  // closes the connection (after FINAL, if sent)
  {
    absl::MutexLock lock(&mu_);
    stats_.kv_bytes_sent_total += bytes;
    cancelled_.erase(job.request.request_id);
    UpdateStats();
  }
  job.done(std::move(result));
}

}  // namespace tandem::prefill
