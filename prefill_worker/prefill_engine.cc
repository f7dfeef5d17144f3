#include "prefill_worker/prefill_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/server/request_validation.h"
#include "kvtransfer/kv_transfer.h"

namespace tandem::prefill {

PrefillEngine::PrefillEngine(const PrefillEngineOptions& options,
                             const model::LlamaModel* model)
    : options_(options),
      model_(model),
      pool_(model->kv_shape(options.block_size), options.num_kv_blocks) {
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
      queue_.push_back(Job{std::move(request), std::move(done)});
      stats_.running_requests = static_cast<uint32_t>(queue_.size()) +
                                (stats_.transfers_in_flight > 0 ? 1 : 0);
      cv_.Signal();
      return;
    }
  }
  done(absl::UnavailableError("prefill worker is shutting down"));
}

void PrefillEngine::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  cancelled_.insert(request_id);
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

void PrefillEngine::Loop() {
  for (;;) {
    Job job;
    std::deque<Job> abandoned;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
      if (stop_) {
        abandoned.swap(queue_);
      } else {
        job = std::move(queue_.front());
        queue_.pop_front();
        stats_.running_requests = static_cast<uint32_t>(queue_.size()) + 1;
      }
    }
    if (job.done == nullptr) {  // stopping
      for (Job& j : abandoned) j.done(absl::UnavailableError("prefill worker is shutting down"));
      return;
    }
    absl::StatusOr<PrefillResult> result = Run(job.request);
    {
      absl::MutexLock lock(&mu_);
      cancelled_.erase(job.request.request_id);
      stats_.running_requests = static_cast<uint32_t>(queue_.size());
      stats_.kv_blocks_in_use = static_cast<uint32_t>(pool_.num_in_use());
    }
    job.done(std::move(result));
  }
}

absl::StatusOr<PrefillResult> PrefillEngine::Run(const PrefillRequest& request) {
  const model::LlamaConfig& config = model_->config();
  absl::Status valid = ValidateGeneration(request.prompt, request.max_tokens,
                                          config.context_length, config.vocab_size,
                                          request.sampling);
  if (!valid.ok()) return valid;
  const int32_t prompt_len = static_cast<int32_t>(request.prompt.size());
  if (request.hit_tokens > static_cast<uint32_t>(prompt_len)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_target.hit_tokens: ", request.hit_tokens, " exceeds the prompt length ",
        prompt_len));
  }
  const int32_t blocks_needed = kv::BlocksForTokens(prompt_len, options_.block_size);
  auto blocks = pool_.Allocate(blocks_needed);
  if (!blocks.has_value()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prefill worker needs ", blocks_needed, " KV blocks, ", pool_.num_free(), " free"));
  }
  std::vector<int32_t> block_table = std::move(*blocks);
  struct FreeBlocks {
    kv::BlockPool& pool;
    std::vector<int32_t>& table;
    ~FreeBlocks() { pool.Free(table); }
  } free_blocks{pool_, block_table};

  auto sender = kvtransfer::KvSender::Connect(
      request.kv_endpoint, request.request_id, request.attempt,
      KvLayoutForModel(config, options_.model_fingerprint), options_.transfer_timeout_ms);
  if (!sender.ok()) {
    return absl::Status(sender.status().code(),
                        absl::StrCat("KV handshake with ", request.kv_endpoint, ": ",
                                     sender.status().message()));
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.transfers_in_flight = 1;
    stats_.kv_blocks_in_use = static_cast<uint32_t>(pool_.num_in_use());
  }
  struct InFlight {
    PrefillEngine* e;
    ~InFlight() {
      absl::MutexLock lock(&e->mu_);
      e->stats_.transfers_in_flight = 0;
    }
  } in_flight{this};

  // Per-layer hook: ship [max(start, hit), end) of each layer as soon as it
  // is written. After the first failure nothing more is sent.
  absl::Status send_status;
  int64_t frames = 0;
  const int32_t kv_dim = config.n_head_kv * config.head_dim;
  std::vector<float> k_rows, v_rows;
  model::LayerHook hook = [&](size_t, int32_t layer, int32_t start, int32_t count) {
    if (!send_status.ok()) return;
    const int32_t from = std::max<int32_t>(start, static_cast<int32_t>(request.hit_tokens));
    const int32_t end = start + count;
    if (from >= end) return;
    if (IsCancelled(request.request_id)) {
      send_status = absl::CancelledError("prefill cancelled");
      return;
    }
    if (options_.fault_stall_after_frames >= 0 && frames >= options_.fault_stall_after_frames) {
      // Injected stall: hold the connection open and send nothing.
      while (!IsCancelled(request.request_id)) absl::SleepFor(absl::Milliseconds(20));
      send_status = absl::CancelledError("prefill cancelled during injected stall");
      return;
    }
    const size_t n = static_cast<size_t>(end - from) * static_cast<size_t>(kv_dim);
    k_rows.resize(n);
    v_rows.resize(n);
    kv::ReadKvRows(pool_, block_table, layer, from, end - from, k_rows.data(), v_rows.data());
    send_status = (*sender)->SendFrame(static_cast<uint32_t>(layer), static_cast<uint32_t>(from),
                                       static_cast<uint32_t>(end - from), k_rows.data(),
                                       v_rows.data());
    ++frames;
  };
  model::SequenceBatch entry;
  entry.tokens = request.prompt;
  entry.start_pos = 0;
  entry.block_table = &block_table;
  entry.want_logits = true;
  model_->Forward(std::span<const model::SequenceBatch>(&entry, 1), pool_, &logits_, &hook);
  {
    absl::MutexLock lock(&mu_);
    stats_.prefill_tokens_computed_total += static_cast<uint64_t>(prompt_len);
    stats_.kv_bytes_sent_total += (*sender)->bytes_sent();
  }
  if (!send_status.ok()) return send_status;

  PrefillResult result;
  result.first_token = sampling::Sample(logits_, request.sampling, /*output_index=*/0);
  result.prompt_tokens_computed = static_cast<uint32_t>(prompt_len);
  result.kv_bytes_sent = (*sender)->bytes_sent();
  if (result.first_token.token_id == options_.eos_token_id) {
    result.finish_reason = FinishReason::kStop;
  } else if (request.max_tokens <= 1) {
    result.finish_reason = FinishReason::kLength;
  } else if (prompt_len + 1 >= config.context_length) {
    result.finish_reason = FinishReason::kContext;
  }
  absl::Status final_status =
      (*sender)->SendFinal(result.first_token.token_id, result.first_token.logprob,
                           static_cast<uint32_t>(result.finish_reason));
  if (!final_status.ok()) return final_status;
  return result;
}

}  // namespace tandem::prefill
