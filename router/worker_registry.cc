#include "router/worker_registry.h"

#include <algorithm>
#include <future>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/server/auth_call.h"
#include "common/server/log.h"
#include "common/server/server_util.h"

namespace tandem::router {
namespace {

// Weight of the newest poll in a worker's prefill rate average.
constexpr double kRateWeight = 0.3;

// The prefill rate after a poll that found `reply` `seconds` after the
// previous one (`before`): the tokens computed since, averaged into `rate`,
// when prefill was queued at the previous poll (idle time says nothing of
// the rate) and some progress was made.
double UpdatePrefillRate(double rate, const v1::WorkerStatus& before, const v1::WorkerStatus& reply,
                         double seconds) {
  if (before.queued_prefill_tokens() == 0 || seconds <= 0 ||
      reply.prefill_tokens_computed_total() <= before.prefill_tokens_computed_total()) {
    return rate;
  }
  const double sample = static_cast<double>(reply.prefill_tokens_computed_total() -
                                            before.prefill_tokens_computed_total()) /
                        seconds;
  return rate == 0 ? sample : (1 - kRateWeight) * rate + kRateWeight * sample;
}

}  // namespace

// One GetStatus poll in flight on cq_; its address is the call's tag.
struct WorkerRegistry::PollCall {
  std::shared_ptr<WorkerHandle> handle;  // keeps the stub alive
  grpc::ClientContext context;
  v1::WorkerStatus reply;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::WorkerStatus>> reader;
};

uint64_t WorkerHandle::AddLostCallback(std::function<void()> callback) {
  absl::MutexLock lock(&lost_mu_);
  lost_callbacks_[next_lost_token_] = std::move(callback);
  return next_lost_token_++;
}

void WorkerHandle::RemoveLostCallback(uint64_t token) {
  absl::MutexLock lock(&lost_mu_);
  lost_callbacks_.erase(token);
}

void WorkerHandle::NotifyLost(const std::string& why) {
  {
    absl::MutexLock reason_lock(&reason_mu_);
    lost_reason_ = why;
  }
  absl::MutexLock lock(&lost_mu_);
  for (auto& [token, callback] : lost_callbacks_) callback();
}

std::string WorkerHandle::lost_reason() const {
  absl::MutexLock lock(&reason_mu_);
  return lost_reason_;
}

void WorkerHandle::NoteUnavailable(const std::string& message) {
  absl::MutexLock lock(&reason_mu_);
  last_unavailable_ = message;
  last_unavailable_at_ = absl::Now();
}

std::string WorkerHandle::last_unavailable(absl::Duration within) const {
  absl::MutexLock lock(&reason_mu_);
  return absl::Now() - last_unavailable_at_ <= within ? last_unavailable_ : std::string();
}

WorkerRegistry::WorkerRegistry(const RegistryOptions& options,
                               std::function<void(bool)> on_health_change)
    : options_(options),
      on_health_change_(std::move(on_health_change)),
      index_(options.model_fingerprint, [this](const std::string& line) { Log(line); }),
      watchers_(&index_, KvEventWatcherOptions{options.kv_watch_retry_ms, options.auth}) {
  poller_ = std::thread([this] { PollLoop(); });
}

WorkerRegistry::~WorkerRegistry() {
  // The poll thread runs until it receives this alarm's event, so the alarm
  // is always set on a live queue.
  wake_.Set(&cq_, std::chrono::system_clock::now(), &wake_);
  poller_.join();
}

void WorkerRegistry::Log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    rpc::Log(line);
  }
}

