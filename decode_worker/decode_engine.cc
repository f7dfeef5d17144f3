#include "decode_worker/decode_engine.h"

#include <algorithm>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/server/request_validation.h"

namespace tandem::decode {

struct DecodeEngine::Sequence {
  DecodeRequest request;
  std::shared_ptr<DecodeSink> sink;
  SeqState state = SeqState::kNew;
  int64_t seq_id = 0;            // the scheduler's and KV manager's key
  int32_t num_generated = 0;     // output indices produced so far
  kv::PrefixHit remote_hit;      // remote: blocks D already holds
  std::unique_ptr<BlockTableWriter> writer;  // remote prefill only
  absl::Status abort_status;     // why a kAborting sequence ends
};

// Receives K/V rows from the KV receiver straight into a sequence's blocks.
// The loop leaves those blocks alone until the transfer's done callback.
class DecodeEngine::BlockTableWriter : public kvtransfer::KvWriter {
 public:
  BlockTableWriter(kv::BlockPool* pool, std::vector<int32_t> table)
      : pool_(pool), table_(std::move(table)) {}
  void WriteRows(uint32_t layer, uint32_t token_start, uint32_t token_count,
                 const float* k, const float* v) override {
    kv::WriteKvRows(*pool_, table_, static_cast<int32_t>(layer),
                    static_cast<int32_t>(token_start),
                    static_cast<int32_t>(token_count), k, v);
  }

 private:
  kv::BlockPool* pool_;
  const std::vector<int32_t> table_;  // a copy: the manager's may grow later
};

absl::StatusOr<std::unique_ptr<DecodeEngine>> DecodeEngine::Create(
    const DecodeEngineOptions& options, const model::LlamaModel* model) {
  std::unique_ptr<DecodeEngine> engine(new DecodeEngine(options, model));
  kvtransfer::KvReceiver::Options kv_options;
  kv_options.host = options.kv_host;
  kv_options.port = options.kv_port;
  kv_options.handshake_timeout_ms = options.handshake_timeout_ms;
  kv_options.transfer_timeout_ms = options.transfer_timeout_ms;
  auto receiver = kvtransfer::KvReceiver::Start(
      kv_options, KvLayoutForModel(model->config(), options.model_fingerprint));
  if (!receiver.ok()) return receiver.status();
  engine->receiver_ = std::move(*receiver);
  engine->loop_ = std::thread([e = engine.get()] { e->Loop(); });
  return engine;
}

DecodeEngine::DecodeEngine(const DecodeEngineOptions& options,
                           const model::LlamaModel* model)
    : options_(options),
      model_(model),
      pool_(model->kv_shape(options.block_size), options.num_kv_blocks),
      kv_(&pool_, kv::KvCacheManagerOptions{options.enable_prefix_caching,
                                            options.model_fingerprint}),
      scheduler_(scheduler::SchedulerOptions{options.max_num_batched_tokens,
                                             options.max_num_seqs,
                                             options.prefill_chunk_tokens,
                                             options.enable_prefix_caching},
                 &kv_) {
  stats_.kv_blocks_total = static_cast<uint32_t>(options.num_kv_blocks);
}

DecodeEngine::~DecodeEngine() {
  Shutdown();
  if (loop_.joinable()) loop_.join();
  // The receiver's destructor ends pending transfers; their callbacks only
  // post to the inbox, which nobody reads any more.
  receiver_.reset();
}

std::string DecodeEngine::kv_endpoint() const {
  return absl::StrCat(options_.kv_host, ":", receiver_->port());
}

absl::Status DecodeEngine::Submit(DecodeRequest request,
                                  std::shared_ptr<DecodeSink> sink) {
  const model::LlamaConfig& config = model_->config();
  absl::Status valid =
      ValidateGeneration(request.prompt, request.max_tokens, config.context_length,
                         config.vocab_size, request.sampling);
  if (!valid.ok()) return valid;
  // The largest KV a request can need: every token but the last sampled one.
  const int32_t kv_tokens =
      static_cast<int32_t>(request.prompt.size()) + request.max_tokens - 1;
  const int32_t blocks = kv::BlocksForTokens(kv_tokens, options_.block_size);
  if (blocks > options_.num_kv_blocks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request needs up to ", blocks, " KV blocks (", kv_tokens,
        " tokens) but the decode worker's pool has only ", options_.num_kv_blocks));
  }
  auto seq = std::make_unique<Sequence>();
  seq->request = std::move(request);
  seq->sink = std::move(sink);
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("decode worker is shutting down");
  if (live_ids_.count(seq->request.request_id) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id ", seq->request.request_id, " is already running"));
  }
  live_ids_[seq->request.request_id] = true;
  stats_.running_requests = static_cast<uint32_t>(live_ids_.size());
  inbox_new_.push_back(std::move(seq));
  cv_.Signal();
  return absl::OkStatus();
}

