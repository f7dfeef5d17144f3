#include "engine/core/engine_core.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/core/engine_core_request.h"
#include "engine/core/request_validation.h"
#include "engine/kv/device_kv.h"

namespace tandem::core {
namespace {

using scheduler::SeqStatus;

std::vector<int32_t> SortedUnique(std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// The scheduler's options as the core runs them: remote prefill iff a
// loader was given, and the K+V bytes per token of `storage`.
scheduler::SchedulerOptions WithLoader(scheduler::SchedulerOptions options, bool loader,
                                       const kv::KvStorage& storage) {
  options.remote_prefill_available = loader;
  options.kv_bytes_per_token =
      2 * static_cast<int64_t>(storage.row_bytes()) * storage.shape().n_layers;
  return options;
}

}  // namespace

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
                                            backend_->kv_storage().shape().block_size,
                                            /*record_events=*/options.kv_event_sink != nullptr}),
      scheduler_(WithLoader(options.scheduler, loader_ != nullptr, backend_->kv_storage()), &kv_,
                 &step_model_) {
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
  absl::Status valid = ValidateGeneration(request.prompt, request.max_tokens, config.context_length,
                                          config.vocab_size, request.sampling);
  if (valid.ok()) {
    const GenerationControls& c = request.controls;
    valid = ValidateControls(c.n, c.min_tokens, request.max_tokens, c.stop_token_ids,
                             config.vocab_size);
  }
  if (valid.ok()) {
    valid = ValidateMigratedSamples(request.migrated_samples, request.generated, request.controls.n,
                                    request.max_tokens, config.vocab_size);
  }
  if (valid.ok()) {
    valid = ValidateGenerated(request.generated, request.controls.n, request.max_tokens,
                              config.vocab_size);
  }
  if (!valid.ok()) return valid;
  const bool exports = request.kv_export != nullptr;
  if (!request.generated.empty() || !request.migrated_samples.empty()) {
    // A migrated request continues from tokens only this worker can
    // recompute (a prefill worker samples output index 0 only).
    if (request.route == RouteChoice::kRemote || exports) {
      return absl::FailedPreconditionError(
          "generated_token_ids: a migrated request is prefilled on the decode worker; "
          "route_override REMOTE cannot continue it");
    }
    request.route = RouteChoice::kLocal;
  }
  if (request.route == RouteChoice::kRemote && (loader_ == nullptr || exports)) {
    return absl::FailedPreconditionError(
        absl::StrCat("route_override REMOTE: the ", options_.worker_label,
                     " has no KV receiver and cannot take a remote prefill"));
  }
  const int32_t prompt_len = static_cast<int32_t>(request.prompt.size());
  // The most KV this request can hold here: every token but the last sampled
  // one; a prefill-only request holds its prompt; a remote prefill reserves
  // token 0's slot too. Samples 1.. share the full prompt blocks and hold
  // the rest of their tokens each.
  // (Validated: prompt + max_tokens fits the context length, an int32.)
  int32_t kv_tokens =
      exports ? prompt_len : prompt_len + static_cast<int32_t>(request.max_tokens) - 1;
  if (!exports && loader_ != nullptr && request.route != RouteChoice::kLocal) {
    kv_tokens = std::max(kv_tokens, prompt_len + 1);
  }
  const int32_t block_size = backend_->kv_storage().shape().block_size;
  int64_t blocks = kv::BlocksForTokens(kv_tokens, block_size);
  if (!exports && request.controls.n > 1) {
    const int32_t shared = prompt_len / block_size;
    blocks = shared + request.controls.n * static_cast<int64_t>(kv::BlocksForTokens(
                                               kv_tokens - shared * block_size, block_size));
  }
  if (blocks > pool_.num_blocks()) {
    const std::string samples =
        request.controls.n > 1 ? absl::StrCat(" x ", request.controls.n, " samples") : "";
    return absl::ResourceExhaustedError(
        absl::StrCat("request needs up to ", blocks, " KV blocks (", kv_tokens, " tokens", samples,
                     ") but the ", options_.worker_label, "'s pool has only ", pool_.num_blocks()));
  }
  auto r = std::make_unique<Request>();
  r->clock.submitted = std::chrono::steady_clock::now();
  r->cancelled = std::make_shared<CancelFlag>(false);
  r->req = std::move(request);
  r->req.controls.stop_token_ids = SortedUnique(std::move(r->req.controls.stop_token_ids));
  const size_t n = static_cast<size_t>(r->req.controls.n);
  sampling::SamplingOptions options = r->req.sampling;
  options.min_tokens = static_cast<int32_t>(r->req.controls.min_tokens);
  options.min_tokens_masked_ids =
      MinTokensMaskedIds(stop_, r->req.controls.stop_token_ids, r->req.controls.ignore_eos);
  for (size_t s = 0; s < n; ++s) {
    r->sampling.push_back(options);
    r->sampling.back().seed = sampling::SampleSeed(options.seed, static_cast<uint32_t>(s));
  }
  r->seq_ids.assign(n, 0);
  r->sample_done.assign(n, false);
  r->cancel_requested.assign(n, false);
  r->samples_left = static_cast<int32_t>(n);
  if (exports) {
    if (absl::Status open = OpenExport(*r); !open.ok()) return open;
  }
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (!device_lost_.ok()) {
      refused = device_lost_;
    } else if (stop_requested_) {
      refused = absl::UnavailableError(absl::StrCat(options_.worker_label, " is shutting down"));
    } else if (live_.count(r->req.request_id) != 0) {
      refused = absl::AlreadyExistsError(
          absl::StrCat("request_id ", r->req.request_id, " is already running"));
    } else {
      if (r->export_state.has_value()) ++open_exports_;
      live_[r->req.request_id] = r->cancelled;
      stats_.running_requests = static_cast<uint32_t>(live_.size());
      stats_.prompt_tokens_total += r->req.prompt.size();
      inbox_new_.push_back(std::move(r));
      cv_.Signal();
      return absl::OkStatus();
    }
  }
  // Outside mu_: the export's queue calls its wake (which takes mu_) with
  // its own lock held.
  if (r->export_state.has_value()) r->req.kv_export->Close();
  return refused;
}