absl::Status WorkerRegistry::Register(const v1::RegisterWorkerRequest& request) {
  if (request.name().empty()) return absl::InvalidArgumentError("name: must not be empty");
  if (request.address().empty()) {
    return absl::InvalidArgumentError("address: must not be empty");
  }
  if (request.role() != v1::ROLE_DECODE && request.role() != v1::ROLE_PREFILL) {
    return absl::InvalidArgumentError("role: must be ROLE_PREFILL or ROLE_DECODE");
  }
  if (request.model_fingerprint() != options_.model_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model_fingerprint: worker ", request.name(), " serves ", request.model_fingerprint(),
        " but the router serves ", options_.model_fingerprint));
  }
  const auto listed = options_.kv_layout_ids.find(request.name());
  const std::string& expected_layout =
      listed != options_.kv_layout_ids.end() ? listed->second : options_.kv_layout_id;
  if (request.kv_layout_id() != expected_layout) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kv_layout_id: worker ", request.name(), " has KV layout \"", request.kv_layout_id(),
        "\" but the router's model and configuration give \"", expected_layout, "\""));
  }
  {
    absl::MutexLock lock(&mu_);
    auto held = workers_.find(request.name());
    if (held != workers_.end() && held->second.handle != nullptr && held->second.healthy &&
        held->second.handle->address != request.address()) {
      // Two processes with one name: the one that holds it keeps it until it
      // dies (misses polls or is reported unreachable); see the header.
      std::string why =
          absl::StrCat("worker name '", request.name(), "' is held by a healthy worker at ",
                       held->second.handle->address,
                       "; another process registered with the same name from ", request.address());
      if (duplicate_logged_.insert({request.name(), request.address()}).second) {
        Log(absl::StrCat("refused worker ", request.name(), ": ", why));
      }
      return absl::AlreadyExistsError(why);
    }
    Entry& entry = workers_[request.name()];
    if (entry.handle != nullptr && entry.handle->address == request.address() &&
        entry.handle->role != request.role() &&
        (entry.changing_role || absl::Now() - entry.role_changed_at < kRoleSettle)) {
      // A heartbeat sent before the worker's role change (or while it runs):
      // EndRoleChange decides the role.
      return absl::OkStatus();
    }
    const bool same = entry.handle != nullptr && entry.handle->address == request.address() &&
                      entry.handle->kv_endpoint == request.kv_endpoint() &&
                      entry.handle->kv_layout_id == request.kv_layout_id() &&
                      entry.handle->role == request.role();
    if (!same) {
      auto handle = std::make_shared<WorkerHandle>();
      handle->name = request.name();
      handle->role = request.role();
      handle->address = request.address();
      handle->kv_endpoint = request.kv_endpoint();
      handle->kv_layout_id = request.kv_layout_id();
      handle->auth = options_.auth;
      auto channel = rpc::MakeChannel(request.address());
      if (request.role() == v1::ROLE_DECODE) {
        handle->decode_stub = v1::DecodeWorker::NewStub(channel);
      } else {
        handle->prefill_stub = v1::PrefillWorker::NewStub(channel);
      }
      entry.handle = std::move(handle);
      // A later duplicate of the new holder is logged again.
      std::erase_if(duplicate_logged_,
                    [&](const auto& key) { return key.first == request.name(); });
      watchers_.Watch(request.name(), request.address());
      Log(absl::StrCat("worker ", request.name(), " (", v1::WorkerRole_Name(request.role()),
                       ") at ", request.address(), " registered"));
    }
    if (!same) {
      entry.healthy = true;
      entry.draining = false;
      entry.missed_polls = 0;
      entry.status.Clear();  // another process: its old load says nothing
      entry.in_flight_at_poll = 0;
      entry.prefill_tokens_in_flight_at_poll = 0;
    }
    // A heartbeat of a known worker at the same address changes nothing:
    // only a poll that reaches it makes an unhealthy worker healthy again
    // (a worker can register while its advertised address is unreachable).
  }
  ReportHealth();
  return absl::OkStatus();
}

void WorkerRegistry::ReportUnreachable(const std::shared_ptr<WorkerHandle>& handle,
                                       const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(handle->name);
    if (it == workers_.end() || it->second.handle != handle || !it->second.healthy) return;
    Entry& e = it->second;
    e.healthy = false;
    e.unhealthy_since = absl::Now();
    e.missed_polls = options_.unhealthy_after_missed_polls;
    Log(absl::StrCat("worker ", handle->name, " unreachable (", why, "): unhealthy"));
  }
  handle->NotifyLost(why);  // its other requests move on now
  ReportHealth();
}

