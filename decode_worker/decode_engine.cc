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
  SeqState state = SeqState::kWaiting;
  std::vector<int32_t> tokens;   // prompt, then generated tokens
  int32_t num_computed = 0;      // tokens whose K/V is in the cache
  int32_t num_generated = 0;     // output indices produced so far
  int32_t blocks_needed = 0;
  std::vector<int32_t> block_table;
  std::unique_ptr<BlockTableWriter> writer;  // remote prefill only
  absl::Status abort_status;  // why a kAborting sequence ends
};

// Receives K/V rows from the KV receiver straight into a sequence's blocks.
// The loop leaves those blocks alone until the transfer's done callback.
class DecodeEngine::BlockTableWriter : public kvtransfer::KvWriter {
 public:
  BlockTableWriter(kv::BlockPool* pool, const std::vector<int32_t>* table)
      : pool_(pool), table_(table) {}
  void WriteRows(uint32_t layer, uint32_t token_start, uint32_t token_count,
                 const float* k, const float* v) override {
    kv::WriteKvRows(*pool_, *table_, static_cast<int32_t>(layer),
                    static_cast<int32_t>(token_start),
                    static_cast<int32_t>(token_count), k, v);
  }

 private:
  kv::BlockPool* pool_;
  const std::vector<int32_t>* table_;
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
      pool_(model->kv_shape(options.block_size), options.num_kv_blocks) {
  stats_.kv_blocks_total = static_cast<uint32_t>(options.num_kv_blocks);
}

DecodeEngine::~DecodeEngine() {
  Shutdown();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.Signal();
  }
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
  const int32_t kv_tokens =
      static_cast<int32_t>(request.prompt.size()) + request.max_tokens - 1;
  const int32_t blocks = kv::BlocksForTokens(kv_tokens, options_.block_size);
  if (blocks > options_.num_kv_blocks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request needs ", blocks, " KV blocks (", kv_tokens,
        " tokens) but the decode worker's pool has only ", options_.num_kv_blocks));
  }
  auto seq = std::make_unique<Sequence>();
  seq->tokens = request.prompt;
  seq->blocks_needed = blocks;
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

bool DecodeEngine::HasRunnableWork() const {
  for (const auto& [id, seq] : sequences_) {
    if (seq->state == SeqState::kPrefilling || seq->state == SeqState::kDecoding) {
      return true;
    }
  }
  // A step that finished sequences may have freed the blocks the FCFS head
  // waits for; nothing else would wake the loop to admit it.
  if (!waiting_.empty()) {
    auto it = sequences_.find(waiting_.front());
    if (it == sequences_.end() || it->second->blocks_needed <= pool_.num_free()) return true;
  }
  return false;
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
      waiting_.push_back(seq->request.request_id);
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
      bool receiving = false;
      for (const auto& [id, seq] : sequences_) {
        receiving |= seq->state == SeqState::kAborting;
      }
      if (!receiving) return;
      absl::MutexLock lock(&mu_);
      if (inbox_done_.empty()) {
        cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
      }
      continue;
    }
    Admit();
    RunStep();
  }
}

void DecodeEngine::Admit() {
  while (!waiting_.empty()) {
    auto it = sequences_.find(waiting_.front());
    if (it == sequences_.end()) {  // defensive: Abort already removes ids
      waiting_.pop_front();
      continue;
    }
    Sequence& seq = *it->second;
    auto blocks = pool_.Allocate(seq.blocks_needed);
    if (!blocks.has_value()) return;  // FCFS: the head waits for blocks
    seq.block_table = std::move(*blocks);
    waiting_.pop_front();
    StartSequence(seq);
  }
}

