#include "engine/core/engine_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/core/request_validation.h"

namespace tandem::core {
namespace {

using scheduler::SeqStatus;

std::vector<int32_t> SortedUnique(std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

scheduler::SchedulerOptions WithLoader(scheduler::SchedulerOptions options, bool loader) {
  options.remote_prefill_available = loader;
  return options;
}

}  // namespace

struct EngineCore::Request {
  EngineRequest req;
  int64_t seq_id = 0;  // the scheduler's and KV manager's key
  std::shared_ptr<CancelFlag> cancelled;
  int32_t num_generated = 0;      // output indices produced so far
  bool export_open = false;       // kv_export: Open succeeded, not closed yet
  bool cached_rows_sent = false;  // kv_export: rows from the prefix cache went out
  absl::Status export_error;      // kv_export: first failure
  absl::Status abort_status;      // why a request aborted while loading ends
};

EngineCore::EngineCore(const EngineCoreOptions& options,
                       std::unique_ptr<backend::ModelBackend> backend,
                       std::unique_ptr<RemoteKvLoader> loader)
    : options_(options),
      stop_{SortedUnique(options.eog_token_ids), backend->config().context_length},
      backend_(std::move(backend)),
      loader_(std::move(loader)),
      pool_(backend_->kv_storage().num_blocks()),
      kv_(&pool_, kv::KvCacheManagerOptions{options.scheduler.enable_prefix_caching,
                                            options.model_fingerprint,
                                            backend_->kv_storage().shape().block_size}),
      scheduler_(WithLoader(options.scheduler, loader_ != nullptr), &kv_) {
  stats_.kv_blocks_total = static_cast<uint32_t>(pool_.num_blocks());
  loop_ = std::thread([this] { Loop(); });
}

EngineCore::~EngineCore() {
  Shutdown();
  if (loop_.joinable()) loop_.join();
  // Nothing is loading any more (the loop waited for every aborted load's
  // done); destroying the loader now cannot call into a dead core.
  loader_.reset();
}

absl::Status EngineCore::Submit(EngineRequest request) {
  const model::LlamaConfig& config = backend_->config();
  absl::Status valid = ValidateGeneration(request.prompt, request.max_tokens,
                                          config.context_length, config.vocab_size,
                                          request.sampling);
  if (!valid.ok()) return valid;
  const bool exports = request.kv_export != nullptr;
  if (request.route == RouteChoice::kRemote && (loader_ == nullptr || exports)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "route_override REMOTE: the ", options_.worker_label,
        " has no KV receiver and cannot take a remote prefill"));
  }
  const int32_t prompt_len = static_cast<int32_t>(request.prompt.size());
  // The most KV this request can hold here: every token but the last sampled
  // one; a prefill-only request holds its prompt; a remote prefill reserves
  // token 0's slot too.
  // (Validated: prompt + max_tokens fits the context length, an int32.)
  int32_t kv_tokens =
      exports ? prompt_len : prompt_len + static_cast<int32_t>(request.max_tokens) - 1;
  if (!exports && loader_ != nullptr && request.route != RouteChoice::kLocal) {
    kv_tokens = std::max(kv_tokens, prompt_len + 1);
  }
  const int32_t block_size = backend_->kv_storage().shape().block_size;
  const int32_t blocks = kv::BlocksForTokens(kv_tokens, block_size);
  if (blocks > pool_.num_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request needs up to ", blocks, " KV blocks (", kv_tokens, " tokens) but the ",
        options_.worker_label, "'s pool has only ", pool_.num_blocks()));
  }
  auto r = std::make_unique<Request>();
  r->cancelled = std::make_shared<CancelFlag>(false);
  r->req = std::move(request);
  absl::MutexLock lock(&mu_);
  if (stop_requested_) {
    return absl::UnavailableError(absl::StrCat(options_.worker_label, " is shutting down"));
  }
  if (live_.count(r->req.request_id) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id ", r->req.request_id, " is already running"));
  }
  live_[r->req.request_id] = r->cancelled;
  stats_.running_requests = static_cast<uint32_t>(live_.size());
  inbox_new_.push_back(std::move(r));
  cv_.Signal();
  return absl::OkStatus();
}

void EngineCore::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(request_id);
  if (it == live_.end()) return;
  it->second->store(true);
  inbox_cancel_.push_back(request_id);
  cv_.Signal();
}

void EngineCore::Shutdown() {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
  for (auto& [id, flag] : live_) flag->store(true);
  cv_.Signal();
}