void EngineCore::Cancel(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(request_id);
  if (it == live_.end()) return;
  it->second->store(true);
  inbox_cancel_.push_back(request_id);
  cv_.Signal();
}

void EngineCore::CancelSample(const std::string& request_id, uint32_t sample_index) {
  absl::MutexLock lock(&mu_);
  if (live_.count(request_id) == 0) return;
  inbox_cancel_sample_.emplace_back(request_id, sample_index);
  cv_.Signal();
}

void EngineCore::AbortRemotePrefill(const std::string& request_id, uint32_t attempt,
                                    const std::string& reason, bool no_prefill_worker) {
  absl::MutexLock lock(&mu_);
  if (live_.count(request_id) == 0) return;
  inbox_abort_.push_back(RemoteAbort{request_id, attempt, reason, no_prefill_worker});
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
  // Submitted but not yet seen by the loop: waiting, every prompt token queued.
  stats.waiting_requests += static_cast<uint32_t>(inbox_new_.size());
  for (const std::unique_ptr<Request>& r : inbox_new_) {
    stats.queued_prefill_tokens += r->req.prompt.size();
  }
  return stats;
}

void EngineCore::UpdateKvStats() {
  stats_.kv_blocks_in_use = static_cast<uint32_t>(kv_.num_blocks_in_use());
  stats_.kv_blocks_cached = static_cast<uint32_t>(kv_.num_blocks_cached());
  stats_.prefix_cache = kv_.prefix_cache_stats();
  stats_.prompt_tokens_cached_total = scheduler_.cached_prompt_tokens_total();
  // Queue gauges (loop thread: requests_ and the scheduler are its own).
  uint32_t waiting = 0;
  uint64_t queued_tokens = 0;
  auto prompt_left = [](const scheduler::SeqState& s) -> uint64_t {
    return s.num_computed < s.num_prompt_tokens
               ? static_cast<uint64_t>(s.num_prompt_tokens - s.num_computed)
               : 0;
  };
  for (const auto& [id, r] : requests_) {
    if (r->export_state.has_value() && r->export_state->phase == ExportPhase::kWaitingForRoom) {
      ++waiting;  // a prefill-only request waiting for room
      queued_tokens += prompt_left(r->export_state->unscheduled);
      continue;
    }
    bool is_waiting = false;
    for (int64_t seq_id : r->seq_ids) {
      const scheduler::SeqState* s = seq_id == 0 ? nullptr : scheduler_.Find(seq_id);
      if (s == nullptr) continue;
      if (s->status == scheduler::SeqStatus::kWaiting) is_waiting = true;
      if (s->status == scheduler::SeqStatus::kWaiting ||
          s->status == scheduler::SeqStatus::kRunning) {
        queued_tokens += prompt_left(*s);
      }
    }
    if (is_waiting) ++waiting;
  }
  stats_.waiting_requests = waiting;
  stats_.queued_prefill_tokens = queued_tokens;
}

