#include "router/generate_call.h"

#include <algorithm>
#include <limits>
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
      sink_(std::move(sink)) {
  decode_ctx_.set_deadline(params_.deadline);
  prefill_ctx_.set_deadline(std::min(
      params_.deadline,
      std::chrono::system_clock::now() + std::chrono::milliseconds(params_.prefill_timeout_ms)));
  const v1::GenerateRequest& request = params_.request;
  stop_criteria_.eog_token_ids = tokenizer_->eog_ids();
  std::sort(stop_criteria_.eog_token_ids.begin(), stop_criteria_.eog_token_ids.end());
  // Only the stop-token part of CheckStop is asked here.
  stop_criteria_.context_length = std::numeric_limits<int32_t>::max();
  stop_token_ids_.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  std::sort(stop_token_ids_.begin(), stop_token_ids_.end());
  const StopStringMatcher stops({request.stop().begin(), request.stop().end()},
                                request.include_stop_str_in_output());
  const uint32_t n = request.has_n() ? request.n() : 1;
  absl::MutexLock lock(&mu_);
  for (uint32_t s = 0; s < n; ++s) samples_.emplace_back(*tokenizer_, stops);
  samples_left_ = n;
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
  msg.set_decode_worker(decode_ == nullptr ? "" : decode_->name);
  msg.mutable_prompt_token_ids()->Add(params_.prompt.begin(), params_.prompt.end());
  msg.set_prompt_tokens(static_cast<uint32_t>(params_.prompt.size()));
  msg.set_seed(params_.request.sampling().seed());
  sink_->Write(std::move(msg));
}

void GenerateCall::Deliver(const v1::TokenOutput& token) {
  const uint32_t s = token.sample_index();
  if (s >= samples_.size()) return;  // never sent by a worker of this build
  SampleStream& sample = samples_[s];
  if (sample.done || token.index() < sample.next_index) return;  // ended, or a duplicate
  sample.pending[token.index()] = token;
  v1::GenerateResponse msg;
  msg.set_sample_index(s);
  const int64_t min_tokens = params_.request.min_tokens();
  while (!sample.pending.empty() && sample.pending.begin()->first == sample.next_index) {
    const v1::TokenOutput& t = sample.pending.begin()->second;
    *msg.add_tokens() = t;
    sample.last_token = t.token_id();
    // vLLM checks stop strings once the output holds min_tokens tokens.
    const int64_t num_generated = static_cast<int64_t>(t.index()) + 1;
    const bool check = num_generated >= min_tokens;
    // A token that ends the sample as a stop token (an end-of-generation
    // or stop_token_ids id) keeps its id but not its text, unless
    // include_stop_str_in_output (vLLM's detokenizer skips it).
    const core::RequestStops stops{stop_token_ids_, params_.request.ignore_eos(), min_tokens,
                                   std::numeric_limits<int64_t>::max()};
    const bool stop_token =
        !params_.request.include_stop_str_in_output() &&
        core::CheckStop(stop_criteria_, stops, t.token_id(), num_generated, 0) ==
            core::FinishReason::kStop;
    StopPush pushed =
        sample.matcher.Push(stop_token ? std::string() : sample.decoder.Push(t.token_id()), check);
    sample.pending.erase(sample.pending.begin());
    ++sample.next_index;
    if (pushed.stopped()) {
      EmitHeader();
      msg.set_completion_tokens(sample.next_index);
      msg.mutable_text()->append(pushed.text);
      v1::StopReason reason;
      reason.set_text(sample.matcher.stops()[pushed.stop_index]);
      // Tokens after the match never reach the client.
      sample.pending.clear();
      if (samples_.size() > 1 && samples_left_ > 1 && decode_ != nullptr) {
        // Free the sample's KV on D now; the others go on.
        struct CancelCall {
          grpc::ClientContext context;
          v1::CancelSampleRequest request;
          v1::CancelSampleResponse response;
        };
        auto call = std::make_shared<CancelCall>();
        call->context.set_deadline(params_.deadline);
        call->request.set_request_id(params_.request_id);
        call->request.set_sample_index(s);
        decode_->decode_stub->async()->CancelSample(
            &call->context, &call->request, &call->response,
            [call, worker = decode_](grpc::Status) {});
      }
      EndSample(s, std::move(*msg.mutable_text()), v1::FINISH_STOP, &reason, &msg);
      return;
    }
    msg.mutable_text()->append(pushed.text);
  }
  if (msg.tokens_size() > 0) {
    EmitHeader();
    msg.set_completion_tokens(sample.next_index);
    sink_->Write(std::move(msg));
  }
  MaybeEndSample(s);
}

void GenerateCall::SampleFinished(uint32_t s, v1::FinishReason reason) {
  if (s >= samples_.size() || samples_[s].done) return;
  samples_[s].finish = reason;
  MaybeEndSample(s);
}

