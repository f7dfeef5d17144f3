#include "router/generate_call.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/server/auth_call.h"
#include "common/server/log.h"

namespace tandem::router {
namespace {

// While a request uses a worker: counts it as active there (and, for a
// prefill call, its prompt tokens as in flight there), and tells the
// request if the registry marks the worker unhealthy. Created and
// destroyed outside the request's mutex (WorkerHandle::NotifyLost runs the
// callback under the handle's own lock, and the callback takes the
// request's).
class ActiveGuard {
 public:
  ActiveGuard(std::shared_ptr<WorkerHandle> worker, std::weak_ptr<GenerateCall> call,
              int64_t prefill_tokens = 0)
      : w_(std::move(worker)),
        prefill_tokens_(prefill_tokens),
        lost_token_(w_->AddLostCallback([call = std::move(call), name = w_->name] {
          if (auto c = call.lock()) c->WorkerLost(name);
        })) {
    ++w_->active_requests;
    w_->prefill_tokens_in_flight += prefill_tokens_;
  }
  ~ActiveGuard() {
    w_->RemoveLostCallback(lost_token_);
    --w_->active_requests;
    w_->prefill_tokens_in_flight -= prefill_tokens_;
  }
  ActiveGuard(const ActiveGuard&) = delete;
  ActiveGuard& operator=(const ActiveGuard&) = delete;

 private:
  std::shared_ptr<WorkerHandle> w_;
  const int64_t prefill_tokens_;
  uint64_t lost_token_;
};

// One asynchronous unary call's state, alive until its callback ran.
template <class Request, class Response>
struct UnaryCall {
  explicit UnaryCall(int32_t timeout_ms) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  }
  grpc::ClientContext context;
  Request request;
  Response response;
};

// Errors that say the call could not reach its worker (or the worker went
// away), as opposed to an answer from a live worker.
bool IsTransportError(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::UNKNOWN ||
         s.error_code() == grpc::StatusCode::INTERNAL;
}

// SampleFinish mirrors v1::FinishReason value for value.
static_assert(static_cast<int>(SampleFinish::kNone) == v1::FINISH_NONE);
static_assert(static_cast<int>(SampleFinish::kLength) == v1::FINISH_LENGTH);
static_assert(static_cast<int>(SampleFinish::kStop) == v1::FINISH_STOP);
static_assert(static_cast<int>(SampleFinish::kContext) == v1::FINISH_CONTEXT);
static_assert(static_cast<int>(SampleFinish::kCancelled) == v1::FINISH_CANCELLED);

v1::FinishReason ToProto(SampleFinish finish) {
  return static_cast<v1::FinishReason>(static_cast<int>(finish));
}

// The request's fields the samples' output follows.
SampleOutputOptions SampleOptionsOf(const v1::GenerateRequest& request) {
  SampleOutputOptions options;
  options.n = request.has_n() ? request.n() : 1;
  options.stop.assign(request.stop().begin(), request.stop().end());
  options.include_stop_str_in_output = request.include_stop_str_in_output();
  options.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  options.ignore_eos = request.ignore_eos();
  options.min_tokens = request.min_tokens();
  return options;
}

}  // namespace

