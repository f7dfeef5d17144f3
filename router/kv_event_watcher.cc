#include "router/kv_event_watcher.h"

#include <algorithm>
#include <vector>
#include <utility>

#include <grpcpp/alarm.h>

#include "absl/strings/str_cat.h"
#include "common/server/auth_call.h"
#include "common/server/server_util.h"

namespace tandem::router {
namespace {

constexpr int32_t kMaxRetryMs = 2000;  // a worker that stays away is tried this often

}  // namespace

// One worker's watch. Lives (shared: the owner's map, its call, its
// pending timer) until its last call and timer have ended; its destructor
// tells the owner. Only a watch that is not stopping touches the index,
// under mu_, so once Stop returns nothing of it reaches the index again.
// gRPC is never called with mu_ held.
class KvEventWatchers::Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(KvEventWatchers* owner, std::string worker, std::string address)
      : owner_(owner),
        worker_(std::move(worker)),
        address_(std::move(address)),
        stub_(v1::KvEvents::NewStub(rpc::MakeChannel(address_))),
        retry_ms_(owner->options_.retry_ms) {}
  // Its call and timer have ended. This usually runs on a gRPC callback
  // thread of the stub's own channel, which must not drop the channel's
  // last reference there: the owner frees the stub later, on its caller's
  // thread. Then the owner may go (nothing of the watch is touched after).
  ~Stream() {
    alarm_.reset();
    owner_->Bury(std::move(stub_));
    owner_->StreamEnded();
  }

  const std::string& address() const { return address_; }

  void Start() {
    absl::MutexLock lock(&mu_);
    StartCallLocked();
  }

  // Ends the watch: cancels the call or the timer. Never blocks. The caller
  // holds the watch (a shared_ptr), so a pending alarm_ outlives the Cancel.
  void Stop() {
    std::shared_ptr<grpc::ClientContext> context;
    grpc::Alarm* alarm = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;  // from now on no call starts and alarm_ stays
      context = context_;
      if (alarm_pending_) alarm = alarm_.get();
    }
    if (context != nullptr) context->TryCancel();
    if (alarm != nullptr) alarm->Cancel();  // its callback still runs (ok = false)
  }

 private:
  // One Watch call; deletes itself in OnDone.
  class Call : public grpc::ClientReadReactor<v1::KvEventBatch> {
   public:
    explicit Call(std::shared_ptr<Stream> stream)
        : stream(std::move(stream)), context(std::make_shared<grpc::ClientContext>()) {}
    void OnReadDone(bool ok) override { stream->OnRead(this, ok); }
    void OnDone(const grpc::Status& status) override {
      stream->OnCallDone(status);
      delete this;
    }
    std::shared_ptr<Stream> stream;
    // Shared with the Stream so Stop can cancel it even as the call ends.
    std::shared_ptr<grpc::ClientContext> context;
    v1::WatchKvEventsRequest request;
    v1::KvEventBatch batch;
  };

  // Creates the next call under mu_ and starts it once mu_ is released (a
  // Stop in between cancels its context first: the call ends at once).
  void StartCallLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto* call = new Call(shared_from_this());
    context_ = call->context;
    got_snapshot_ = false;
    pending_start_ = call;
  }
  void StartPending() ABSL_LOCKS_EXCLUDED(mu_) {
    Call* call;
    {
      absl::MutexLock lock(&mu_);
      call = pending_start_;
      pending_start_ = nullptr;
    }
    if (call == nullptr) return;
    owner_->StartCall(stub_.get(), call->context.get(), &call->request, call);
    call->StartRead(&call->batch);
    call->StartCall();
  }

  void OnRead(Call* call, bool ok) {
    if (!ok) return;  // the stream ended: OnDone follows
    bool keep = false;
    {
      absl::MutexLock lock(&mu_);
      if (!stopping_) {
        keep = owner_->index_->Apply(worker_, call->batch);
        if (keep && call->batch.snapshot()) {
          got_snapshot_ = true;
          retry_ms_ = owner_->options_.retry_ms;
        }
      }
    }
    if (keep) {
      call->StartRead(&call->batch);
    } else {
      call->context->TryCancel();  // a gap (entries dropped) or stopping: OnDone follows
    }
  }

  void OnCallDone(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    context_.reset();
    if (!stopping_) {
      owner_->index_->Drop(
          worker_,
          absl::StrCat("event stream ended: ",
                       status.error_message().empty() ? "no error" : status.error_message(),
                       "; watching again"));
      // A worker that keeps refusing or is away is tried less often.
      const int32_t delay = retry_ms_;
      if (!got_snapshot_) retry_ms_ = std::min(kMaxRetryMs, retry_ms_ * 2);
      alarm_ = std::make_unique<grpc::Alarm>();
      alarm_pending_ = true;
      // The alarm keeps its callback until the alarm is destroyed: the
      // callback holds `this` raw (no cycle through alarm_), alarm_hold_
      // keeps the watch alive until it ran.
      alarm_hold_ = shared_from_this();
      alarm_->Set(std::chrono::system_clock::now() + std::chrono::milliseconds(delay),
                  [this](bool ok) { OnAlarm(ok); });
    }
  }

  void OnAlarm(bool /*ok*/) {
    std::shared_ptr<Stream> hold;  // released last: may destroy this watch
    {
      absl::MutexLock lock(&mu_);
      hold = std::move(alarm_hold_);
      alarm_pending_ = false;
      if (stopping_) return;
      StartCallLocked();
    }
    StartPending();
  }

  friend class KvEventWatchers;

  KvEventWatchers* const owner_;
  const std::string worker_;
  const std::string address_;
  std::unique_ptr<v1::KvEvents::Stub> stub_;  // handed to the owner by the destructor
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The current call's context (null between calls).
  std::shared_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(mu_);
  Call* pending_start_ ABSL_GUARDED_BY(mu_) = nullptr;  // created, not started
  bool got_snapshot_ ABSL_GUARDED_BY(mu_) = false;      // on the current call
  int32_t retry_ms_ ABSL_GUARDED_BY(mu_);
  // The restart timer; replaced only after it fired (no call and no timer
  // pending), so Stop may cancel it outside mu_ while it holds the watch.
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(mu_);
  bool alarm_pending_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Stream> alarm_hold_ ABSL_GUARDED_BY(mu_);  // while alarm_ is pending
};