void EngineCore::Loop() {
  if (options_.warmup) WarmUp();
  bool pending = false;  // the last step changed something and work remains
  for (;;) {
    std::vector<std::unique_ptr<Request>> arrivals;
    std::vector<std::string> cancels;
    std::vector<std::pair<std::string, uint32_t>> sample_cancels;
    std::vector<RemoteDone> dones;
    std::vector<RemoteAbort> aborts;
    bool stopping;
    absl::Status lost;  // not OK: the device is lost
    {
      absl::MutexLock lock(&mu_);
      while (!stop_requested_ && inbox_new_.empty() && inbox_cancel_.empty() &&
             inbox_cancel_sample_.empty() && inbox_done_.empty() && inbox_abort_.empty() &&
             !export_wake_ && !pending) {
        // A device data path (KvDataSender::Poll) has no wake of its own:
        // while one still holds a draining request's blocks, look again
        // every millisecond.
        if (device_drain_pending_) {
          cv_.WaitWithTimeout(&mu_, absl::Milliseconds(1));
          break;
        }
        cv_.Wait(&mu_);
      }
      export_wake_ = false;
      arrivals.swap(inbox_new_);
      cancels.swap(inbox_cancel_);
      sample_cancels.swap(inbox_cancel_sample_);
      dones.swap(inbox_done_);
      aborts.swap(inbox_abort_);
      stopping = stop_requested_;
      lost = device_lost_;
    }
    for (auto& r : arrivals) Arrive(std::move(r));
    for (RemoteDone& done : dones) HandleRemoteDone(std::move(done));
    for (const RemoteAbort& abort : aborts) HandleRemoteAbort(abort);
    for (const std::string& id : cancels) Abort(id, absl::CancelledError("request cancelled"));
    for (const auto& [id, sample] : sample_cancels) AbortSample(id, sample);
    if (stopping) {
      std::vector<std::string> ids;
      for (const auto& [id, request] : requests_) ids.push_back(id);
      const absl::Status unavailable =
          lost.ok()
              ? absl::UnavailableError(absl::StrCat(options_.worker_label, " is shutting down"))
              : lost;
      for (const std::string& id : ids) Abort(id, unavailable);
      // Requests still loading end when their load quiesces (its done).
      if (requests_.empty()) {
        // Every request has heard; now the worker may exit.
        if (!lost.ok() && options_.on_device_lost) options_.on_device_lost(lost);
        return;
      }
      absl::MutexLock lock(&mu_);
      if (inbox_done_.empty()) cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
      continue;
    }
    pending = Step() && scheduler_.HasWork();
    // After the inbox and the step: publishes (remote KV arrivals, step
    // commits) and evictions (allocations) of this iteration, in order.
    PublishKvEvents();
  }
}

void EngineCore::PublishKvEvents() {
  if (!options_.kv_event_sink) return;
  std::vector<kv::KvCacheEvent> events = kv_.TakeEvents();
  if (!events.empty()) options_.kv_event_sink(std::move(events));
}