// One D.Generate stream (one decode attempt of the request). Lives until
// gRPC's OnDone; holds the request alive meanwhile.
class GenerateCall::DecodeStream final
    : public grpc::ClientReadReactor<v1::DecodeGenerateResponse> {
 public:
  DecodeStream(std::shared_ptr<GenerateCall> call, std::shared_ptr<WorkerHandle> worker,
               v1::DecodeGenerateRequest request, int number)
      : number(number),
        call_(std::move(call)),
        worker_(std::move(worker)),
        request_(std::move(request)) {
    context_.set_deadline(call_->params_.deadline);
  }
  // Outside the request's mutex.
  void Begin() {
    guard_.emplace(worker_, call_);
    rpc::SignCall(worker_->auth, &context_, rpc::kDecodeGenerateMethod, request_);
    worker_->decode_stub->async()->Generate(&context_, &request_, this);
    StartRead(&msg_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    call_->OnDecodeMessage(this, msg_);
    StartRead(&msg_);
  }
  void OnDone(const grpc::Status& status) override {
    call_->OnDecodeDone(this, status);
    delete this;  // the guard goes outside the request's mutex
  }
  void TryCancel() { context_.TryCancel(); }
  const std::shared_ptr<WorkerHandle>& worker() const { return worker_; }
  const int number;       // the request's 1st, 2nd, ... decode stream
  bool lost = false;      // the registry marked the worker unhealthy (under mu_)
  bool received = false;  // a message arrived (under mu_)

 private:
  const std::shared_ptr<GenerateCall> call_;
  const std::shared_ptr<WorkerHandle> worker_;
  const v1::DecodeGenerateRequest request_;
  grpc::ClientContext context_;
  v1::DecodeGenerateResponse msg_;
  std::optional<ActiveGuard> guard_;
};

// One P.Prefill call (one remote prefill attempt).
struct GenerateCall::PrefillCall {
  uint32_t attempt = 0;
  std::shared_ptr<WorkerHandle> worker;
  std::chrono::steady_clock::time_point started;  // the call was made (timing)
  grpc::ClientContext context;
  v1::PrefillRequest request;
  v1::PrefillResponse response;
  std::optional<ActiveGuard> guard;
  bool lost = false;        // the registry marked the worker unhealthy (under mu_)
  bool superseded = false;  // cancelled by the request itself (under mu_)
};

GenerateCall::GenerateCall(Params params, WorkerRegistry* registry,
                           const tokenizer::Tokenizer* tokenizer, std::shared_ptr<Sink> sink)
    : params_(std::move(params)),
      registry_(registry),
      tokenizer_(tokenizer),
      sink_(std::move(sink)),
      samples_(*tokenizer_, SampleOptionsOf(params_.request)),
      timer_(params_.metrics, params_.arrival, params_.request.has_n() ? params_.request.n() : 1,
             static_cast<int64_t>(params_.prompt.size())),
      timing_(params_.steady_arrival) {}

GenerateCall::~GenerateCall() = default;

void GenerateCall::RunDeferred() {
  for (;;) {
    std::vector<std::function<void()>> actions;
    {
      absl::MutexLock lock(&mu_);
      actions.swap(deferred_);
    }
    if (actions.empty()) return;
    for (auto& action : actions) action();
  }
}

void GenerateCall::Start(std::function<void()> on_done) {
  {
    absl::MutexLock lock(&mu_);
    on_done_ = std::move(on_done);
    std::shared_ptr<WorkerHandle> decode = cancelled_ ? nullptr : PickWorker(v1::ROLE_DECODE, {});
    if (cancelled_) {
      decode_ended_ = true;
    } else if (decode == nullptr) {
      decode_ended_ = true;
      decode_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy decode worker");
    } else if (params_.request.route_override() == v1::ROUTE_REMOTE &&
               !registry_->HasRoutable(v1::ROLE_PREFILL)) {
      decode_ended_ = true;
      decode_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                    "route_override REMOTE: no healthy prefill worker");
    } else {
      StartDecode(std::move(decode));
    }
    MaybeFinish();
  }
  RunDeferred();
}

void GenerateCall::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    CancelCalls();
  }
  RunDeferred();
}

void GenerateCall::WorkerLost(const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (decode_stream_ != nullptr && decode_stream_->worker()->name == name &&
      !(decode_stream_->worker()->leaving() && !CanMigrate())) {
    // (A worker changing role keeps serving a stream that cannot migrate.)
    decode_stream_->lost = true;
    decode_stream_->TryCancel();
  }
  for (const std::shared_ptr<PrefillCall>& call : prefill_calls_) {
    if (call->worker->name != name || call->superseded) continue;
    call->lost = true;
    call->context.TryCancel();
  }
}

void GenerateCall::CancelCalls() {
  if (decode_stream_ != nullptr) decode_stream_->TryCancel();
  CancelPrefillCalls();
}

void GenerateCall::CancelPrefillCalls() {
  for (const std::shared_ptr<PrefillCall>& call : prefill_calls_) {
    call->superseded = true;
    call->context.TryCancel();
  }
}

