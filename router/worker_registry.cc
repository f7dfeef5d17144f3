#include "router/worker_registry.h"

#include <algorithm>
#include <future>

#include "absl/strings/str_cat.h"
#include "common/server/log.h"
#include "common/server/server_util.h"

namespace tandem::router {
namespace {

// GetStatus on one worker with a deadline.
grpc::Status QueryStatus(const WorkerHandle& w, int timeout_ms, v1::WorkerStatus* out) {
  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::DeadlineFromNow(timeout_ms));
  v1::GetStatusRequest req;
  if (w.decode_stub) return w.decode_stub->GetStatus(&ctx, req, out);
  return w.prefill_stub->GetStatus(&ctx, req, out);
}

}  // namespace

uint64_t WorkerHandle::AddLostCallback(std::function<void()> callback) {
  absl::MutexLock lock(&lost_mu_);
  lost_callbacks_[next_lost_token_] = std::move(callback);
  return next_lost_token_++;
}

void WorkerHandle::RemoveLostCallback(uint64_t token) {
  absl::MutexLock lock(&lost_mu_);
  lost_callbacks_.erase(token);
}

void WorkerHandle::NotifyLost() {
  absl::MutexLock lock(&lost_mu_);
  for (auto& [token, callback] : lost_callbacks_) callback();
}

WorkerRegistry::WorkerRegistry(const RegistryOptions& options,
                               std::function<void(bool)> on_health_change)
    : options_(options), on_health_change_(std::move(on_health_change)) {
  poller_ = std::thread([this] { PollLoop(); });
}

WorkerRegistry::~WorkerRegistry() {
  stop_.Notify();
  poller_.join();
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
        "model_fingerprint: worker ", request.name(), " serves ",
        request.model_fingerprint(), " but the router serves ", options_.model_fingerprint));
  }
  bool before;
  {
    absl::MutexLock lock(&mu_);
    before = CanServeLocked();
    Entry& entry = workers_[request.name()];
    const bool same = entry.handle != nullptr && entry.handle->address == request.address() &&
                      entry.handle->kv_endpoint == request.kv_endpoint() &&
                      entry.handle->role == request.role();
    if (!same) {
      auto handle = std::make_shared<WorkerHandle>();
      handle->name = request.name();
      handle->role = request.role();
      handle->address = request.address();
      handle->kv_endpoint = request.kv_endpoint();
      auto channel = rpc::MakeChannel(request.address());
      if (request.role() == v1::ROLE_DECODE) {
        handle->decode_stub = v1::DecodeWorker::NewStub(channel);
      } else {
        handle->prefill_stub = v1::PrefillWorker::NewStub(channel);
      }
      entry.handle = std::move(handle);
      rpc::Log(absl::StrCat("worker ", request.name(), " (",
                            v1::WorkerRole_Name(request.role()), ") at ",
                            request.address(), " registered"));
    }
    entry.healthy = true;
    entry.draining = false;
    entry.missed_polls = 0;
  }
  NotifyIfChanged(before);
  return absl::OkStatus();
}

std::shared_ptr<WorkerHandle> WorkerRegistry::Pick(v1::WorkerRole role,
                                                   const std::vector<std::string>& avoid) const {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<WorkerHandle> best;
  for (const auto& [name, entry] : workers_) {
    if (!entry.Routable() || entry.handle->role != role) continue;
    if (std::find(avoid.begin(), avoid.end(), name) != avoid.end()) continue;
    if (best == nullptr || entry.handle->active_requests < best->active_requests) {
      best = entry.handle;
    }
  }
  return best;
}

bool WorkerRegistry::CanServeLocked() const {
  bool decode = false, prefill = false;
  for (const auto& [name, entry] : workers_) {
    if (!entry.Routable()) continue;
    decode |= entry.handle->role == v1::ROLE_DECODE;
    prefill |= entry.handle->role == v1::ROLE_PREFILL;
  }
  return decode && (prefill || !options_.prefill_required);
}

bool WorkerRegistry::CanServe() const {
  absl::MutexLock lock(&mu_);
  return CanServeLocked();
}

void WorkerRegistry::NotifyIfChanged(bool before) {
  const bool now = CanServe();
  if (now != before && on_health_change_) on_health_change_(now);
}

std::vector<v1::WorkerStatus> WorkerRegistry::StatusAll() const {
  std::vector<std::pair<std::shared_ptr<WorkerHandle>, bool>> handles;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, entry] : workers_) handles.emplace_back(entry.handle, entry.healthy);
  }
  std::vector<std::future<v1::WorkerStatus>> futures;
  for (auto& [handle, healthy] : handles) {
    futures.push_back(std::async(std::launch::async, [this, h = handle, ok = healthy] {
      v1::WorkerStatus status;
      grpc::Status s = QueryStatus(*h, options_.rpc_timeout_ms, &status);
      if (!s.ok()) {
        status.Clear();
        status.set_name(h->name);
        status.set_role(h->role);
        status.set_address(h->address);
      }
      status.set_healthy(ok && s.ok());
      return status;
    }));
  }
  std::vector<v1::WorkerStatus> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

void WorkerRegistry::PollLoop() {
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(options_.poll_interval_ms))) {
    std::vector<std::shared_ptr<WorkerHandle>> handles;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [name, entry] : workers_) handles.push_back(entry.handle);
    }
    for (const auto& h : handles) {
      v1::WorkerStatus status;
      const bool ok = QueryStatus(*h, options_.rpc_timeout_ms, &status).ok();
      bool before;
      bool lost = false;
      {
        absl::MutexLock lock(&mu_);
        before = CanServeLocked();
        auto it = workers_.find(h->name);
        if (it == workers_.end() || it->second.handle != h) continue;
        Entry& e = it->second;
        if (ok) {
          e.missed_polls = 0;
          e.healthy = true;
          // A draining worker answers with ready = false: route nothing new
          // to it, but let its requests finish.
          if (!status.ready() && !e.draining) {
            rpc::Log(absl::StrCat("worker ", h->name, " is draining"));
          }
          e.draining = !status.ready();
        } else if (++e.missed_polls >= options_.unhealthy_after_missed_polls && e.healthy) {
          e.healthy = false;
          lost = true;
          rpc::Log(absl::StrCat("worker ", h->name, " missed ", e.missed_polls,
                                " polls: unhealthy"));
        }
      }
      if (lost) h->NotifyLost();  // its in-flight requests fail now
      NotifyIfChanged(before);
    }
  }
}

}  // namespace tandem::router