void EngineCore::ArriveMigratedSamples(std::unique_ptr<Request> request) {
  Request& r = *request;
  r.independent_samples = true;
  const std::string id = r.req.request_id;
  std::vector<scheduler::SeqState> sequences;
  for (size_t k = 0; k < r.req.migrated_samples.size(); ++k) {
    const EngineRequest::MigratedSample& m = r.req.migrated_samples[k];
    if (m.finished) {  // ended before the migration: the router has it all
      r.sample_done[k] = true;
      --r.samples_left;
      continue;
    }
    const int64_t seq_id = next_seq_id_++;
    r.seq_ids[k] = seq_id;
    samples_[seq_id] =
        Sample{&r, static_cast<uint32_t>(k), static_cast<int32_t>(m.generated.size())};
    scheduler::SeqState& s = sequences.emplace_back();
    s.id = seq_id;
    s.tokens = r.req.prompt;
    s.tokens.insert(s.tokens.end(), m.generated.begin(), m.generated.end());
    s.num_prompt_tokens = static_cast<int32_t>(r.req.prompt.size());
    s.route = RouteChoice::kLocal;
    s.preemptible = true;
  }
  requests_.emplace(id, std::move(request));
  for (scheduler::SeqState& s : sequences) scheduler_.Add(std::move(s));
}

void EngineCore::Arrive(std::unique_ptr<Request> request) {
  if (!request->req.migrated_samples.empty()) {
    ArriveMigratedSamples(std::move(request));
    return;
  }
  Request& r = *request;
  const int64_t seq_id = next_seq_id_++;
  r.seq_ids[0] = seq_id;
  samples_[seq_id] = Sample{&r, 0, 0};
  const bool exports = r.req.kv_export != nullptr;
  samples_[seq_id].num_generated = static_cast<int32_t>(r.req.generated.size());
  scheduler::SeqState s;
  s.id = seq_id;
  s.tokens = r.req.prompt;
  // A migrated request recomputes its generated tokens like a preempted
  // sequence: its next output index is k.
  s.tokens.insert(s.tokens.end(), r.req.generated.begin(), r.req.generated.end());
  s.num_prompt_tokens = static_cast<int32_t>(r.req.prompt.size());
  s.route = exports ? RouteChoice::kLocal : r.req.route;
  // A prefill-only request's KV is already on the wire: never recompute it.
  s.preemptible = !exports;
  s.remote_estimate = r.req.remote_estimate;
  const std::string id = r.req.request_id;
  requests_.emplace(id, std::move(request));
  if (!exports) {
    // Placement happens in Add; a prefill-only request's queue counts
    // from Submit (RequestPhases::prefill_queue_ms).
    r.clock.placed = std::chrono::steady_clock::now();
    scheduler_.Add(std::move(s));
    r.placement = scheduler_.Find(seq_id)->placement;
    return;
  }
  ArriveExporting(r, std::move(s));
}

void EngineCore::StartSamples(Request& r, int64_t parent, const std::vector<SampleStart>& starts,
                              std::vector<Ending>* endings) {
  const std::string& id = r.req.request_id;
  for (size_t s = 0; s < starts.size(); ++s) {
    const uint32_t index = static_cast<uint32_t>(s);
    FinishReason reason = starts[s].finish_reason;
    if (r.cancel_requested[s]) reason = FinishReason::kCancelled;
    if (reason != FinishReason::kNone) {
      endings->push_back(Ending{id, index, reason, absl::OkStatus()});
      continue;
    }
    if (s == 0) continue;  // the parent itself
    const int64_t seq_id = next_seq_id_++;
    scheduler_.Fork(parent, seq_id, starts[s].token.token_id);
    r.seq_ids[s] = seq_id;
    samples_[seq_id] = Sample{&r, index, 1};
  }
}

void EngineCore::Abort(const std::string& request_id, const absl::Status& status) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  const int64_t seq0 = r.seq_ids[0];
  const scheduler::SeqState* s = seq0 == 0 ? nullptr : scheduler_.Find(seq0);
  if (s != nullptr && s->status == SeqStatus::kWaitingForRemoteKv) {
    // RECEIVING -> ABORTING: the blocks are freed once the load has
    // quiesced and its done arrives (HandleRemoteDone).
    scheduler_.AbortRemoteKv(seq0);
    r.remote_load->abort_status = status;
    loader_->CancelLoad(request_id);
    return;
  }
  if (s != nullptr && s->status == SeqStatus::kAbortingRemoteKv) return;
  EndRequest(request_id, status);
}

