// D's side of the engine core: a remote prefill's load (RemoteKvLoader)
// for a sequence in WAITING_FOR_REMOTE_KV: each attempt's start and
// NeedRemotePrefill (RequestOutput::OnRemotePrefill with the loader's
// KvTarget), the router's AbortRemotePrefill, the load's done, the
// failover of a failed attempt (conditional.on_prefill_failure: retry,
// local, fail) and the first decode step's timing.
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/engine_core.h"
#include "engine/core/engine_core_request.h"

namespace tandem::core {

using scheduler::SeqStatus;

void EngineCore::StartRemoteLoad(const scheduler::RemoteKvStart& start) {
  Request& r = *samples_.at(start.id).request;
  if (!r.remote_load.has_value()) r.remote_load.emplace();
  r.remote_load->attempt = 0;
  StartLoadAttempt(r, start.id, start.hit_tokens);
}

void EngineCore::StartLoadAttempt(Request& r, int64_t seq_id, int32_t hit_tokens) {
  const uint32_t attempt = ++r.remote_load->attempt;
  r.clock.load_started = std::chrono::steady_clock::now();
  absl::StatusOr<KvTarget> target = loader_->StartLoad(
      r.req.request_id, attempt, hit_tokens, static_cast<int32_t>(r.req.prompt.size()),
      &backend_->kv_storage(), kv_.BlockTable(seq_id),
      [this, seq_id, started = std::chrono::steady_clock::now()](absl::Status status,
                                                                 RemotePrefillResult result) {
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        absl::MutexLock lock(&mu_);
        ++stats_.kv_transfers_received_total;
        stats_.kv_transfer_seconds_received_total += seconds;
        inbox_done_.push_back(RemoteDone{seq_id, std::move(status), std::move(result),
                                         std::chrono::steady_clock::now()});
        cv_.Signal();
      });
  if (!target.ok()) {
    EndRequest(r.req.request_id, target.status());
    return;
  }
  r.req.output->OnRemotePrefill(*target);
}

void EngineCore::HandleRemoteAbort(const RemoteAbort& abort) {
  auto it = requests_.find(abort.request_id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  const int64_t seq0 = r.seq_ids[0];
  const scheduler::SeqState* s = seq0 == 0 ? nullptr : scheduler_.Find(seq0);
  if (s == nullptr || s->status != SeqStatus::kWaitingForRemoteKv ||
      r.remote_load->attempt != abort.attempt || r.remote_load->router_abort.has_value()) {
    return;  // not (or no longer) waiting for that attempt
  }
  r.remote_load->router_abort = abort;
  loader_->CancelLoad(abort.request_id);  // its done brings the failover
}

void EngineCore::FailOver(Request& r, int64_t seq_id, const std::string& cause,
                          bool no_prefill_worker) {
  const std::string id = r.req.request_id;
  const uint32_t attempt = r.remote_load->attempt;
  const bool remote_only = r.req.route == RouteChoice::kRemote;
  PrefillFailurePolicy policy = options_.on_prefill_failure;
  if (no_prefill_worker) policy = PrefillFailurePolicy::kLocal;
  std::string why;
  if (policy == PrefillFailurePolicy::kLocal && remote_only) {
    policy = PrefillFailurePolicy::kFail;
    why = "; route_override REMOTE forbids a local prefill";
  }
  if (policy == PrefillFailurePolicy::kRetry &&
      attempt >= static_cast<uint32_t>(options_.max_prefill_attempts)) {
    // Retries exhausted: a request that may be prefilled here still is
    // (the prompt is not lost for want of a prefill worker).
    policy = remote_only ? PrefillFailurePolicy::kFail : PrefillFailurePolicy::kLocal;
    why = absl::StrCat("; kv.max_prefill_attempts (", options_.max_prefill_attempts, ") reached",
                       remote_only ? "; route_override REMOTE forbids a local prefill" : "");
  }
  const std::string event =
      absl::StrCat("request ", id, ": remote prefill attempt ", attempt, " failed: ", cause);
  switch (policy) {
    case PrefillFailurePolicy::kRetry:
      if (options_.log) options_.log(absl::StrCat(event, "; retrying (attempt ", attempt + 1, ")"));
      StartLoadAttempt(r, seq_id, scheduler_.Find(seq_id)->num_computed);
      return;
    case PrefillFailurePolicy::kLocal:
      if (options_.log) options_.log(absl::StrCat(event, why, "; prefilling on this worker"));
      scheduler_.RemoteKvToLocal(seq_id);
      return;
    case PrefillFailurePolicy::kFail:
      if (options_.log) options_.log(absl::StrCat(event, "; failing the request", why));
      EndRequest(id, absl::UnavailableError(absl::StrCat("remote prefill failed (attempt ", attempt,
                                                         "): ", cause, why)));
      return;
  }
}

void EngineCore::HandleRemoteDone(RemoteDone done) {
  auto it = samples_.find(done.seq_id);
  if (it == samples_.end()) return;
  Sample& sample = it->second;
  Request& r = *sample.request;
  const std::string id = r.req.request_id;
  const scheduler::SeqState* s = scheduler_.Find(done.seq_id);
  RemoteLoadState& load = *r.remote_load;
  if (s->status == SeqStatus::kAbortingRemoteKv) {
    EndRequest(id, load.abort_status);
    return;
  }
  const std::optional<RemoteAbort> router_abort = std::move(load.router_abort);
  load.router_abort.reset();
  if (!done.status.ok()) {
    // conditional.on_prefill_failure (DESIGN.md, failures). The router's
    // reason is the cause when it cut the wait short.
    FailOver(r, done.seq_id,
             router_abort.has_value() ? router_abort->reason : done.status.ToString(),
             router_abort.has_value() && router_abort->no_prefill_worker);
    return;
  }
  std::vector<SampleStart>& starts = done.result.samples;
  if (starts.size() != r.sampling.size()) {
    EndRequest(id, absl::DataLossError(absl::StrCat("remote prefill returned ", starts.size(),
                                                    " first tokens for n = ", r.sampling.size())));
    return;
  }
  const int32_t sequence_tokens = static_cast<int32_t>(r.req.prompt.size()) + 1;
  for (SampleStart& start : starts) {
    const int32_t token = start.token.token_id;
    if (token < 0 || token >= backend_->config().vocab_size) {
      EndRequest(id, absl::DataLossError(absl::StrCat("remote prefill returned token id ", token,
                                                      " outside the vocabulary")));
      return;
    }
    if (start.finish_reason == FinishReason::kNone) {
      start.finish_reason = CheckStop(stop_, r.stops(), token, 1, sequence_tokens);
    }
  }
  // Token 0 of every sample was streamed by the router from the prefill
  // worker's reply.
  sample.num_generated = 1;
  load.load_done_at = done.done_at;
  r.clock.load_done = done.done_at;
  ObserveTransfer(r, done.result);
  scheduler_.FinishRemoteKv(done.seq_id, starts[0].token.token_id);
  std::vector<Ending> endings;
  StartSamples(r, done.seq_id, starts, &endings);
  for (const Ending& e : endings) FinishSample(e.request_id, e.sample_index, e.reason);
}

void EngineCore::NoteFirstDecode(Request& r, const scheduler::ScheduledChunk& chunk,
                                 const scheduler::SeqState& s) {
  if (!r.remote_load.has_value() || !r.remote_load->load_done_at.has_value() ||
      chunk.start < s.num_prompt_tokens) {
    return;
  }
  // A remote prefill's first decode step.
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - *r.remote_load->load_done_at)
          .count();
  r.remote_load->load_done_at.reset();
  r.clock.first_decode = step_start_;
  absl::MutexLock lock(&mu_);
  ++stats_.kv_load_to_first_decode_total;
  stats_.kv_load_to_first_decode_seconds_total += seconds;
}

}  // namespace tandem::core