void GenerateCall::StartDecode(std::shared_ptr<WorkerHandle> decode) {
  // Each decode stream after the first has its own id on the workers: the
  // old stream's prefill may still be running under the old id on P.
  worker_request_id_ = decode_streams_ == 0
                           ? params_.request_id
                           : absl::StrCat(params_.request_id, ".", decode_streams_);
  ++decode_streams_;
  v1::DecodeGenerateRequest dreq;
  dreq.set_request_id(worker_request_id_);
  dreq.mutable_prompt_token_ids()->Add(params_.prompt.begin(), params_.prompt.end());
  dreq.set_max_tokens(params_.request.max_tokens());
  *dreq.mutable_sampling() = params_.request.sampling();
  dreq.set_route_override(params_.request.route_override());
  *dreq.mutable_controls() = params_.controls;
  if (dreq.route_override() == v1::ROUTE_AUTO && !registry_->HasRoutable(v1::ROLE_PREFILL)) {
    // No healthy prefill worker: D prefills every prompt itself.
    dreq.set_route_override(v1::ROUTE_LOCAL);
  }
  if (dreq.route_override() != v1::ROUTE_LOCAL) {
    // What a remote prefill would cost now (D's placement weighs it).
    std::optional<v1::PrefillEstimate> estimate = registry_->EstimatePrefill(params_.prompt);
    if (estimate.has_value()) *dreq.mutable_prefill_estimate() = *std::move(estimate);
  }
  const bool progressed = samples_.progressed();
  if (progressed && samples_.size() == 1) {
    // Migration: D prefills prompt + the tokens already streamed and
    // continues at index k.
    const std::vector<int32_t>& emitted = samples_.emitted(0);
    dreq.mutable_generated_token_ids()->Add(emitted.begin(), emitted.end());
    dreq.set_first_output_index(samples_.next_index(0));
    dreq.set_route_override(v1::ROUTE_LOCAL);
  } else if (progressed) {
    // n > 1: every sample continues from its own tokens (each is its own
    // sequence on D, with its own seed as before); ended ones stay ended.
    for (uint32_t s = 0; s < samples_.size(); ++s) {
      v1::DecodeGenerateRequest::MigratedSample* m = dreq.add_migrated_samples();
      const std::vector<int32_t>& emitted = samples_.emitted(s);
      m->mutable_generated_token_ids()->Add(emitted.begin(), emitted.end());
      m->set_finished(samples_.done(s));
    }
    dreq.set_route_override(v1::ROUTE_LOCAL);
  }
  // The new stream sends the buffered tokens again and says again how the
  // unfinished samples end.
  samples_.Restart();
  auto* stream = new DecodeStream(shared_from_this(), decode, std::move(dreq), decode_streams_);
  timing_.DecodeStarted(decode_streams_, std::chrono::steady_clock::now());
  decode_stream_ = stream;
  decode_ = std::move(decode);
  ++outstanding_;
  deferred_.push_back([stream] { stream->Begin(); });
}

void GenerateCall::OnDecodeMessage(DecodeStream* stream, const v1::DecodeGenerateResponse& msg) {
  {
    absl::MutexLock lock(&mu_);
    if (stream != decode_stream_ || finished_) return;
    stream->received = true;
    if (msg.has_phases() || msg.has_placement()) {
      timing_.DecodeReported(stream->number, msg.has_phases() ? &msg.phases() : nullptr,
                             msg.has_placement() ? &msg.placement() : nullptr);
    }
    if (msg.has_need_remote_prefill()) StartPrefill(msg.need_remote_prefill());
    for (const v1::TokenOutput& t : msg.tokens()) {
      if (t.index() == 0 && t.sample_index() == 0 && route_ == "local") {
        cached_prompt_tokens_ =
            static_cast<uint32_t>(params_.prompt.size()) - msg.prompt_tokens_computed();
      }
      Deliver(t);
    }
    if (msg.finish_reason() != v1::FINISH_NONE) {
      std::optional<SampleOutputs<v1::TokenOutput>::Emission> last =
          samples_.Finish(msg.sample_index(), static_cast<SampleFinish>(msg.finish_reason()));
      if (last.has_value()) Send(std::move(*last));
    }
  }
  RunDeferred();
}