void DecodeEngine::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  inbox_cancel_.push_back(request_id);
  cv_.Signal();
}

void DecodeEngine::Shutdown() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
  cv_.Signal();
}

DecodeStats DecodeEngine::GetStats() const {
  absl::MutexLock lock(&mu_);
  DecodeStats stats = stats_;
  stats.transfers_in_flight = receiver_->transfers_in_flight();
  stats.kv_bytes_received_total = receiver_->kv_bytes_received_total();
  return stats;
}

void DecodeEngine::UpdateKvStats() {
  stats_.kv_blocks_in_use = static_cast<uint32_t>(kv_.num_blocks_in_use());
  stats_.kv_blocks_cached = static_cast<uint32_t>(kv_.num_blocks_cached());
}

bool DecodeEngine::HasRunnableWork() const {
  if (scheduler_.HasWork()) return true;
  // New requests, or the admission head now fits (blocks were freed).
  if (admission_.empty()) return false;
  auto it = sequences_.find(admission_.front());
  if (it == sequences_.end()) return true;
  const Sequence& seq = *it->second;
  if (seq.state == SeqState::kNew) return true;
  return kv::BlocksForTokens(static_cast<int32_t>(seq.request.prompt.size()) + 1,
                             options_.block_size) <= kv_.num_blocks_available();
}

void DecodeEngine::Loop() {
  for (;;) {
    std::vector<std::unique_ptr<Sequence>> arrivals;
    std::vector<std::string> cancels;
    std::vector<TransferDone> dones;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && inbox_new_.empty() && inbox_cancel_.empty() &&
             inbox_done_.empty() && !HasRunnableWork()) {
        cv_.Wait(&mu_);
      }
      arrivals.swap(inbox_new_);
      cancels.swap(inbox_cancel_);
      dones.swap(inbox_done_);
      stopping = stop_;
    }
    for (auto& seq : arrivals) {
      seq->seq_id = next_seq_id_++;
      by_seq_id_[seq->seq_id] = seq.get();
      admission_.push_back(seq->request.request_id);
      sequences_[seq->request.request_id] = std::move(seq);
    }
    for (const TransferDone& done : dones) HandleTransferDone(done);
    for (const std::string& id : cancels) {
      Abort(id, absl::CancelledError("request cancelled"));
    }
    if (stopping) {
      std::vector<std::string> ids;
      for (const auto& [id, seq] : sequences_) ids.push_back(id);
      for (const std::string& id : ids) {
        Abort(id, absl::UnavailableError("decode worker is shutting down"));
      }
      // Sequences still receiving end when their transfer quiesces; the
      // receiver is torn down after this loop exits.
      if (sequences_.empty()) return;
      absl::MutexLock lock(&mu_);
      if (inbox_done_.empty()) cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
      continue;
    }
    Admit();
    RunStep();
  }
}

void DecodeEngine::Admit() {
  while (!admission_.empty()) {
    auto it = sequences_.find(admission_.front());
    if (it == sequences_.end()) {  // defensive: Abort already removes ids
      admission_.pop_front();
      continue;
    }
    Sequence& seq = *it->second;
    const std::vector<int32_t>& prompt = seq.request.prompt;
    const int32_t prompt_len = static_cast<int32_t>(prompt.size());
    const int32_t bs = options_.block_size;
    if (seq.state == SeqState::kNew) {
      // D's own cache decides (DESIGN.md, step 3): a local prefill must
      // compute at least the last prompt token; a remote hit may cover every
      // full block, P then sends only [hit, L).
      const kv::PrefixHit local_hit =
          options_.enable_prefix_caching
              ? kv_.FindCachedPrefix(prompt, (prompt_len - 1) / bs * bs)
              : kv::PrefixHit{};
      const bool local = seq.request.route == RouteChoice::kLocal ||
                         (seq.request.route == RouteChoice::kAuto &&
                          prompt_len - local_hit.num_tokens <=
                              options_.max_local_prefill_tokens);
      if (local) {
        scheduler::SeqState s;
        s.id = seq.seq_id;
        s.tokens = prompt;
        s.num_prompt_tokens = prompt_len;
        scheduler_.Add(std::move(s));
        seq.state = SeqState::kScheduled;
        admission_.pop_front();
        continue;
      }
      seq.state = SeqState::kWaitingForBlocks;
    }
    if (!StartRemote(seq)) return;  // FCFS: the head waits for blocks
    admission_.pop_front();
  }
}

