#include "router/generate_call.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/server/log.h"

namespace tandem::router {
namespace {

// While a request uses a worker: counts it as active there, and fails the
// request if the registry marks the worker unhealthy.
struct ActiveGuard {
  std::shared_ptr<WorkerHandle> w;
  uint64_t lost_token;
  ActiveGuard(std::shared_ptr<WorkerHandle> worker, GenerateCall* call)
      : w(std::move(worker)),
        lost_token(w->AddLostCallback([call, name = w->name] { call->WorkerLost(name); })) {
    ++w->active_requests;
  }
  ~ActiveGuard() {
    w->RemoveLostCallback(lost_token);
    --w->active_requests;
  }
};

}  // namespace

GenerateCall::GenerateCall(Params params, const WorkerRegistry* registry,
                           const tokenizer::Tokenizer* tokenizer, std::shared_ptr<Sink> sink)
    : params_(std::move(params)),
      registry_(registry),
      tokenizer_(tokenizer),
      sink_(std::move(sink)),
      decoder_(*tokenizer) {
  decode_ctx_.set_deadline(params_.deadline);
  prefill_ctx_.set_deadline(std::min(
      params_.deadline,
      std::chrono::system_clock::now() + std::chrono::milliseconds(params_.prefill_timeout_ms)));
}

void GenerateCall::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  decode_ctx_.TryCancel();
  prefill_ctx_.TryCancel();
}

void GenerateCall::WorkerLost(const std::string& name) {
  absl::MutexLock lock(&mu_);
  lost_error_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                             absl::StrCat("worker ", name, " stopped answering status polls"));
  decode_ctx_.TryCancel();
  prefill_ctx_.TryCancel();
}

void GenerateCall::EmitHeader() {
  if (header_sent_) return;
  header_sent_ = true;
  v1::GenerateResponse msg;
  msg.set_request_id(params_.request_id);
  msg.set_client_request_id(params_.request.client_request_id());
  msg.set_route(route_);
  msg.set_prefill_worker(prefill_name_);
  msg.set_decode_worker(decode_name_);
  msg.mutable_prompt_token_ids()->Add(params_.prompt.begin(), params_.prompt.end());
  msg.set_prompt_tokens(static_cast<uint32_t>(params_.prompt.size()));
  msg.set_seed(params_.request.sampling().seed());
  sink_->Write(std::move(msg));
}

void GenerateCall::Deliver(const v1::TokenOutput& token) {
  if (token.index() < next_index_) return;  // duplicate
  pending_[token.index()] = token;
  v1::GenerateResponse msg;
  while (!pending_.empty() && pending_.begin()->first == next_index_) {
    const v1::TokenOutput& t = pending_.begin()->second;
    *msg.add_tokens() = t;
    msg.mutable_text()->append(decoder_.Push(t.token_id()));
    pending_.erase(pending_.begin());
    ++next_index_;
  }
  if (msg.tokens_size() > 0) {
    EmitHeader();
    msg.set_completion_tokens(next_index_);
    sink_->Write(std::move(msg));
  }
}

void GenerateCall::RunPrefill(std::shared_ptr<WorkerHandle> prefill,
                              const v1::NeedRemotePrefill& need) {
  ActiveGuard active(prefill, this);
  v1::PrefillRequest req;
  req.set_request_id(params_.request_id);
  req.mutable_prompt_token_ids()->Add(params_.prompt.begin(), params_.prompt.end());
  req.set_max_tokens(params_.request.max_tokens());
  *req.mutable_sampling() = params_.request.sampling();
  auto* target = req.mutable_kv_target();
  target->set_endpoint(need.kv_endpoint());
  target->set_request_id(params_.request_id);
  target->set_attempt(need.attempt());
  target->set_hit_tokens(need.hit_tokens());
  v1::PrefillResponse resp;
  grpc::Status s = prefill->prefill_stub->Prefill(&prefill_ctx_, req, &resp);
  absl::MutexLock lock(&mu_);
  if (!s.ok()) {
    prefill_error_ = grpc::Status(s.error_code(), absl::StrCat("prefill worker ", prefill->name,
                                                               ": ", s.error_message()));
    decode_ctx_.TryCancel();
    return;
  }
  cached_prompt_tokens_ =
      static_cast<uint32_t>(params_.prompt.size()) - resp.prompt_tokens_computed();
  if (resp.first_tokens_size() > 0) Deliver(resp.first_tokens(0));
}