void GenerateCall::OnDecodeDone(DecodeStream* stream, const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    --outstanding_;
    if (stream == decode_stream_) decode_stream_ = nullptr;
    const std::shared_ptr<WorkerHandle>& worker = stream->worker();
    if (finished_ || cancelled_ || samples_.samples_left() == 0) {
      DecodeEnded(status);
    } else if (stream->lost) {
      const std::string reason = worker->lost_reason();
      lost_error_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 reason.empty() ? absl::StrCat("decode worker ", worker->name,
                                                               " stopped answering status polls")
                                                : reason);
      failed_decode_.push_back(worker->name);
      if (!MoveOn(stream->received, lost_error_.error_message())) DecodeEnded(lost_error_);
    } else if (IsTransportError(status) || status.error_code() == grpc::StatusCode::CANCELLED) {
      // Dead, or an error of D's own? Ask it. A CANCELLED the router did not
      // ask for (none of the cases above) is D's server going away, e.g. a
      // call that reached it as it exited after losing its device.
      auto probe = std::make_shared<UnaryCall<v1::GetStatusRequest, v1::WorkerStatus>>(
          params_.probe_timeout_ms);
      ++outstanding_;
      deferred_.push_back([self = shared_from_this(), probe, worker, status,
                           received = stream->received] {
        rpc::SignCall(worker->auth, &probe->context, rpc::kDecodeGetStatusMethod, probe->request);
        worker->decode_stub->async()->GetStatus(
            &probe->context, &probe->request, &probe->response,
            [self, probe, worker, status, received](grpc::Status probe_status) {
              self->OnProbeDone(worker, status, received, probe_status.ok(),
                                probe->response.ready());
            });
      });
    } else {
      DecodeEnded(status);
    }
  }
  RunDeferred();
}

void GenerateCall::OnProbeDone(std::shared_ptr<WorkerHandle> decode, grpc::Status stream_status,
                               bool received, bool decode_alive, bool decode_ready) {
  {
    absl::MutexLock lock(&mu_);
    --outstanding_;
    const bool unavailable = stream_status.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (decode_alive && unavailable) decode->NoteUnavailable(stream_status.error_message());
    if (decode_alive && !decode_ready && unavailable) {
      // D answers but is no longer ready: it ended the stream because it is
      // going away (the end of its SIGTERM drain, a lost device). Like a
      // dead D's, the stream moves to another decode worker if it can.
      failed_decode_.push_back(decode->name);
      const std::string why = absl::StrCat("decode worker ", decode->name,
                                           " is going away: ", stream_status.error_message());
      if (!MoveOn(received, why)) DecodeEnded(stream_status);
    } else if (decode_alive && unavailable && !received) {
      // A live, ready D refused the stream before any message: it did not
      // start the request (e.g. it serves the prefill role now, changed by
      // another router replica). Another decode worker may take it.
      failed_decode_.push_back(decode->name);
      const std::string why = absl::StrCat("decode worker ", decode->name,
                                           " refused the request: ", stream_status.error_message());
      if (!MoveOn(received, why)) DecodeEnded(stream_status);
    } else if (decode_alive) {
      if (stream_status.error_code() == grpc::StatusCode::CANCELLED) {
        // The client did not cancel: it must not read CANCELLED.
        stream_status =
            grpc::Status(grpc::StatusCode::UNAVAILABLE,
                         absl::StrCat("decode worker ", decode->name,
                                      " cancelled the request: ", stream_status.error_message()));
      }
      DecodeEnded(stream_status);  // D's own answer
    } else {
      failed_decode_.push_back(decode->name);
      // What another request already learnt of why D went (the registry's
      // reason, or D's last answer of its own, e.g. "device lost: ...")
      // names the cause better than this stream's transport error.
      const std::string known = decode->lost_reason();
      const std::string last = decode->last_unavailable(absl::Seconds(10));
      const std::string why =
          !known.empty()
              ? known
              : absl::StrCat("decode worker ", decode->name,
                             " failed: ", last.empty() ? stream_status.error_message() : last);
      // New requests and migrations skip it from now on.
      deferred_.push_back(
          [registry = registry_, decode, why] { registry->ReportUnreachable(decode, why); });
      if (!MoveOn(received, why)) {
        DecodeEnded(grpc::Status(grpc::StatusCode::UNAVAILABLE, why));
      }
    }
  }
  RunDeferred();
}