void EngineCore::AbortSample(const std::string& request_id, uint32_t sample_index) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  if (sample_index >= r.sampling.size() || r.sample_done[sample_index]) return;
  const int64_t seq_id = r.seq_ids[sample_index];
  if (!r.independent_samples && (seq_id == 0 || samples_.at(seq_id).num_generated == 0)) {
    r.cancel_requested[sample_index] = true;  // ends once its token 0 is drawn
    return;
  }
  FinishSample(request_id, sample_index, FinishReason::kCancelled);
}

void EngineCore::FinishSample(const std::string& request_id, uint32_t sample_index,
                              FinishReason reason) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  if (r.sample_done[sample_index]) return;
  r.sample_done[sample_index] = true;
  if (--r.samples_left == 0) {
    const Ending last{request_id, sample_index, reason, absl::OkStatus()};
    EndRequest(request_id, absl::OkStatus(), &last);
    return;
  }
  int64_t& seq_id = r.seq_ids[sample_index];
  // A prefill-only request keeps its one sequence (sample 0's) until the
  // request ends: its blocks stay pinned while the transfer drains.
  if (seq_id != 0 && r.req.kv_export == nullptr) {
    scheduler_.Remove(seq_id);  // frees its blocks (shared ones stay with the others)
    samples_.erase(seq_id);
    seq_id = 0;
  }
  {
    absl::MutexLock lock(&mu_);
    UpdateKvStats();
  }
  r.req.output->OnSampleFinish(sample_index, reason);
}

void EngineCore::EndRequest(const std::string& request_id, const absl::Status& status,
                            const Ending* last) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  const std::optional<ExportState>& e = it->second->export_state;
  if (status.ok() && e.has_value() && e->phase != ExportPhase::kDone) {
    StartDraining(*it->second, last);
    return;
  }
  std::unique_ptr<Request> r = std::move(it->second);
  requests_.erase(it);
  for (int64_t seq_id : r->seq_ids) {
    if (seq_id == 0) continue;
    scheduler_.Remove(seq_id);  // frees its blocks (full ones stay cached)
    samples_.erase(seq_id);
  }
  if (r->export_state.has_value() && !r->export_state->pinned.empty()) {
    kv_.Unpin(r->export_state->pinned);
  }
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
    if (r->export_state.has_value()) {
      --open_exports_;
      ++stats_.kv_transfers_sent_total;
      stats_.kv_transfer_seconds_sent_total +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - r->export_state->opened)
              .count();
    }
    UpdateKvStats();
  }
  // The output hears last, so whoever reacts to OnFinish sees the blocks
  // freed in GetStats() and may reuse the request id.
  if (last != nullptr) r->req.output->OnSampleFinish(last->sample_index, last->reason);
  r->req.output->OnFinish(status);
}

bool EngineCore::Step() {
  const std::chrono::steady_clock::time_point step_start = std::chrono::steady_clock::now();
  step_start_ = step_start;
  const std::set<int64_t> held = PollExports();
  const scheduler::StepPlan plan = scheduler_.Schedule(held);
  {
    absl::MutexLock lock(&mu_);
    stats_.preemptions_total += plan.preempted.size();
    UpdateKvStats();
  }
  for (const scheduler::RemoteKvStart& start : plan.remote_kv_starts) StartRemoteLoad(start);
  if (plan.chunks.empty()) return plan.progress();
  if (absl::Status forward = Execute(plan); !forward.ok()) {
    FailStep(plan, forward);
    return true;
  }
  UpdateFromOutput(plan, step_start);
  return true;
}