void GenerateCall::Run() {
  std::shared_ptr<WorkerHandle> decode = registry_->Pick(v1::ROLE_DECODE);
  if (decode == nullptr) {
    sink_->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy decode worker"));
    return;
  }
  ActiveGuard active(decode, this);
  {
    absl::MutexLock lock(&mu_);
    decode_name_ = decode->name;
    if (cancelled_) {
      sink_->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled"));
      return;
    }
  }
  v1::DecodeGenerateRequest dreq;
  dreq.set_request_id(params_.request_id);
  dreq.mutable_prompt_token_ids()->Add(params_.prompt.begin(), params_.prompt.end());
  dreq.set_max_tokens(params_.request.max_tokens());
  *dreq.mutable_sampling() = params_.request.sampling();
  dreq.set_route_override(params_.request.route_override());
  auto reader = decode->decode_stub->Generate(&decode_ctx_, dreq);

  std::thread prefill_thread;
  v1::FinishReason finish = v1::FINISH_NONE;
  v1::DecodeGenerateResponse msg;
  grpc::Status prefill_pick_error;
  while (reader->Read(&msg)) {
    if (msg.has_need_remote_prefill()) {
      std::shared_ptr<WorkerHandle> prefill = registry_->Pick(v1::ROLE_PREFILL);
      if (prefill == nullptr) {
        prefill_pick_error =
            grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy prefill worker");
        decode_ctx_.TryCancel();
        continue;
      }
      {
        absl::MutexLock lock(&mu_);
        route_ = "remote";
        prefill_name_ = prefill->name;
        EmitHeader();
      }
      prefill_thread = std::thread([this, prefill, need = msg.need_remote_prefill()] {
        RunPrefill(prefill, need);
      });
    }
    absl::MutexLock lock(&mu_);
    for (const v1::TokenOutput& t : msg.tokens()) {
      if (t.index() == 0 && route_ == "local") {
        cached_prompt_tokens_ =
            static_cast<uint32_t>(params_.prompt.size()) - msg.prompt_tokens_computed();
      }
      Deliver(t);
    }
    if (msg.finish_reason() != v1::FINISH_NONE) finish = msg.finish_reason();
  }
  grpc::Status status = reader->Finish();
  if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
    // D failed (e.g. the KV transfer timed out): stop P's work too.
    prefill_ctx_.TryCancel();
  }
  if (prefill_thread.joinable()) prefill_thread.join();

  absl::MutexLock lock(&mu_);
  if (!prefill_pick_error.ok()) status = prefill_pick_error;
  if (!prefill_error_.ok() && (status.ok() || status.error_code() == grpc::StatusCode::CANCELLED)) {
    status = prefill_error_;
  }
  if (!lost_error_.ok()) status = lost_error_;
  if (cancelled_) status = grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled");
  if (status.ok() && !pending_.empty()) {
    status = grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat("token index ", next_index_, " never arrived"));
  }
  if (!status.ok()) {
    if (status.error_code() != grpc::StatusCode::CANCELLED) {
      rpc::Log(absl::StrCat("request ", params_.request_id, " failed: ", status.error_message()));
    }
    sink_->Finish(status);
    return;
  }
  EmitHeader();
  v1::GenerateResponse last;
  last.set_text(decoder_.Flush());
  last.set_finish_reason(finish);
  last.set_prompt_tokens(static_cast<uint32_t>(params_.prompt.size()));
  last.set_completion_tokens(next_index_);
  last.set_cached_prompt_tokens(cached_prompt_tokens_);
  sink_->Write(std::move(last));
  sink_->Finish(grpc::Status::OK);
}

}  // namespace tandem::router