bool GenerateCall::CanMigrate() const {
  return !finished_ && !cancelled_ && samples_.samples_left() > 0 &&
         migrations_ < params_.max_migrations &&
         params_.request.route_override() != v1::ROUTE_REMOTE;
}

std::string GenerateCall::LogTag() const {
  const std::string& client = params_.request.client_request_id();
  return client.empty() ? absl::StrCat("request ", params_.request_id)
                        : absl::StrCat("request ", params_.request_id, " (client ", client, ")");
}

std::shared_ptr<WorkerHandle> GenerateCall::PickWorker(v1::WorkerRole role,
                                                       std::vector<std::string> avoid,
                                                       const std::string& kv_layout_id,
                                                       double max_queue_wait_s,
                                                       std::string* why_none) {
  PickRequest pick;
  pick.role = role;
  pick.prompt = params_.prompt;
  pick.avoid = std::move(avoid);
  pick.kv_layout_id = kv_layout_id;
  pick.max_queue_wait_s = max_queue_wait_s;
  PickResult result = registry_->Pick(pick);
  if (result.worker == nullptr && why_none != nullptr) *why_none = result.explanation;
  if (result.worker != nullptr) {
    rpc::Log(absl::StrCat(LogTag(), ": ", role == v1::ROLE_DECODE ? "decode" : "prefill",
                          " worker ", result.worker->name, " (", result.explanation, ")"));
  }
  return std::move(result.worker);
}

bool GenerateCall::MoveOn(bool received, const std::string& why) {
  if (finished_ || cancelled_ || samples_.samples_left() == 0) return false;
  // A stream that never answered did not start the request there: sending
  // it to another decode worker is routing, not a migration (no budget; the
  // failed workers are skipped, so this ends).
  const bool reroute = !received;
  if (!reroute && !CanMigrate()) return false;
  std::shared_ptr<WorkerHandle> next = PickWorker(v1::ROLE_DECODE, failed_decode_);
  if (next == nullptr) return false;
  if (!reroute) ++migrations_;
  CancelPrefillCalls();  // whatever P still does was for the old D's receiver
  rpc::Log(reroute ? absl::StrCat(LogTag(), ": ", why, "; sending it to ", next->name)
                   : absl::StrCat(
                         LogTag(), ": ", why, "; migrating to ", next->name,
                         samples_.size() == 1
                             ? absl::StrCat(" at output index ", samples_.next_index(0))
                             : absl::StrCat(" (", samples_.samples_left(), " of ", samples_.size(),
                                            " samples, each at its own output index)"),
                         " (migration ", migrations_, " of ", params_.max_migrations, ")"));
  StartDecode(std::move(next));
  return true;
}

void GenerateCall::DecodeEnded(grpc::Status status) {
  decode_ended_ = true;
  decode_status_ = std::move(status);
  if (!decode_status_.ok() && decode_status_.error_code() != grpc::StatusCode::CANCELLED) {
    CancelPrefillCalls();  // D failed: stop P's work too
  }
  MaybeFinish();
}