void EngineCore::FailStep(const scheduler::StepPlan& plan, const absl::Status& error) {
  {
    absl::MutexLock lock(&mu_);
    ++stats_.forward_errors_total;
  }
  if (backend_->device_lost()) {
    LoseDevice(error);
    return;
  }
  // The step's K/V writes are garbage but never published (OnStepDone is
  // not called): freeing the sequences returns their blocks as they were.
  std::vector<std::string> ids;
  for (const scheduler::ScheduledChunk& chunk : plan.chunks) {
    const std::string& id = samples_.at(chunk.id).request->req.request_id;
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  const absl::Status status(
      error.code(),
      absl::StrCat(options_.worker_label, ": device error in a forward step: ", error.message()));
  if (options_.log) {
    options_.log(absl::StrCat("forward step failed (", error.ToString(), "): failing ", ids.size(),
                              " request(s): ", absl::StrJoin(ids, ", ")));
  }
  // A prefill-only request's export is closed (its receiver sees the
  // transfer fail), as when its send fails.
  for (const std::string& id : ids) EndRequest(id, status);
}

void EngineCore::LoseDevice(const absl::Status& error) {
  const absl::Status lost = absl::UnavailableError(
      absl::StrCat("device lost: ", options_.worker_label, ": ", error.message()));
  if (options_.log) {
    options_.log(absl::StrCat("device lost (", error.ToString(),
                              "): failing every request and refusing new ones"));
  }
  absl::MutexLock lock(&mu_);
  device_lost_ = lost;
  stats_.device_lost = true;
  stop_requested_ = true;  // the loop ends every request (Loop's stopping path)
  for (auto& [id, flag] : live_) flag->store(true);
}

absl::Status EngineCore::Execute(const scheduler::StepPlan& plan) {
  bool any_export = false;
  entries_.clear();
  entry_samples_.clear();
  for (const scheduler::ScheduledChunk& chunk : plan.chunks) {
    Sample& sample = samples_.at(chunk.id);
    Request& r = *sample.request;
    const scheduler::SeqState& s = *scheduler_.Find(chunk.id);
    NoteFirstDecode(r, chunk, s);
    NoteFirstChunk(r, chunk, s);
    if (r.req.kv_export != nullptr) {
      any_export = true;
      ExportCachedRows(r, chunk);
    }
    backend::ForwardEntry entry;
    entry.tokens =
        std::span<const int32_t>(s.tokens.data() + chunk.start, static_cast<size_t>(chunk.count));
    entry.start_pos = chunk.start;
    entry.block_table = &kv_.BlockTable(chunk.id);
    if (chunk.samples) {
      entry.sampling = &r.sampling[sample.index];
      const std::span<const int32_t> tokens(s.tokens);
      entry.history.prompt = tokens.first(static_cast<size_t>(s.num_prompt_tokens));
      entry.history.generated = tokens.subspan(static_cast<size_t>(s.num_prompt_tokens));
    }
    entries_.push_back(entry);
    entry_samples_.push_back(&sample);
  }
  // Per-layer hook: ship [max(start, D_hit), end) of each exporting chunk
  // as soon as that layer is written.
  const backend::LayerHook hook = [this, &plan](size_t entry, int32_t layer, int32_t start,
                                                int32_t count) {
    Request& r = *entry_samples_[entry]->request;
    if (r.req.kv_export == nullptr) return;
    ExportRows(r, plan.chunks[entry].id, layer,
               std::max(start, r.req.kv_export->first_token_to_send()), start + count);
  };
  return backend_->Forward(entries_, any_export ? &hook : nullptr, &views_);
}

std::vector<SampleStart> EngineCore::DrawFirstTokens(Request& r, const sampling::SamplingView& view,
                                                     uint32_t prompt_computed, bool stream) {
  // Every sample's token 0 comes from sample 0's view: the processed row
  // depends on the prompt only, and the draw on the sample's seed.
  const int32_t sequence_tokens = static_cast<int32_t>(r.req.prompt.size()) + 1;
  std::vector<SampleStart> starts(r.sampling.size());
  for (size_t s = 0; s < starts.size(); ++s) {
    starts[s].token = sampling::SampleFromView(view, r.sampling[s], 0);
    starts[s].finish_reason =
        CheckStop(stop_, r.stops(), starts[s].token.token_id, 1, sequence_tokens);
  }
  if (stream) {
    for (size_t s = 0; s < starts.size(); ++s) {
      r.req.output->OnToken(static_cast<uint32_t>(s), 0, starts[s].token,
                            s == 0 ? prompt_computed : 0);
    }
  }
  return starts;
}

void EngineCore::UpdateFromOutput(const scheduler::StepPlan& plan,
                                  std::chrono::steady_clock::time_point step_start) {
  struct Fork {
    std::string request_id;
    int64_t parent;
    std::vector<SampleStart> starts;
  };
  std::vector<int32_t> sampled;
  std::vector<Ending> endings;
  std::vector<Fork> forks;
  uint64_t prefill_tokens = 0;
  uint64_t generated = 0;  // tokens drawn this step, every sample
  uint32_t num_decode = 0;
  size_t view = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const scheduler::ScheduledChunk& chunk = plan.chunks[i];
    Sample& sample = *entry_samples_[i];
    Request& r = *sample.request;
    const std::string& id = r.req.request_id;
    const scheduler::SeqState& s = *scheduler_.Find(chunk.id);
    if (chunk.start >= s.num_prompt_tokens && chunk.count == 1) {
      ++num_decode;
    } else {
      prefill_tokens += static_cast<uint64_t>(chunk.count);
    }
    if (chunk.samples && sample.index == 0) ReportPhases(r);
    if (!chunk.samples) {
      if (r.export_failed()) {
        endings.push_back({id, 0, FinishReason::kNone, r.export_state->error});
      }
      continue;
    }
    const sampling::SamplingView& row = views_[view++];
    const uint32_t prompt_computed =
        sample.num_generated == 0
            ? static_cast<uint32_t>(s.num_prompt_tokens - s.num_cached_prompt_tokens)
            : 0;
    if (r.req.kv_export != nullptr) {
      FinishExport(r, row, prompt_computed, &sampled, &generated, &endings);
      continue;
    }
    if (sample.num_generated == 0 && r.sampling.size() > 1 && !r.independent_samples) {
      // Sample 0's token 0 of an n > 1 request: draw all n, fork after
      // the step (the parent's prompt is then computed).
      std::vector<SampleStart> starts = DrawFirstTokens(r, row, prompt_computed, true);
      generated += starts.size();
      sampled.push_back(starts[0].token.token_id);
      sample.num_generated = 1;
      forks.push_back(Fork{id, chunk.id, std::move(starts)});
      continue;
    }
    // A sequence recomputing after preemption reaches the end of its known
    // tokens again: its next output index continues where it stopped.
    const uint32_t index = static_cast<uint32_t>(sample.num_generated++);
    const sampling::SampledToken t = sampling::SampleFromView(row, r.sampling[sample.index], index);
    sampled.push_back(t.token_id);
    ++generated;
    r.req.output->OnToken(sample.index, index, t, prompt_computed);
    const FinishReason reason = CheckStop(stop_, r.stops(), t.token_id, sample.num_generated,
                                          static_cast<int32_t>(s.tokens.size()) + 1);
    if (reason != FinishReason::kNone) {
      endings.push_back({id, sample.index, reason, absl::OkStatus()});
    }
  }
  scheduler_.OnStepDone(plan, sampled);  // publishes completed blocks
  {
    absl::MutexLock lock(&mu_);
    stats_.prefill_tokens_computed_total += prefill_tokens;
    stats_.decode_tokens_total += num_decode;
    stats_.generation_tokens_total += generated;
    stats_.max_decode_batch_size = std::max(stats_.max_decode_batch_size, num_decode);
    ++stats_.engine_steps_total;
  }
  // The step is counted before any of its requests ends: whoever sees a
  // request finish sees its steps in GetStats() (and the histogram).
  ObserveStep(plan, step_start);
  for (const Fork& f : forks) {
    auto it = requests_.find(f.request_id);
    if (it != requests_.end()) StartSamples(*it->second, f.parent, f.starts, &endings);
  }
  for (const Ending& e : endings) {
    if (e.status.ok()) {
      FinishSample(e.request_id, e.sample_index, e.reason);
    } else {
      EndRequest(e.request_id, e.status);
    }
  }
}

}  // namespace tandem::core