void WorkerRegistry::GatherCandidates(const PickRequest& request, bool with_prefix,
                                      std::vector<std::shared_ptr<WorkerHandle>>* handles,
                                      std::vector<Candidate>* candidates,
                                      std::vector<std::string>* too_busy) const {
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, entry] : workers_) {
      if (!entry.Routable() || entry.handle->role != request.role) continue;
      if (std::find(request.avoid.begin(), request.avoid.end(), name) != request.avoid.end()) {
        continue;
      }
      if (!request.kv_layout_id.empty() && entry.handle->kv_layout_id != request.kv_layout_id) {
        continue;
      }
      const v1::WorkerStatus& st = entry.status;
      Candidate c;
      c.name = name;
      c.kv_blocks_total = st.kv_blocks_total();
      c.kv_blocks_in_use = st.kv_blocks_in_use();
      c.waiting = st.waiting_requests();
      // running_requests includes the waiting ones.
      c.running = st.running_requests() - std::min(st.waiting_requests(), st.running_requests());
      c.queued_prefill_tokens = st.queued_prefill_tokens();
      // The worker's own step model (warm-up and every step) when it
      // reports one, else the rate measured from polls.
      c.prefill_tokens_per_s = st.step_model().prefill_tokens_per_s() > 0
                                   ? st.step_model().prefill_tokens_per_s()
                                   : entry.prefill_tokens_per_s;
      c.in_flight = entry.handle->active_requests.load();
      c.in_flight_at_poll = entry.in_flight_at_poll;
      c.prefill_tokens_in_flight = entry.handle->prefill_tokens_in_flight.load();
      c.prefill_tokens_in_flight_at_poll = entry.prefill_tokens_in_flight_at_poll;
      const double wait_s = PredictedQueueWaitSeconds(c);
      if (wait_s > request.max_queue_wait_s) {
        too_busy->push_back(
            absl::StrFormat("%s ~%.1f s (%d queued prefill tokens at %.0f tokens/s)", name, wait_s,
                            c.queued_prefill_tokens, c.prefill_tokens_per_s));
        continue;
      }
      handles->push_back(entry.handle);
      candidates->push_back(std::move(c));
    }
  }
  // The prefix index has its own lock: asked outside mu_.
  if (with_prefix || options_.routing.policy == RouterPolicy::kKvAware) {
    for (Candidate& c : *candidates) {
      c.cached_prefix_tokens = CachedPrefixTokens(c.name, request.prompt);
    }
  }
}

std::optional<v1::PrefillEstimate> WorkerRegistry::EstimatePrefill(
    std::span<const int32_t> prompt) {
  PickRequest request;
  request.role = v1::ROLE_PREFILL;
  request.prompt = prompt;
  std::vector<std::shared_ptr<WorkerHandle>> handles;
  std::vector<Candidate> candidates;
  std::vector<std::string> too_busy;
  GatherCandidates(request, /*with_prefix=*/true, &handles, &candidates, &too_busy);
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  const Candidate* best = nullptr;
  for (const Candidate& c : candidates) {
    if (c.prefill_tokens_per_s <= 0) continue;
    if (best == nullptr ||
        PredictedFinishSeconds(c, prompt_tokens) < PredictedFinishSeconds(*best, prompt_tokens)) {
      best = &c;
    }
  }
  if (best == nullptr) return std::nullopt;
  v1::PrefillEstimate estimate;
  estimate.set_prefill_worker(best->name);
  const double queue_s =
      static_cast<double>(QueuedPrefillTokensNow(*best)) / best->prefill_tokens_per_s;
  estimate.set_queue_ms(queue_s * 1000);
  estimate.set_prefill_ms((PredictedFinishSeconds(*best, prompt_tokens) - queue_s) * 1000);
  return estimate;
}

PickResult WorkerRegistry::Pick(const PickRequest& request) {
  std::vector<std::shared_ptr<WorkerHandle>> handles;
  std::vector<Candidate> candidates;
  std::vector<std::string> too_busy;  // prefill workers whose queue outlasts the request
  GatherCandidates(request,
                   request.role == v1::ROLE_PREFILL && options_.routing.prefill_by_finish_time,
                   &handles, &candidates, &too_busy);
  if (candidates.empty()) {
    PickResult none;
    if (!too_busy.empty()) {
      none.explanation = absl::StrFormat(
          "every prefill worker's queue outlasts the %.1f s left to the request: %s",
          request.max_queue_wait_s, absl::StrJoin(too_busy, ", "));
    }
    return none;
  }
  const bool decode = request.role == v1::ROLE_DECODE;
  std::optional<Choice> choice;
  {
    absl::MutexLock lock(&mu_);
    choice = ChooseCandidate(candidates, decode, static_cast<int64_t>(request.prompt.size()),
                             options_.routing, &cursors_[request.role]);
  }
  PickResult result;
  result.worker = handles[choice->index];
  result.score = choice->scored.score;
  result.explanation = std::move(choice->scored.explanation);
  return result;
}

int32_t WorkerRegistry::CachedPrefixTokens(const std::string& worker,
                                           std::span<const int32_t> prompt) const {
  return index_.CachedPrefixTokens(worker, prompt);
}