void GenerateCall::StartPrefill(const v1::NeedRemotePrefill& need) {
  const uint32_t attempt = need.kv_target().attempt();
  for (const std::shared_ptr<PrefillCall>& call : prefill_calls_) {
    if (call->attempt < attempt && !call->superseded) {
      // D gave up on that attempt (its KV connection failed first): that
      // worker failed this request even if its reply has not come yet.
      call->superseded = true;
      call->context.TryCancel();
      if (std::find(failed_prefill_.begin(), failed_prefill_.end(), call->worker->name) ==
          failed_prefill_.end()) {
        failed_prefill_.push_back(call->worker->name);
      }
    }
  }
  // Only a P whose KV layout equals D's can feed it, and only one whose
  // queue lets it start before the request's deadline. The Prefill call
  // has no shorter deadline of its own: a request queued behind others on
  // a busy P is not a failed one (issue #32); a P that stops is seen by
  // the registry's polls and by D's KV silence bound.
  const std::string layout = decode_ != nullptr ? decode_->kv_layout_id : std::string();
  const auto call_deadline = params_.deadline;
  const double time_left_s =
      std::chrono::duration<double>(call_deadline - std::chrono::system_clock::now()).count();
  std::string too_busy;
  std::shared_ptr<WorkerHandle> prefill =
      PickWorker(v1::ROLE_PREFILL, failed_prefill_, layout, time_left_s, &too_busy);
  if (prefill == nullptr) {
    // D prefills itself (conditional disaggregation's fallback), unless
    // the request forbids it.
    std::string why = failed_prefill_.empty()
                          ? std::string("no healthy prefill worker")
                          : absl::StrCat("no healthy prefill worker left (failed: ",
                                         absl::StrJoin(failed_prefill_, ", "), ")");
    if (!too_busy.empty()) {
      why = failed_prefill_.empty()
                ? too_busy
                : absl::StrCat(too_busy, " (failed: ", absl::StrJoin(failed_prefill_, ", "), ")");
    } else if (failed_prefill_.empty() && !layout.empty() &&
               registry_->HasRoutable(v1::ROLE_PREFILL)) {
      why = absl::StrCat("no healthy prefill worker with the KV layout of decode worker ",
                         decode_->name, " (", layout, ")");
    }
    AbortTransfer(attempt, std::move(why), /*no_prefill_worker=*/true);
    return;
  }
  route_ = "remote";
  if (prefill_name_.empty()) {
    prefill_name_ = prefill->name;
    EmitHeader();
  }
  auto call = std::make_shared<PrefillCall>();
  call->attempt = attempt;
  call->worker = prefill;
  call->started = std::chrono::steady_clock::now();
  call->context.set_deadline(call_deadline);
  v1::PrefillRequest& req = call->request;
  req.set_request_id(worker_request_id_);
  req.mutable_prompt_token_ids()->Add(params_.prompt.begin(), params_.prompt.end());
  req.set_max_tokens(params_.request.max_tokens());
  *req.mutable_sampling() = params_.request.sampling();
  *req.mutable_controls() = params_.controls;
  *req.mutable_kv_target() = need.kv_target();  // D's target, untouched
  prefill_calls_.push_back(call);
  ++outstanding_;
  deferred_.push_back([self = shared_from_this(), call] {
    call->guard.emplace(call->worker, self, call->request.prompt_token_ids_size());
    rpc::SignCall(call->worker->auth, &call->context, rpc::kPrefillPrefillMethod, call->request);
    call->worker->prefill_stub->async()->Prefill(
        &call->context, &call->request, &call->response,
        [self, call](grpc::Status status) { self->OnPrefillDone(call, status); });
  });
}

void GenerateCall::OnPrefillDone(const std::shared_ptr<PrefillCall>& call,
                                 const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    --outstanding_;
    prefill_calls_.erase(std::find(prefill_calls_.begin(), prefill_calls_.end(), call));
    if (status.ok()) {
      if (!call->superseded && !finished_) {
        served_prefill_ = call->worker->name;
        timing_.PrefillDelivered(call->started, call->response.phases());
        cached_prompt_tokens_ =
            static_cast<uint32_t>(params_.prompt.size()) - call->response.prompt_tokens_computed();
        for (const v1::TokenOutput& t : call->response.first_tokens()) Deliver(t);
      }
    } else if (!call->superseded && !finished_ && !cancelled_ && samples_.samples_left() > 0) {
      const std::string& name = call->worker->name;
      const std::string lost_reason = call->lost ? call->worker->lost_reason() : "";
      const std::string reason =
          !call->lost ? absl::StrCat("prefill worker ", name, ": ", status.error_message())
          : lost_reason.empty()
              ? absl::StrCat("prefill worker ", name, " stopped answering status polls")
              : lost_reason;
      prefill_error_ =
          grpc::Status(call->lost ? grpc::StatusCode::UNAVAILABLE : status.error_code(), reason);
      failed_prefill_.push_back(name);
      rpc::Log(
          absl::StrCat(LogTag(), ": remote prefill attempt ", call->attempt, " failed: ", reason));
      // D decides (conditional.on_prefill_failure); it may have seen the
      // failure on its KV connection already.
      if (decode_stream_ != nullptr) AbortTransfer(call->attempt, reason, false);
    }
    MaybeFinish();
  }
  RunDeferred();
}