CoreStats EngineCore::GetStats() const {
  absl::MutexLock lock(&mu_);
  CoreStats stats = stats_;
  if (loader_ != nullptr) {
    stats.transfers_in_flight = loader_->loads_in_flight();
    stats.kv_bytes_received_total = loader_->bytes_received_total();
  } else {
    stats.transfers_in_flight = open_exports_;
  }
  return stats;
}

void EngineCore::UpdateKvStats() {
  stats_.kv_blocks_in_use = static_cast<uint32_t>(kv_.num_blocks_in_use());
  stats_.kv_blocks_cached = static_cast<uint32_t>(kv_.num_blocks_cached());
  stats_.prefix_cache = kv_.prefix_cache_stats();
}

void EngineCore::Loop() {
  bool pending = false;  // the last step changed something and work remains
  for (;;) {
    std::vector<std::unique_ptr<Request>> arrivals;
    std::vector<std::string> cancels;
    std::vector<RemoteDone> dones;
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_requested_ && inbox_new_.empty() && inbox_cancel_.empty() &&
             inbox_done_.empty() && !pending) {
        cv_.Wait(&mu_);
      }
      arrivals.swap(inbox_new_);
      cancels.swap(inbox_cancel_);
      dones.swap(inbox_done_);
      stopping = stop_requested_;
    }
    for (auto& r : arrivals) Arrive(std::move(r));
    for (RemoteDone& done : dones) HandleRemoteDone(std::move(done));
    for (const std::string& id : cancels) Abort(id, absl::CancelledError("request cancelled"));
    if (stopping) {
      std::vector<std::string> ids;
      for (const auto& [id, seq_id] : seq_ids_) ids.push_back(id);
      const absl::Status unavailable =
          absl::UnavailableError(absl::StrCat(options_.worker_label, " is shutting down"));
      for (const std::string& id : ids) Abort(id, unavailable);
      // Requests still loading end when their load quiesces (its done).
      if (requests_.empty()) return;
      absl::MutexLock lock(&mu_);
      if (inbox_done_.empty()) cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
      continue;
    }
    pending = Step() && scheduler_.HasWork();
  }
}

void EngineCore::Arrive(std::unique_ptr<Request> request) {
  Request& r = *request;
  r.seq_id = next_seq_id_++;
  seq_ids_[r.req.request_id] = r.seq_id;
  const bool exports = r.req.kv_export != nullptr;
  scheduler::SeqState s;
  s.id = r.seq_id;
  s.tokens = r.req.prompt;
  s.num_prompt_tokens = static_cast<int32_t>(r.req.prompt.size());
  s.route = exports ? RouteChoice::kLocal : r.req.route;
  // A prefill-only request's KV is already on the wire: never recompute it.
  s.preemptible = !exports;
  scheduler_.Add(std::move(s));
  const int64_t seq_id = r.seq_id;
  requests_.emplace(seq_id, std::move(request));
  if (!exports) return;
  if (r.cancelled->load()) {
    // Cancelled (or shutting down) before it got here: the Abort that
    // follows ends it; no handshake for nothing.
    r.export_error = absl::CancelledError("request cancelled");
    return;
  }
  absl::Status open = r.req.kv_export->Open(r.cancelled);
  if (!open.ok()) {
    Finish(seq_id, open, FinishReason::kNone);
    return;
  }
  r.export_open = true;
  absl::MutexLock lock(&mu_);
  ++open_exports_;
}

void EngineCore::StartRemoteLoad(const scheduler::RemoteKvStart& start) {
  Request& r = *requests_.at(start.id);
  const int64_t seq_id = start.id;
  absl::StatusOr<RemotePrefillTarget> target = loader_->StartLoad(
      r.req.request_id, start.hit_tokens, static_cast<int32_t>(r.req.prompt.size()),
      &backend_->kv_storage(), kv_.BlockTable(seq_id),
      [this, seq_id](absl::Status status, RemotePrefillResult result) {
        absl::MutexLock lock(&mu_);
        inbox_done_.push_back(RemoteDone{seq_id, std::move(status), std::move(result)});
        cv_.Signal();
      });
  if (!target.ok()) {
    Finish(seq_id, target.status(), FinishReason::kNone);
    return;
  }
  r.req.output->OnRemotePrefill(*target);
}