void GenerateCall::MaybeEndSample(uint32_t s) {
  SampleStream& sample = samples_[s];
  // D reports a sample's end after its tokens; only a remote token 0 (from
  // P's reply) may still be on its way.
  if (sample.done || sample.finish == v1::FINISH_NONE || !sample.pending.empty() ||
      sample.next_index == 0) {
    return;
  }
  const int64_t min_tokens = params_.request.min_tokens();
  StopPush pushed = sample.matcher.Push(sample.decoder.Flush(),
                                        static_cast<int64_t>(sample.next_index) >= min_tokens);
  v1::StopReason reason;
  if (pushed.stopped()) {
    reason.set_text(sample.matcher.stops()[pushed.stop_index]);
    EndSample(s, std::move(pushed.text), v1::FINISH_STOP, &reason, nullptr);
    return;
  }
  std::string text = std::move(pushed.text) + sample.matcher.Flush();
  const v1::GenerateRequest& request = params_.request;
  const std::vector<int32_t>& eog = tokenizer_->eog_ids();
  const bool eog_stop = !request.ignore_eos() &&
                        std::find(eog.begin(), eog.end(), sample.last_token) != eog.end();
  const auto& stop_ids = request.stop_token_ids();
  if (sample.finish == v1::FINISH_STOP && !eog_stop &&
      std::find(stop_ids.begin(), stop_ids.end(), sample.last_token) != stop_ids.end()) {
    reason.set_token_id(sample.last_token);  // as vLLM: an EOS stop has no stop_reason
    EndSample(s, std::move(text), sample.finish, &reason, nullptr);
    return;
  }
  EndSample(s, std::move(text), sample.finish, nullptr, nullptr);
}

void GenerateCall::EndSample(uint32_t s, std::string text, v1::FinishReason reason,
                             const v1::StopReason* stop_reason, v1::GenerateResponse* with) {
  SampleStream& sample = samples_[s];
  sample.done = true;
  EmitHeader();
  v1::GenerateResponse last;
  if (with != nullptr) last = std::move(*with);  // the tokens of this push
  last.set_sample_index(s);
  last.set_text(std::move(text));
  last.set_finish_reason(reason);
  if (stop_reason != nullptr) *last.mutable_stop_reason() = *stop_reason;
  last.set_prompt_tokens(static_cast<uint32_t>(params_.prompt.size()));
  last.set_completion_tokens(sample.next_index);
  last.set_cached_prompt_tokens(cached_prompt_tokens_);
  sink_->Write(std::move(last));
  if (--samples_left_ == 0) {
    // Nothing more to stream: stop whatever the workers still do for it.
    decode_ctx_.TryCancel();
    prefill_ctx_.TryCancel();
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
  *req.mutable_controls() = params_.controls;
  auto* target = req.mutable_kv_target();
  target->set_endpoint(need.kv_endpoint());
  target->set_request_id(params_.request_id);
  target->set_attempt(need.attempt());
  target->set_hit_tokens(need.hit_tokens());
  v1::PrefillResponse resp;
  grpc::Status s = prefill->prefill_stub->Prefill(&prefill_ctx_, req, &resp);
  absl::MutexLock lock(&mu_);
  if (!s.ok()) {
    if (samples_left_ == 0) return;  // cancelled because every sample had ended
    prefill_error_ = grpc::Status(s.error_code(), absl::StrCat("prefill worker ", prefill->name,
                                                               ": ", s.error_message()));
    decode_ctx_.TryCancel();
    return;
  }
  cached_prompt_tokens_ =
      static_cast<uint32_t>(params_.prompt.size()) - resp.prompt_tokens_computed();
  for (const v1::TokenOutput& t : resp.first_tokens()) Deliver(t);
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
    decode_ = decode;
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
  *dreq.mutable_controls() = params_.controls;
  auto reader = decode->decode_stub->Generate(&decode_ctx_, dreq);

  std::thread prefill_thread;
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
      if (t.index() == 0 && t.sample_index() == 0 && route_ == "local") {
        cached_prompt_tokens_ =
            static_cast<uint32_t>(params_.prompt.size()) - msg.prompt_tokens_computed();
      }
      Deliver(t);
    }
    if (msg.finish_reason() != v1::FINISH_NONE) {
      SampleFinished(msg.sample_index(), msg.finish_reason());
    }
  }
  grpc::Status status = reader->Finish();
  if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
    // D failed (e.g. the KV transfer timed out): stop P's work too.
    prefill_ctx_.TryCancel();
  }
  if (prefill_thread.joinable()) prefill_thread.join();

  absl::MutexLock lock(&mu_);
  if (samples_left_ == 0 && !cancelled_) {
    // Every sample ended (the cancel that followed is ours).
    sink_->Finish(grpc::Status::OK);
    return;
  }
  if (!prefill_pick_error.ok()) status = prefill_pick_error;
  if (!prefill_error_.ok() && (status.ok() || status.error_code() == grpc::StatusCode::CANCELLED)) {
    status = prefill_error_;
  }
  if (!lost_error_.ok()) status = lost_error_;
  if (cancelled_) status = grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled");
  if (status.ok()) {
    for (size_t s = 0; s < samples_.size(); ++s) {
      if (samples_[s].done) continue;
      status = grpc::Status(
          grpc::StatusCode::INTERNAL,
          absl::StrCat("sample ", s, ": ",
                       samples_[s].finish == v1::FINISH_NONE
                           ? "the decode worker reported no end"
                           : absl::StrCat("token index ", samples_[s].next_index,
                                          " never arrived")));
      break;
    }
  }
  if (status.error_code() != grpc::StatusCode::CANCELLED) {
    rpc::Log(absl::StrCat("request ", params_.request_id, " failed: ", status.error_message()));
  }
  sink_->Finish(status);
}

}  // namespace tandem::router