bool DecodeEngine::StartRemote(Sequence& seq) {
  const std::vector<int32_t>& prompt = seq.request.prompt;
  const int32_t prompt_len = static_cast<int32_t>(prompt.size());
  kv::PrefixHit hit;
  if (options_.enable_prefix_caching) {
    hit = kv_.FindCachedPrefix(prompt, prompt_len / options_.block_size * options_.block_size);
  }
  kv_.StartSequence(seq.seq_id, hit);
  // Token 0's K/V (position L) is computed by D's first decode step.
  if (!kv_.AllocateSlots(seq.seq_id, prompt_len + 1)) {
    kv_.FreeSequence(seq.seq_id);
    return false;
  }
  seq.remote_hit = hit;
  seq.writer = std::make_unique<BlockTableWriter>(&pool_, kv_.BlockTable(seq.seq_id));
  const std::string id = seq.request.request_id;
  constexpr uint32_t kAttempt = 1;
  absl::Status expect = receiver_->Expect(
      id, kAttempt, static_cast<uint32_t>(hit.num_tokens), static_cast<uint32_t>(prompt_len),
      seq.writer.get(),
      [this, id](absl::Status status, const kvtransfer::TransferResult& result) {
        absl::MutexLock lock(&mu_);
        inbox_done_.push_back(TransferDone{id, std::move(status), result});
        cv_.Signal();
      });
  if (!expect.ok()) {
    FinishSequence(id, expect, FinishReason::kNone);
    return true;
  }
  seq.state = SeqState::kWaitingForKv;
  seq.sink->NeedRemotePrefill(kv_endpoint(), static_cast<uint32_t>(hit.num_tokens), kAttempt);
  return true;
}

void DecodeEngine::HandleTransferDone(const TransferDone& done) {
  auto it = sequences_.find(done.request_id);
  if (it == sequences_.end()) return;
  Sequence& seq = *it->second;
  if (seq.state == SeqState::kAborting) {
    FinishSequence(done.request_id, seq.abort_status, FinishReason::kCancelled);
    return;
  }
  if (!done.status.ok()) {
    // conditional.on_prefill_failure: fail (v0).
    FinishSequence(done.request_id,
                   absl::UnavailableError(absl::StrCat(
                       "remote prefill failed: ", done.status.ToString())),
                   FinishReason::kNone);
    return;
  }
  const kvtransfer::TransferResult& r = done.result;
  if (r.first_token < 0 || r.first_token >= model_->config().vocab_size) {
    FinishSequence(done.request_id,
                   absl::DataLossError(absl::StrCat("KV transfer FINAL carried token id ",
                                                    r.first_token)),
                   FinishReason::kNone);
    return;
  }
  seq.writer.reset();
  seq.num_generated = 1;
  // The router streams token 0 from P's reply; D streams from index 1.
  auto reason = static_cast<FinishReason>(r.finish_reason);
  if (reason == FinishReason::kNone && seq.num_generated >= seq.request.max_tokens) {
    reason = FinishReason::kLength;
  }
  const int32_t prompt_len = static_cast<int32_t>(seq.request.prompt.size());
  kv_.CommitComputed(seq.seq_id, seq.request.prompt, prompt_len);  // publish the prompt
  if (reason != FinishReason::kNone) {
    FinishSequence(done.request_id, absl::OkStatus(), reason);
    return;
  }
  scheduler::SeqState s;
  s.id = seq.seq_id;
  s.tokens = seq.request.prompt;
  s.tokens.push_back(r.first_token);
  s.num_prompt_tokens = prompt_len;
  s.num_computed = prompt_len;
  s.num_cached_prompt_tokens = seq.remote_hit.num_tokens;
  scheduler_.AddRunning(std::move(s));
  seq.state = SeqState::kScheduled;
}

void DecodeEngine::Abort(const std::string& request_id, const absl::Status& status) {
  auto it = sequences_.find(request_id);
  if (it == sequences_.end()) return;
  Sequence& seq = *it->second;
  switch (seq.state) {
    case SeqState::kWaitingForKv:
      // RECEIVING -> ABORTING: blocks are freed only once the receiver has
      // quiesced and runs the done callback.
      seq.state = SeqState::kAborting;
      seq.abort_status = status;
      receiver_->Cancel(request_id);
      return;
    case SeqState::kAborting:
      return;
    case SeqState::kNew:
    case SeqState::kWaitingForBlocks:
    case SeqState::kScheduled:
      FinishSequence(request_id, status, FinishReason::kCancelled);
      return;
  }
}