absl::StatusOr<WorkerRegistry::RoleChangeStart> WorkerRegistry::BeginRoleChange(
    const std::string& name, v1::WorkerRole role) {
  RoleChangeStart start;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(name);
    if (it == workers_.end() || it->second.handle == nullptr) {
      return absl::NotFoundError(absl::StrCat("no worker named '", name, "'"));
    }
    Entry& e = it->second;
    start.handle = e.handle;
    start.previous_role = e.handle->role;
    if (e.handle->role == role) {
      start.no_op = true;
      return start;
    }
    if (e.changing_role) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", name, " is already changing role"));
    }
    if (!e.healthy || e.draining) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", name, " is ", e.healthy ? "draining" : "unhealthy", "; its role stays"));
    }
    if (e.handle->role == v1::ROLE_DECODE) {
      bool other_decode = false;
      for (const auto& [other, entry] : workers_) {
        if (other != name && entry.Routable() && entry.handle->role == v1::ROLE_DECODE) {
          other_decode = true;
        }
      }
      if (!other_decode) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker ", name, " is the only healthy decode worker: the cluster needs one to serve"));
      }
    }
    e.changing_role = true;
  }
  ReportHealth();
  return start;
}

void WorkerRegistry::EndRoleChange(const std::string& name, v1::WorkerRole role, bool changed) {
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(name);
    if (it == workers_.end() || it->second.handle == nullptr) return;
    Entry& e = it->second;
    e.changing_role = false;
    if (changed) {
      e.role_changed_at = absl::Now();
      if (e.handle->role != role) {
        const WorkerHandle& old = *e.handle;
        auto handle = std::make_shared<WorkerHandle>();
        handle->name = old.name;
        handle->role = role;
        handle->address = old.address;
        handle->kv_endpoint = old.kv_endpoint;
        handle->kv_layout_id = old.kv_layout_id;
        handle->auth = old.auth;
        auto channel = rpc::MakeChannel(old.address);
        if (role == v1::ROLE_DECODE) {
          handle->decode_stub = v1::DecodeWorker::NewStub(channel);
        } else {
          handle->prefill_stub = v1::PrefillWorker::NewStub(channel);
        }
        e.handle = std::move(handle);
        // Its queue and rate were of the other role's work.
        e.status.Clear();
        e.status_at = absl::InfinitePast();
        e.prefill_tokens_per_s = 0;
        e.in_flight_at_poll = 0;
        e.prefill_tokens_in_flight_at_poll = 0;
      }
      Log(absl::StrCat("worker ", name, " serves the ", v1::WorkerRole_Name(role), " role now"));
    }
  }
  ReportHealth();
}

std::vector<WorkerRegistry::WorkerView> WorkerRegistry::Workers() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerView> out;
  for (const auto& [name, e] : workers_) {
    if (e.handle == nullptr) continue;
    WorkerView v;
    v.name = name;
    v.role = e.handle->role;
    v.routable = e.Routable();
    v.changing_role = e.changing_role;
    v.status = e.status;
    v.prefill_tokens_per_s = e.prefill_tokens_per_s;
    out.push_back(std::move(v));
  }
  return out;
}

bool WorkerRegistry::HasRoutable(v1::WorkerRole role) const {
  absl::MutexLock lock(&mu_);
  return HasRoutableLocked(role);
}

bool WorkerRegistry::HasRoutableLocked(v1::WorkerRole role) const {
  for (const auto& [name, entry] : workers_) {
    if (entry.Routable() && entry.handle->role == role) return true;
  }
  return false;
}

bool WorkerRegistry::CanServeLocked() const { return HasRoutableLocked(v1::ROLE_DECODE); }

bool WorkerRegistry::PrefillAvailableLocked() const { return HasRoutableLocked(v1::ROLE_PREFILL); }

bool WorkerRegistry::CanServe() const {
  absl::MutexLock lock(&mu_);
  return CanServeLocked();
}

bool WorkerRegistry::Contains(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  return workers_.count(name) > 0;
}

void WorkerRegistry::ReportHealth() {
  absl::MutexLock report_lock(&report_mu_);
  bool can_serve, prefill;
  {
    absl::MutexLock lock(&mu_);
    can_serve = CanServeLocked();
    prefill = PrefillAvailableLocked();
  }
  if (prefill != reported_prefill_) {
    reported_prefill_ = prefill;
    Log(prefill ? "prefill worker(s) available: long prompts are prefilled remotely"
                : "no healthy prefill worker: long prompts are prefilled on the decode workers");
  }
  if (can_serve != reported_can_serve_) {
    reported_can_serve_ = can_serve;
    if (on_health_change_) on_health_change_(can_serve);
  }
}