void EngineCore::HandleRemoteDone(RemoteDone done) {
  auto it = requests_.find(done.seq_id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  const scheduler::SeqState* s = scheduler_.Find(done.seq_id);
  if (s->status == SeqStatus::kAbortingRemoteKv) {
    Finish(done.seq_id, r.abort_status, FinishReason::kCancelled);
    return;
  }
  if (!done.status.ok()) {
    // conditional.on_prefill_failure: fail (DESIGN.md, failures).
    Finish(done.seq_id,
           absl::UnavailableError(
               absl::StrCat("remote prefill failed: ", done.status.ToString())),
           FinishReason::kNone);
    return;
  }
  const int32_t token = done.result.first_token.token_id;
  if (token < 0 || token >= backend_->config().vocab_size) {
    Finish(done.seq_id,
           absl::DataLossError(absl::StrCat("remote prefill returned token id ", token,
                                            " outside the vocabulary")),
           FinishReason::kNone);
    return;
  }
  // Token 0 was streamed by the router from the prefill worker's reply.
  r.num_generated = 1;
  scheduler_.FinishRemoteKv(done.seq_id, token);
  FinishReason reason = done.result.finish_reason;
  if (reason == FinishReason::kNone) {
    reason = CheckStop(stop_, token, r.num_generated, r.req.max_tokens,
                       static_cast<int32_t>(r.req.prompt.size()) + 1);
  }
  if (reason != FinishReason::kNone) Finish(done.seq_id, absl::OkStatus(), reason);
}

void EngineCore::Abort(const std::string& request_id, const absl::Status& status) {
  auto id = seq_ids_.find(request_id);
  if (id == seq_ids_.end()) return;
  const int64_t seq_id = id->second;
  const scheduler::SeqState* s = scheduler_.Find(seq_id);
  switch (s->status) {
    case SeqStatus::kWaitingForRemoteKv:
      // RECEIVING -> ABORTING: the blocks are freed once the load has
      // quiesced and its done arrives (HandleRemoteDone).
      scheduler_.AbortRemoteKv(seq_id);
      requests_.at(seq_id)->abort_status = status;
      loader_->CancelLoad(request_id);
      return;
    case SeqStatus::kAbortingRemoteKv:
      return;
    case SeqStatus::kWaiting:
    case SeqStatus::kRunning:
      Finish(seq_id, status, FinishReason::kCancelled);
      return;
  }
}

void EngineCore::Finish(int64_t seq_id, const absl::Status& status, FinishReason reason) {
  auto it = requests_.find(seq_id);
  if (it == requests_.end()) return;
  std::unique_ptr<Request> r = std::move(it->second);
  requests_.erase(it);
  seq_ids_.erase(r->req.request_id);
  scheduler_.Remove(seq_id);  // frees its blocks (full ones stay cached)
  uint64_t bytes_sent = 0;
  if (r->req.kv_export != nullptr) {
    r->req.kv_export->Close();
    bytes_sent = r->req.kv_export->bytes_sent();
  }
  {
    absl::MutexLock lock(&mu_);
    live_.erase(r->req.request_id);
    stats_.running_requests = static_cast<uint32_t>(live_.size());
    stats_.kv_bytes_sent_total += bytes_sent;
    if (r->export_open) --open_exports_;
    UpdateKvStats();
  }
  // The output hears last, so whoever reacts to OnFinish sees the blocks
  // freed in GetStats() and may reuse the request id.
  r->req.output->OnFinish(status, reason);
}

void EngineCore::ExportRows(Request& r, int32_t layer, int32_t from, int32_t to) {
  if (!r.export_error.ok() || from >= to) return;
  if (r.cancelled->load()) {
    r.export_error = absl::CancelledError("request cancelled");
    return;
  }
  kv::KvStorage& storage = backend_->kv_storage();
  const size_t n = static_cast<size_t>(to - from) * storage.row_bytes();
  k_rows_.resize(n);
  v_rows_.resize(n);
  storage.ReadTokens(kv_.BlockTable(r.seq_id), layer, from, to - from, k_rows_.data(),
                     v_rows_.data());
  r.export_error = r.req.kv_export->SendLayer(layer, from, to - from, k_rows_.data(),
                                              v_rows_.data());
}

bool EngineCore::Step() {
  const scheduler::StepPlan plan = scheduler_.Schedule();
  {
    absl::MutexLock lock(&mu_);
    stats_.preemptions_total += plan.preempted.size();
    UpdateKvStats();
  }
  for (const scheduler::RemoteKvStart& start : plan.remote_kv_starts) StartRemoteLoad(start);
  if (plan.chunks.empty()) return plan.progress();
  Execute(plan);
  UpdateFromOutput(plan);
  return true;
}

void EngineCore::Execute(const scheduler::StepPlan& plan) {
  const int32_t n_layers = backend_->config().n_layers;
  bool any_export = false;
  entries_.clear();
  entry_requests_.clear();
  for (const scheduler::ScheduledChunk& chunk : plan.chunks) {
    Request& r = *requests_.at(chunk.id);
    const scheduler::SeqState& s = *scheduler_.Find(chunk.id);
    if (r.req.kv_export != nullptr) {
      any_export = true;
      if (!r.cached_rows_sent) {
        // The first chunk starts at this worker's prefix hit: K/V of
        // [D_hit, hit) come from cached blocks (DESIGN.md, step 5).
        r.cached_rows_sent = true;
        for (int32_t layer = 0; layer < n_layers; ++layer) {
          ExportRows(r, layer, r.req.kv_export->first_token_to_send(), chunk.start);
        }
      }
    }
    backend::ForwardEntry entry;
    entry.tokens = std::span<const int32_t>(s.tokens.data() + chunk.start,
                                            static_cast<size_t>(chunk.count));
    entry.start_pos = chunk.start;
    entry.block_table = &kv_.BlockTable(chunk.id);
    entry.sampling = chunk.samples ? &r.req.sampling : nullptr;
    entries_.push_back(entry);
    entry_requests_.push_back(&r);
  }
  // Per-layer hook: ship [max(start, D_hit), end) of each exporting chunk
  // as soon as that layer is written.
  const backend::LayerHook hook = [this](size_t entry, int32_t layer, int32_t start,
                                         int32_t count) {
    Request& r = *entry_requests_[entry];
    if (r.req.kv_export == nullptr) return;
    ExportRows(r, layer, std::max(start, r.req.kv_export->first_token_to_send()),
               start + count);
  };
  backend_->Forward(entries_, any_export ? &hook : nullptr, &views_);
}

void EngineCore::UpdateFromOutput(const scheduler::StepPlan& plan) {
  struct Finished {
    int64_t seq_id;
    absl::Status status;
    FinishReason reason;
  };
  std::vector<int32_t> sampled;
  std::vector<Finished> finished;
  uint64_t prefill_tokens = 0;
  uint32_t num_decode = 0;
  size_t view = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const scheduler::ScheduledChunk& chunk = plan.chunks[i];
    Request& r = *entry_requests_[i];
    const scheduler::SeqState& s = *scheduler_.Find(chunk.id);
    if (chunk.start >= s.num_prompt_tokens && chunk.count == 1) {
      ++num_decode;
    } else {
      prefill_tokens += static_cast<uint64_t>(chunk.count);
    }
    if (!chunk.samples) {
      if (!r.export_error.ok()) {
        finished.push_back({chunk.id, r.export_error, FinishReason::kNone});
      }
      continue;
    }
    // A sequence recomputing after preemption reaches the end of its known
    // tokens again: its next output index continues where it stopped.
    const sampling::SampledToken t = sampling::SampleFromView(
        views_[view++], r.req.sampling, static_cast<uint32_t>(r.num_generated));
    sampled.push_back(t.token_id);
    const uint32_t prompt_computed =
        r.num_generated == 0
            ? static_cast<uint32_t>(s.num_prompt_tokens - s.num_cached_prompt_tokens)
            : 0;
    const uint32_t index = static_cast<uint32_t>(r.num_generated++);
    const FinishReason reason =
        CheckStop(stop_, t.token_id, r.num_generated, r.req.max_tokens,
                  static_cast<int32_t>(s.tokens.size()) + 1);
    if (r.req.kv_export != nullptr) {
      // Prefill-only: the request ends with token 0 here; kNone tells the
      // decode worker to go on.
      if (r.export_error.ok()) r.export_error = r.req.kv_export->Finish(t, reason);
      if (!r.export_error.ok()) {
        finished.push_back({chunk.id, r.export_error, FinishReason::kNone});
        continue;
      }
      r.req.output->OnToken(index, t, prompt_computed);
      finished.push_back({chunk.id, absl::OkStatus(), reason});
      continue;
    }
    r.req.output->OnToken(index, t, prompt_computed);
    if (reason != FinishReason::kNone) {
      finished.push_back({chunk.id, absl::OkStatus(), reason});
    }
  }
  scheduler_.OnStepDone(plan, sampled);  // publishes completed blocks
  {
    absl::MutexLock lock(&mu_);
    stats_.prefill_tokens_computed_total += prefill_tokens;
    stats_.decode_tokens_total += num_decode;
    stats_.max_decode_batch_size = std::max(stats_.max_decode_batch_size, num_decode);
  }
  for (const Finished& f : finished) Finish(f.seq_id, f.status, f.reason);
}

}  // namespace tandem::core