void DecodeEngine::FinishSequence(const std::string& request_id,
                                  const absl::Status& status, FinishReason reason) {
  auto it = sequences_.find(request_id);
  if (it == sequences_.end()) return;
  std::unique_ptr<Sequence> seq = std::move(it->second);
  sequences_.erase(it);
  by_seq_id_.erase(seq->seq_id);
  // Out of the admission queue too: a later request reusing the id must not
  // be admitted through a stale entry.
  admission_.erase(std::remove(admission_.begin(), admission_.end(), request_id),
                   admission_.end());
  scheduler_.Remove(seq->seq_id);  // frees its blocks (no-op if not there)
  kv_.FreeSequence(seq->seq_id);   // remote sequences never joined the scheduler
  {
    absl::MutexLock lock(&mu_);
    live_ids_.erase(request_id);
    stats_.running_requests = static_cast<uint32_t>(live_ids_.size());
    UpdateKvStats();
  }
  // The sink hears last, so whoever reacts to Finish sees the blocks freed
  // in GetStats() and may reuse the request id.
  seq->sink->Finish(status, reason);
}

void DecodeEngine::RunStep() {
  const scheduler::StepPlan plan = scheduler_.Schedule();
  {
    absl::MutexLock lock(&mu_);
    UpdateKvStats();
    stats_.preemptions_total += plan.preempted.size();
  }
  if (plan.chunks.empty()) return;

  std::vector<model::SequenceBatch> batch;
  batch.reserve(plan.chunks.size());
  uint64_t prefill_tokens = 0;
  uint32_t num_decode = 0;
  for (const scheduler::ScheduledChunk& chunk : plan.chunks) {
    const scheduler::SeqState* s = scheduler_.Find(chunk.id);
    model::SequenceBatch entry;
    entry.tokens = std::span<const int32_t>(s->tokens.data() + chunk.start,
                                            static_cast<size_t>(chunk.count));
    entry.start_pos = chunk.start;
    entry.block_table = &kv_.BlockTable(chunk.id);
    entry.want_logits = chunk.samples;
    if (chunk.start >= s->num_prompt_tokens && chunk.count == 1) {
      ++num_decode;
    } else {
      prefill_tokens += static_cast<uint64_t>(chunk.count);
    }
    batch.push_back(entry);
  }
  model_->Forward(batch, pool_, &logits_);

  const int32_t vocab = model_->config().vocab_size;
  const int32_t context = model_->config().context_length;
  std::vector<int32_t> sampled;
  std::vector<std::pair<std::string, FinishReason>> finished;
  size_t logit_row = 0;
  for (const scheduler::ScheduledChunk& chunk : plan.chunks) {
    if (!chunk.samples) continue;
    Sequence& seq = *by_seq_id_.at(chunk.id);
    const scheduler::SeqState& s = *scheduler_.Find(chunk.id);
    std::span<const float> logits(logits_.data() + logit_row * vocab,
                                  static_cast<size_t>(vocab));
    ++logit_row;
    // A sequence recomputing after preemption reaches the end of its known
    // tokens again: its next output index continues where it stopped.
    sampling::SampledToken t = sampling::Sample(
        logits, seq.request.sampling, static_cast<uint32_t>(seq.num_generated));
    sampled.push_back(t.token_id);
    const bool first = seq.num_generated == 0;
    seq.sink->Token(static_cast<uint32_t>(seq.num_generated), t.token_id, t.logprob,
                    first ? static_cast<uint32_t>(s.num_prompt_tokens -
                                                  s.num_cached_prompt_tokens)
                          : 0);
    ++seq.num_generated;
    FinishReason reason = FinishReason::kNone;
    if (t.token_id == options_.eos_token_id) {
      reason = FinishReason::kStop;
    } else if (seq.num_generated >= seq.request.max_tokens) {
      reason = FinishReason::kLength;
    } else if (static_cast<int32_t>(s.tokens.size()) + 1 >= context) {
      reason = FinishReason::kContext;
    }
    if (reason != FinishReason::kNone) finished.emplace_back(seq.request.request_id, reason);
  }
  scheduler_.OnStepDone(plan, sampled);
  {
    absl::MutexLock lock(&mu_);
    stats_.prefill_tokens_computed_total += prefill_tokens;
    stats_.decode_tokens_total += num_decode;
    stats_.max_decode_batch_size = std::max(stats_.max_decode_batch_size, num_decode);
  }
  for (const auto& [id, reason] : finished) FinishSequence(id, absl::OkStatus(), reason);
}

}  // namespace tandem::decode