void WorkerRegistry::StatusAllAsync(std::function<void(std::vector<v1::WorkerStatus>)> done) const {
  // Shared by the calls' callbacks; the last one to finish calls `done`.
  struct Gather {
    std::vector<std::shared_ptr<WorkerHandle>> handles;  // keep the stubs alive
    std::vector<bool> healthy;
    std::vector<uint32_t> index_blocks;
    std::vector<grpc::ClientContext> contexts;
    std::vector<v1::WorkerStatus> results;
    v1::GetStatusRequest request;
    std::atomic<size_t> remaining{0};
    std::function<void(std::vector<v1::WorkerStatus>)> done;
  };
  auto gather = std::make_shared<Gather>();
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, entry] : workers_) {
      gather->handles.push_back(entry.handle);
      gather->healthy.push_back(entry.healthy);
      gather->index_blocks.push_back(index_.NumBlocks(name));
    }
  }
  const size_t n = gather->handles.size();
  if (n == 0) {
    done({});
    return;
  }
  gather->contexts = std::vector<grpc::ClientContext>(n);
  gather->results.resize(n);
  gather->remaining = n;
  gather->done = std::move(done);
  for (size_t i = 0; i < n; ++i) {
    gather->contexts[i].set_deadline(rpc::DeadlineFromNow(options_.rpc_timeout_ms));
    auto on_done = [gather, i](grpc::Status s) {
      v1::WorkerStatus& status = gather->results[i];
      const WorkerHandle& h = *gather->handles[i];
      if (!s.ok()) {
        status.Clear();
        status.set_name(h.name);
        status.set_role(h.role);
        status.set_address(h.address);
        status.set_unreachable(true);
      }
      status.set_healthy(gather->healthy[i] && s.ok());
      status.set_kv_index_blocks(gather->index_blocks[i]);
      if (--gather->remaining == 0) gather->done(std::move(gather->results));
    };
    const WorkerHandle& h = *gather->handles[i];
    rpc::SignCall(h.auth, &gather->contexts[i],
                  h.decode_stub ? rpc::kDecodeGetStatusMethod : rpc::kPrefillGetStatusMethod,
                  gather->request);
    if (h.decode_stub) {
      h.decode_stub->async()->GetStatus(&gather->contexts[i], &gather->request, &gather->results[i],
                                        std::move(on_done));
    } else {
      h.prefill_stub->async()->GetStatus(&gather->contexts[i], &gather->request,
                                         &gather->results[i], std::move(on_done));
    }
  }
}

WorkerRegistry::PollCall* WorkerRegistry::StartPoll(const std::shared_ptr<WorkerHandle>& handle) {
  auto* call = new PollCall;
  call->handle = handle;
  call->context.set_deadline(rpc::DeadlineFromNow(options_.rpc_timeout_ms));
  const v1::GetStatusRequest request;
  rpc::SignCall(handle->auth, &call->context,
                handle->decode_stub ? rpc::kDecodeGetStatusMethod : rpc::kPrefillGetStatusMethod,
                request);
  call->reader = handle->decode_stub
                     ? handle->decode_stub->PrepareAsyncGetStatus(&call->context, request, &cq_)
                     : handle->prefill_stub->PrepareAsyncGetStatus(&call->context, request, &cq_);
  call->reader->StartCall();
  call->reader->Finish(&call->reply, &call->status, call);
  return call;
}