void GenerateCall::AbortTransfer(uint32_t attempt, std::string reason, bool no_prefill_worker) {
  if (decode_ == nullptr) return;
  auto abort = std::make_shared<UnaryCall<v1::AbortTransferRequest, v1::AbortTransferResponse>>(
      params_.probe_timeout_ms);
  abort->request.set_request_id(worker_request_id_);
  abort->request.set_attempt(attempt);
  abort->request.set_reason(std::move(reason));
  abort->request.set_no_prefill_worker(no_prefill_worker);
  deferred_.push_back([abort, worker = decode_] {
    rpc::SignCall(worker->auth, &abort->context, rpc::kDecodeAbortTransferMethod, abort->request);
    worker->decode_stub->async()->AbortTransfer(&abort->context, &abort->request, &abort->response,
                                                [abort, worker](grpc::Status) {});
  });
}

bool GenerateCall::RestartAfterLostFirstToken() {
  // D finished from the KV P sent, but P's reply (token 0 of each sample)
  // was lost: P died after writing FINAL. Nothing reached the client yet,
  // so the request runs again from the start, once.
  if (restarted_ || cancelled_ || !decode_status_.ok() || prefill_error_.ok() ||
      samples_.samples_left() == 0) {
    return false;
  }
  if (samples_.progressed()) return false;
  std::shared_ptr<WorkerHandle> next = PickWorker(v1::ROLE_DECODE, {});
  if (next == nullptr) return false;
  restarted_ = true;
  rpc::Log(absl::StrCat(LogTag(), ": token 0 was lost with ", prefill_error_.error_message(),
                        "; running the request again on ", next->name));
  decode_ended_ = false;  // StartDecode forgets the samples' buffered tokens and ends
  StartDecode(std::move(next));
  return true;
}

void GenerateCall::MaybeFinish() {
  if (!finished_ && decode_ended_ && prefill_calls_.empty() && !RestartAfterLostFirstToken()) {
    finished_ = true;
    grpc::Status status = decode_status_;
    if (samples_.samples_left() == 0 && !cancelled_) {
      // Every sample ended (the cancel that followed is ours).
      status = grpc::Status::OK;
    } else {
      // P's answer names the cause better than D's cancelled stream, and a
      // request error of P's (bad argument, capacity) keeps its code.
      const bool request_error =
          !prefill_error_.ok() && !IsTransportError(prefill_error_) &&
          prefill_error_.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
          prefill_error_.error_code() != grpc::StatusCode::CANCELLED;
      if (!prefill_error_.ok() &&
          (status.ok() || status.error_code() == grpc::StatusCode::CANCELLED || request_error)) {
        status = prefill_error_;
      }
      if (!lost_error_.ok() && status.error_code() == grpc::StatusCode::CANCELLED) {
        status = lost_error_;
      }
      if (cancelled_) status = grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled");
      if (status.ok()) {
        for (uint32_t s = 0; s < samples_.size(); ++s) {
          if (samples_.done(s)) continue;
          status = grpc::Status(
              grpc::StatusCode::INTERNAL,
              absl::StrCat(
                  "sample ", s, ": ",
                  samples_.reported(s) == SampleFinish::kNone
                      ? "the decode worker reported no end"
                      : absl::StrCat("token index ", samples_.next_index(s), " never arrived")));
          break;
        }
      }
      if (status.error_code() != grpc::StatusCode::CANCELLED) {
        rpc::Log(absl::StrCat(LogTag(), " failed: ", status.error_message()));
      }
    }
    const RouterMetrics::Route route = decode_streams_ == 0 ? RouterMetrics::Route::kNone
                                       : route_ == "remote" ? RouterMetrics::Route::kRemote
                                                            : RouterMetrics::Route::kLocal;
    timer_.Finished(absl::Now(), route, static_cast<absl::StatusCode>(status.error_code()),
                    ToProto(samples_.sent(0)), cached_prompt_tokens_);
    sink_->Finish(status);
  }
  if (finished_ && outstanding_ == 0 && on_done_) {
    deferred_.push_back(std::move(on_done_));
    on_done_ = nullptr;
  }
}