void DecodeEngine::StartSequence(Sequence& seq) {
  const int32_t prompt_len = static_cast<int32_t>(seq.request.prompt.size());
  bool local = seq.request.route == RouteChoice::kLocal ||
               (seq.request.route == RouteChoice::kAuto &&
                prompt_len <= options_.max_local_prefill_tokens);
  if (local) {
    seq.state = SeqState::kPrefilling;
    return;
  }
  seq.writer = std::make_unique<BlockTableWriter>(&pool_, &seq.block_table);
  const std::string id = seq.request.request_id;
  constexpr uint32_t kAttempt = 1;
  absl::Status expect = receiver_->Expect(
      id, kAttempt, /*hit_tokens=*/0, static_cast<uint32_t>(prompt_len),
      seq.writer.get(),
      [this, id](absl::Status status, const kvtransfer::TransferResult& result) {
        absl::MutexLock lock(&mu_);
        inbox_done_.push_back(TransferDone{id, std::move(status), result});
        cv_.Signal();
      });
  if (!expect.ok()) {
    FinishSequence(id, expect, FinishReason::kNone);
    return;
  }
  seq.state = SeqState::kWaitingForKv;
  seq.sink->NeedRemotePrefill(kv_endpoint(), 0, kAttempt);
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
  seq.num_computed = static_cast<int32_t>(seq.request.prompt.size());
  seq.tokens.push_back(r.first_token);
  seq.num_generated = 1;
  // The router streams token 0 from P's reply; D streams from index 1.
  auto reason = static_cast<FinishReason>(r.finish_reason);
  if (reason == FinishReason::kNone && seq.num_generated >= seq.request.max_tokens) {
    reason = FinishReason::kLength;
  }
  if (reason != FinishReason::kNone) {
    FinishSequence(done.request_id, absl::OkStatus(), reason);
    return;
  }
  seq.state = SeqState::kDecoding;
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
    case SeqState::kWaiting:
      // Out of the FCFS queue now: a later request reusing the id must not
      // be admitted through this stale entry as well as its own.
      if (auto pos = std::find(waiting_.begin(), waiting_.end(), request_id);
          pos != waiting_.end()) {
        waiting_.erase(pos);
      }
      [[fallthrough]];
    case SeqState::kPrefilling:
    case SeqState::kDecoding:
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
  if (!seq->block_table.empty()) pool_.Free(seq->block_table);
  {
    absl::MutexLock lock(&mu_);
    live_ids_.erase(request_id);
    stats_.running_requests = static_cast<uint32_t>(live_ids_.size());
    stats_.kv_blocks_in_use = static_cast<uint32_t>(pool_.num_in_use());
  }
  // The sink hears last, so whoever reacts to Finish sees the blocks freed
  // in GetStats() and may reuse the request id.
  seq->sink->Finish(status, reason);
}

void DecodeEngine::RunStep() {
  // Decode sequences first (one token each), then local prefills.
  std::vector<Sequence*> batch_seqs;
  for (auto& [id, seq] : sequences_) {
    if (seq->state == SeqState::kDecoding) batch_seqs.push_back(seq.get());
  }
  const size_t num_decode = batch_seqs.size();
  for (auto& [id, seq] : sequences_) {
    if (seq->state == SeqState::kPrefilling) batch_seqs.push_back(seq.get());
  }
  if (batch_seqs.size() > static_cast<size_t>(options_.max_num_seqs)) {
    batch_seqs.resize(options_.max_num_seqs);
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.kv_blocks_in_use = static_cast<uint32_t>(pool_.num_in_use());
  }
  if (batch_seqs.empty()) return;

  std::vector<model::SequenceBatch> batch;
  batch.reserve(batch_seqs.size());
  uint64_t prefill_tokens = 0;
  for (Sequence* seq : batch_seqs) {
    model::SequenceBatch entry;
    const int32_t n = static_cast<int32_t>(seq->tokens.size()) - seq->num_computed;
    entry.tokens = std::span<const int32_t>(seq->tokens.data() + seq->num_computed,
                                            static_cast<size_t>(n));
    entry.start_pos = seq->num_computed;
    entry.block_table = &seq->block_table;
    entry.want_logits = true;
    if (seq->state == SeqState::kPrefilling) prefill_tokens += static_cast<uint64_t>(n);
    batch.push_back(entry);
  }
  model_->Forward(batch, pool_, &logits_);

  const int32_t vocab = model_->config().vocab_size;
  const int32_t context = model_->config().context_length;
  std::vector<std::pair<std::string, FinishReason>> finished;
  for (size_t i = 0; i < batch_seqs.size(); ++i) {
    Sequence& seq = *batch_seqs[i];
    const bool was_prefill = seq.state == SeqState::kPrefilling;
    seq.num_computed = static_cast<int32_t>(seq.tokens.size());
    std::span<const float> logits(logits_.data() + i * vocab, static_cast<size_t>(vocab));
    sampling::SampledToken t = sampling::Sample(
        logits, seq.request.sampling, static_cast<uint32_t>(seq.num_generated));
    const uint32_t computed =
        was_prefill ? static_cast<uint32_t>(seq.request.prompt.size()) : 0;
    seq.sink->Token(static_cast<uint32_t>(seq.num_generated), t.token_id, t.logprob,
                    computed);
    seq.tokens.push_back(t.token_id);
    ++seq.num_generated;
    seq.state = SeqState::kDecoding;
    FinishReason reason = FinishReason::kNone;
    if (t.token_id == options_.eos_token_id) {
      reason = FinishReason::kStop;
    } else if (seq.num_generated >= seq.request.max_tokens) {
      reason = FinishReason::kLength;
    } else if (static_cast<int32_t>(seq.tokens.size()) >= context) {
      reason = FinishReason::kContext;
    }
    if (reason != FinishReason::kNone) {
      finished.emplace_back(seq.request.request_id, reason);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.prefill_tokens_computed_total += prefill_tokens;
    stats_.decode_tokens_total += num_decode;
    stats_.max_decode_batch_size =
        std::max<uint32_t>(stats_.max_decode_batch_size, static_cast<uint32_t>(num_decode));
  }
  for (const auto& [id, reason] : finished) FinishSequence(id, absl::OkStatus(), reason);
}

}  // namespace tandem::decode