void WorkerRegistry::OnPollDone(PollCall* call) {
  const std::shared_ptr<WorkerHandle>& h = call->handle;
  bool lost = false;
  std::string lost_why;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(h->name);
    // Re-registered at another address, or dropped, meanwhile.
    if (it == workers_.end() || it->second.handle != h) return;
    Entry& e = it->second;
    // Another process at this worker's address (a pod IP reused by a new
    // pod within drop_after_ms): it is not this worker, whatever it says.
    const std::string& answered_as = call->reply.name();
    if (call->status.ok() && !answered_as.empty() && answered_as != h->name) {
      if (e.healthy) {
        e.healthy = false;
        e.unhealthy_since = absl::Now();
        e.missed_polls = options_.unhealthy_after_missed_polls;
        lost = true;
        lost_why = absl::StrCat("worker ", h->name, "'s address ", h->address,
                                " answers as worker ", answered_as);
        Log(absl::StrCat(lost_why, ": unhealthy"));
      }
    } else if (call->status.ok()) {
      if (!e.healthy) Log(absl::StrCat("worker ", h->name, " answers polls again: healthy"));
      e.missed_polls = 0;
      e.healthy = true;
      // A draining worker answers with ready = false: route nothing new
      // to it, but let its requests finish.
      if (!call->reply.ready() && !e.draining) {
        Log(absl::StrCat("worker ", h->name, " is draining"));
      }
      e.draining = !call->reply.ready();
      const absl::Time now = absl::Now();
      e.prefill_tokens_per_s = UpdatePrefillRate(e.prefill_tokens_per_s, e.status, call->reply,
                                                 absl::ToDoubleSeconds(now - e.status_at));
      e.status_at = now;
      e.status = call->reply;  // Pick's load and KV inputs
      e.in_flight_at_poll = h->active_requests.load();
      e.prefill_tokens_in_flight_at_poll = h->prefill_tokens_in_flight.load();
    } else if (++e.missed_polls >= options_.unhealthy_after_missed_polls && e.healthy) {
      e.healthy = false;
      e.unhealthy_since = absl::Now();
      lost = true;
      Log(absl::StrCat("worker ", h->name, " missed ", e.missed_polls,
                       " polls (last: ", call->status.error_message(), "): unhealthy"));
    }
  }
  if (lost) h->NotifyLost(lost_why);  // its in-flight requests fail now
  ReportHealth();
}

absl::Time WorkerRegistry::DropExpired(absl::Time now) {
  absl::Time next = absl::InfiniteFuture();
  bool dropped = false;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      const Entry& e = it->second;
      const absl::Time deadline = e.unhealthy_since + absl::Milliseconds(options_.drop_after_ms);
      if (e.healthy || deadline > now) {
        if (!e.healthy) next = std::min(next, deadline);
        ++it;
        continue;
      }
      Log(absl::StrCat("worker ", it->first, " unhealthy for ",
                       absl::ToInt64Milliseconds(now - e.unhealthy_since),
                       " ms: dropped from the registry"));
      watchers_.Stop(it->first, "dropped from the registry");
      it = workers_.erase(it);
      dropped = true;
    }
  }
  if (dropped) ReportHealth();
  return next;
}

void WorkerRegistry::PollLoop() {
  // Per worker handle: when its next poll is due, and its poll in flight.
  struct Schedule {
    std::shared_ptr<WorkerHandle> handle;
    absl::Time due;
    PollCall* call = nullptr;
  };
  std::map<const WorkerHandle*, Schedule> schedules;
  const absl::Duration interval = absl::Milliseconds(options_.poll_interval_ms);
  for (;;) {
    const absl::Time now = absl::Now();
    absl::Time wake = std::min(DropExpired(now), now + interval);
    std::set<const WorkerHandle*> live;
    std::vector<std::shared_ptr<WorkerHandle>> handles;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [name, entry] : workers_) handles.push_back(entry.handle);
    }
    for (const std::shared_ptr<WorkerHandle>& h : handles) {
      live.insert(h.get());
      // A new worker was just registered (healthy): first poll one period on.
      Schedule& s = schedules.try_emplace(h.get(), Schedule{h, now + interval}).first->second;
      if (s.call == nullptr && s.due <= now) {
        s.call = StartPoll(h);
        s.due = now + interval;
      }
      if (s.call == nullptr) wake = std::min(wake, s.due);  // else its reply wakes us
    }
    for (auto it = schedules.begin(); it != schedules.end();) {
      if (live.count(it->first) == 0 && it->second.call == nullptr) {
        it = schedules.erase(it);
      } else {
        ++it;
      }
    }
    void* tag = nullptr;
    bool ok = false;
    const grpc::CompletionQueue::NextStatus next =
        cq_.AsyncNext(&tag, &ok, absl::ToChronoTime(wake));
    if (next == grpc::CompletionQueue::TIMEOUT) continue;
    if (next == grpc::CompletionQueue::SHUTDOWN || tag == &wake_) break;  // the destructor
    auto* call = static_cast<PollCall*>(tag);
    schedules[call->handle.get()].call = nullptr;
    OnPollDone(call);
    delete call;
  }
  // Stopping: cancel the polls in flight, then collect every event.
  for (auto& [key, s] : schedules) {
    if (s.call != nullptr) s.call->context.TryCancel();
  }
  cq_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) {
    if (tag != &wake_) delete static_cast<PollCall*>(tag);
  }
}

}  // namespace tandem::router