void GenerateCall::EmitHeader() {
  if (header_sent_) return;
  header_sent_ = true;
  v1::GenerateResponse msg;
  msg.set_request_id(params_.request_id);
  msg.set_client_request_id(params_.request.client_request_id());
  msg.set_route(route_);
  msg.set_prefill_worker(prefill_name_);
  msg.set_decode_worker(decode_ == nullptr ? "" : decode_->name);
  msg.mutable_prompt_token_ids()->Add(params_.prompt.begin(), params_.prompt.end());
  msg.set_prompt_tokens(static_cast<uint32_t>(params_.prompt.size()));
  msg.set_seed(params_.request.sampling().seed());
  sink_->Write(std::move(msg));
}

void GenerateCall::TokensEmitted(uint32_t s, int64_t n) {
  if (params_.on_tokens_emitted) params_.on_tokens_emitted(n);
  timer_.TokensSent(s, n, absl::Now());
  if (n > 0) timing_.TokenSent(std::chrono::steady_clock::now());
}

void GenerateCall::Deliver(const v1::TokenOutput& token) {
  for (SampleOutputs<v1::TokenOutput>::Emission& emission : samples_.Deliver(token)) {
    Send(std::move(emission));
  }
}

void GenerateCall::Send(SampleOutputs<v1::TokenOutput>::Emission emission) {
  const uint32_t s = emission.sample_index;
  v1::GenerateResponse msg;
  msg.set_sample_index(s);
  const int n = static_cast<int>(emission.tokens.size());
  for (v1::TokenOutput& t : emission.tokens) *msg.add_tokens() = std::move(t);
  msg.set_text(std::move(emission.text));
  msg.set_completion_tokens(emission.completion_tokens);
  if (!emission.end.has_value()) {
    TokensEmitted(s, n);
    EmitHeader();
    sink_->Write(std::move(msg));
    return;
  }
  const SampleEnd& end = *emission.end;
  EmitHeader();
  // Free the sample's KV on D now; the others go on.
  if (end.stopped_early && samples_.size() > 1 && samples_.samples_left() > 0 &&
      decode_ != nullptr) {
    CancelSample(s);
  }
  if (n > 0) TokensEmitted(s, n);
  // Who served, as it turned out (the header named the first picks).
  const bool remote = !served_prefill_.empty();
  msg.set_route(remote ? "remote" : "local");
  *msg.mutable_placement() = timing_.Placement(remote);
  *msg.mutable_timing() = timing_.Timing(std::chrono::steady_clock::now());
  if (s == 0) timer_.PhasesKnown(msg.timing(), remote);
  msg.set_prefill_worker(served_prefill_);
  msg.set_decode_worker(decode_ == nullptr ? "" : decode_->name);
  msg.set_finish_reason(ToProto(end.finish));
  if (end.stop_string.has_value()) msg.mutable_stop_reason()->set_text(*end.stop_string);
  if (end.stop_token_id.has_value()) msg.mutable_stop_reason()->set_token_id(*end.stop_token_id);
  msg.set_prompt_tokens(static_cast<uint32_t>(params_.prompt.size()));
  msg.set_cached_prompt_tokens(cached_prompt_tokens_);
  sink_->Write(std::move(msg));
  if (samples_.samples_left() == 0) {
    // Nothing more to stream: stop whatever the workers still do for it.
    CancelCalls();
  }
}

void GenerateCall::CancelSample(uint32_t s) {
  struct CancelCall {
    grpc::ClientContext context;
    v1::CancelSampleRequest request;
    v1::CancelSampleResponse response;
  };
  auto call = std::make_shared<CancelCall>();
  call->context.set_deadline(params_.deadline);
  call->request.set_request_id(worker_request_id_);
  call->request.set_sample_index(s);
  rpc::SignCall(decode_->auth, &call->context, rpc::kDecodeCancelSampleMethod, call->request);
  decode_->decode_stub->async()->CancelSample(&call->context, &call->request, &call->response,
                                              [call, worker = decode_](grpc::Status) {});
}

}  // namespace tandem::router