KvEventWatchers::KvEventWatchers(PrefixIndex* index, const KvEventWatcherOptions& options)
    : index_(index), options_(options) {}

KvEventWatchers::~KvEventWatchers() {
  std::map<std::string, std::shared_ptr<Stream>> streams;
  {
    absl::MutexLock lock(&mu_);
    streams.swap(streams_);
  }
  for (auto& [name, s] : streams) s->Stop();
  streams.clear();  // each watch goes once its call and timer have ended
  {
    absl::MutexLock lock(&live_mu_);
    live_mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &live_));
  }
  ClearGraveyard();
}

void KvEventWatchers::StartCall(v1::KvEvents::Stub* stub, grpc::ClientContext* context,
                                const v1::WatchKvEventsRequest* request,
                                grpc::ClientReadReactor<v1::KvEventBatch>* reactor) {
  rpc::SignCall(options_.auth, context, rpc::kKvEventsWatchMethod, *request);
  stub->async()->Watch(context, request, reactor);
}

void KvEventWatchers::Bury(std::unique_ptr<v1::KvEvents::Stub> stub) {
  absl::MutexLock lock(&grave_mu_);
  graveyard_.push_back(std::move(stub));
}

void KvEventWatchers::ClearGraveyard() {
  std::vector<std::unique_ptr<v1::KvEvents::Stub>> dead;
  {
    absl::MutexLock lock(&grave_mu_);
    dead.swap(graveyard_);
  }
}

void KvEventWatchers::StreamEnded() {
  absl::MutexLock lock(&live_mu_);
  --live_;
}

void KvEventWatchers::Watch(const std::string& worker, const std::string& address) {
  ClearGraveyard();
  std::shared_ptr<Stream> old, fresh;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Stream>& slot = streams_[worker];
    if (slot != nullptr && slot->address() == address) return;
    old = std::move(slot);
    fresh = std::make_shared<Stream>(this, worker, address);
    slot = fresh;
    absl::MutexLock live(&live_mu_);
    ++live_;
  }
  if (old != nullptr) {
    old->Stop();
    index_->Drop(worker, absl::StrCat("re-registered at ", address));
  }
  fresh->Start();
  fresh->StartPending();
}

void KvEventWatchers::Stop(const std::string& worker, const std::string& why) {
  ClearGraveyard();
  std::shared_ptr<Stream> s;
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(worker);
    if (it == streams_.end()) return;
    s = std::move(it->second);
    streams_.erase(it);
  }
  s->Stop();
  index_->Erase(worker, why);
}

}  // namespace tandem::router
