#include "router/router_service.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <thread>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/server/auth_call.h"
#include "common/server/authorized.h"
#include "common/server/log.h"
#include "common/server/proto_convert.h"
#include "common/server/raw_call.h"
#include "common/server/status_util.h"
#include "engine/core/request_validation.h"
#include "router/generate_call.h"
#include "router/request_prompt.h"
#include "router/stop_strings.h"

namespace tandem::router {
namespace {

// The engine's part of a public request (n unset -> 1).
v1::EngineControls ControlsOf(const v1::GenerateRequest& request) {
  v1::EngineControls c;
  c.mutable_stop_token_ids()->CopyFrom(request.stop_token_ids());
  c.set_ignore_eos(request.ignore_eos());
  c.set_min_tokens(request.min_tokens());
  c.set_logprobs(request.logprobs());
  c.set_n(request.has_n() ? request.n() : 1);
  return c;
}

// 128 random bits as 32 hex digits (DESIGN.md: the router mints request ids).
std::string MintRequestId(absl::BitGen& gen) {
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

}  // namespace

v1::Slo SloToProto(const SloConfig& slo) {
  v1::Slo out;
  out.set_ttft_ms(slo.ttft_ms.value_or(0));
  out.set_tpot_ms(slo.tpot_ms.value_or(0));
  return out;
}

RouterService::RouterService(const ModelBundle* model, ChatTemplate chat_template,
                             const RegistryOptions& registry_options,
                             const Admission::Options& admission_options, std::string name,
                             std::function<void(bool)> on_health_change)
    : model_(model),
      chat_template_(std::move(chat_template)),
      bos_text_(BosTokenText(*model->file, model->tokenizer->bos_id())),
      name_(std::move(name)),
      registry_(registry_options, std::move(on_health_change)),
      registry_service_(&registry_),
      admission_(admission_options, metrics_.AdmissionObserver()) {}

absl::StatusOr<std::vector<int32_t>> RouterService::PromptTokens(
    const v1::GenerateRequest& request) const {
  return TokenizeRequestPrompt(request, *model_->tokenizer, chat_template_, bos_text_);
}

absl::Status RouterService::AuthenticateHeader(const std::string* authorization) const {
  if (api_keys_ == nullptr) return absl::OkStatus();
  return api_keys_->Authenticate(authorization).status();
}

absl::StatusOr<std::vector<int32_t>> RouterService::Validate(
    const v1::GenerateRequest& request) const {
  absl::StatusOr<std::vector<int32_t>> prompt = PromptTokens(request);
  if (!prompt.ok()) return prompt.status();
  if (absl::StatusOr<core::RouteChoice> route = RouteFromProto(request.route_override());
      !route.ok()) {
    return route.status();
  }
  const model::LlamaConfig& config = model_->model->config();
  absl::Status s = core::ValidateGeneration(
      *prompt, request.max_tokens(), config.context_length, config.vocab_size,
      SamplingFromProto(request.sampling(), request.logprobs()));
  if (!s.ok()) return s;
  s = ValidateStopStrings({request.stop().begin(), request.stop().end()});
  if (!s.ok()) return s;
  const core::GenerationControls controls = ControlsFromProto(ControlsOf(request));
  s = core::ValidateControls(request.has_n() ? int64_t{request.n()} : 1, controls.min_tokens,
                             request.max_tokens(), controls.stop_token_ids, config.vocab_size);
  if (!s.ok()) return s;
  return prompt;
}

absl::StatusOr<int> RouterService::Authenticate(const grpc::CallbackServerContext* context) const {
  if (api_keys_ == nullptr) return -1;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  absl::StatusOr<int> key;
  if (it == metadata.end()) {
    key = api_keys_->Authenticate(nullptr);
  } else {
    const std::string value(it->second.data(), it->second.size());
    key = api_keys_->Authenticate(&value);
  }
  // Who knocked and why, never what they sent.
  if (!key.ok()) {
    rpc::Log(absl::StrCat("refused a call from ", context->peer(), ": ", key.status().message()));
  }
  return key;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RouterService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  const absl::Time arrival = absl::Now();
  const auto steady_arrival = std::chrono::steady_clock::now();
  absl::StatusOr<int> key = Authenticate(context);
  if (!key.ok()) {
    metrics_.RequestRefused(key.status().code());
    return rpc::FinishedStream(rpc::ToGrpc(key.status()));
  }
  bool parsed_ok = false;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor =
      rpc::ServeStream<v1::GenerateRequest>(request, [&](const v1::GenerateRequest* parsed) {
        parsed_ok = true;
        return GenerateParsed(context, parsed, *key, arrival, steady_arrival);
      });
  // ParseStrict's only error.
  if (!parsed_ok) metrics_.RequestRefused(absl::StatusCode::kInvalidArgument);
  return reactor;
}

void RouterService::Refuse(GenerateCall::Sink& sink, const absl::Status& status,
                           GenerateCall::Sink::Trailers trailers) {
  metrics_.RequestRefused(status.code());
  sink.Finish(rpc::ToGrpc(status), std::move(trailers));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RouterService::GenerateParsed(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request, int key,
    absl::Time arrival, std::chrono::steady_clock::time_point steady_arrival) {
  // What OnCancel reaches: the call (once created) and its admission id
  // (once submitted; a queued request leaves the queue at once).
  struct CancelState {
    absl::Mutex mu;
    std::shared_ptr<GenerateCall> call ABSL_GUARDED_BY(mu);
    uint64_t admission_id ABSL_GUARDED_BY(mu) = 0;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
  };
  auto cancel = std::make_shared<CancelState>();
  auto [reactor, sink] = GenerateCall::Sink::Create(
      [this, cancel] {
        std::shared_ptr<GenerateCall> call;
        uint64_t id = 0;
        {
          absl::MutexLock lock(&cancel->mu);
          cancel->cancelled = true;
          call = cancel->call;
          id = cancel->admission_id;
        }
        if (call) call->Cancel();
        if (id != 0) admission_.Cancel(id);
      },
      context);
  if (!accepting_) {
    Refuse(*sink, absl::UnavailableError("router is shutting down"));
    return reactor;
  }
  auto prompt = Validate(*request);
  if (!prompt.ok()) {
    Refuse(*sink, prompt.status());
    return reactor;
  }
  static absl::Mutex gen_mu;
  GenerateCall::Params params;
  {
    static absl::BitGen gen;
    absl::MutexLock lock(&gen_mu);
    params.request_id = MintRequestId(gen);
    params.request = *request;
    if (!request->sampling().has_seed()) {
      params.request.mutable_sampling()->set_seed(absl::Uniform<uint64_t>(gen));
      params.request.mutable_sampling()->set_has_seed(true);
    }
  }
  params.prompt = std::move(*prompt);
  const int64_t prompt_tokens = static_cast<int64_t>(params.prompt.size());
  // What the request may use, reserved from the key's bucket; the
  // generated tokens it did not use go back when it ends.
  const ApiKeys::Reservation reservation{prompt_tokens, int64_t{request->max_tokens()},
                                         request->has_n() ? int64_t{request->n()} : 1};
  auto generated = std::make_shared<std::atomic<int64_t>>(0);
  // The key's limits before the router's admission: a refused key holds no
  // slot and no place in the queue.
  if (key >= 0) {
    ApiKeys::Decision d = api_keys_->Admit(key, reservation);
    if (!d.status.ok()) {
      if (d.retry_after_ms < 0) {
        Refuse(*sink, d.status);
      } else {
        Refuse(*sink, d.status, {{"retry-after-ms", absl::StrCat(d.retry_after_ms)}});
      }
      return reactor;
    }
    params.on_tokens_emitted = [keys = api_keys_.get(), key, generated](int64_t n) {
      generated->fetch_add(n);
      keys->Generated(key, n);
    };
  }
  params.controls = ControlsOf(*request);
  params.max_migrations = max_migrations_;
  params.probe_timeout_ms = probe_timeout_ms_;
  // A client without a deadline still gets one: no call waits forever (in
  // the admission queue or running).
  const auto max_deadline = std::chrono::system_clock::now() + std::chrono::hours(1);
  params.deadline = std::min(context->deadline(), max_deadline);
  params.metrics = &metrics_;
  params.arrival = arrival;
  params.steady_arrival = steady_arrival;
  const absl::Time deadline = absl::FromChrono(params.deadline);
  auto call =
      std::make_shared<GenerateCall>(std::move(params), &registry_, model_->tokenizer.get(), sink);
  {
    absl::MutexLock lock(&cancel->mu);
    cancel->call = call;
  }
  // Runs once the request holds an admission slot; the slot is released
  // once the call finished its sink and every call to a worker ended.
  // With a key: counted as started (its prompt charge kept) when it gets a
  // slot, ended with the slot (the unused part of its reservation given
  // back: every token reached the client before the call ended); refunded
  // in full if it never gets one.
  auto start = [this, call, key, prompt_tokens, reservation, generated] {
    metrics_.RequestStarted(prompt_tokens);
    if (key >= 0) api_keys_->Started(key, prompt_tokens);
    call->Start([this, key, reservation, generated] {
      if (key >= 0) api_keys_->Ended(key, reservation, generated->load());
      admission_.Release();
    });
  };
  auto drop = [this, sink, key, reservation](absl::Status s) {
    if (key >= 0) api_keys_->Refund(key, reservation);
    Refuse(*sink, s);
  };
  Admission::Ticket ticket = admission_.Submit(deadline, std::move(start), std::move(drop));
  if (!ticket.status.ok()) {
    if (key >= 0) api_keys_->Refund(key, reservation);
    Refuse(*sink, ticket.status, {{"retry-after-ms", absl::StrCat(ticket.retry_after_ms)}});
    return reactor;
  }
  if (ticket.queued) {
    bool cancelled = false;
    {
      absl::MutexLock lock(&cancel->mu);
      cancel->admission_id = ticket.id;
      cancelled = cancel->cancelled;
    }
    if (cancelled) admission_.Cancel(ticket.id);  // OnCancel ran before the id was known
  }
  return reactor;
}

grpc::ServerUnaryReactor* RouterService::Tokenize(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  if (absl::StatusOr<int> key = Authenticate(context); !key.ok()) {
    return rpc::FinishUnary(context, rpc::ToGrpc(key.status()));
  }
  return rpc::ServeUnary<v1::TokenizeRequest, v1::TokenizeResponse>(
      context, request, response,
      [this](const v1::TokenizeRequest* parsed, v1::TokenizeResponse* out) {
        return TokenizeParsed(parsed, out);
      });
}

grpc::Status RouterService::TokenizeParsed(const v1::TokenizeRequest* request,
                                           v1::TokenizeResponse* response) {
  // The same tokenization as Generate's `prompt` (with BOS if asked).
  tokenizer::EncodeOptions options;
  options.add_bos = request->add_bos();
  options.parse_special = !request->split_special_tokens();
  for (int32_t id : model_->tokenizer->Encode(request->text(), options)) {
    response->add_token_ids(id);
  }
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* RouterService::GetModelInfo(grpc::CallbackServerContext* context,
                                                      const v1::GetModelInfoRequest*,
                                                      v1::GetModelInfoResponse* response) {
  if (absl::StatusOr<int> key = Authenticate(context); !key.ok()) {
    return rpc::FinishUnary(context, rpc::ToGrpc(key.status()));
  }
  const model::LlamaConfig& config = model_->model->config();
  response->set_name(config.name);
  response->set_architecture(config.architecture);
  response->set_context_length(static_cast<uint32_t>(config.context_length));
  response->set_vocab_size(static_cast<uint32_t>(config.vocab_size));
  response->set_fingerprint(model_->fingerprint);
  response->set_bos_token_id(model_->tokenizer->bos_id());
  response->set_eos_token_id(model_->tokenizer->eos_id());
  for (int32_t id : model_->tokenizer->eog_ids()) response->add_eog_token_ids(id);
  response->set_chat_format(std::string(chat_template_.format_name()));
  *response->mutable_slo() = slo_;
  response->set_placement(placement_);
  return rpc::FinishUnary(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* RouterService::GetStatus(grpc::CallbackServerContext* context,
                                                   const v1::GetStatusRequest*,
                                                   v1::ClusterStatus* response) {
  absl::StatusOr<int> caller = Authenticate(context);
  if (!caller.ok()) return rpc::FinishUnary(context, rpc::ToGrpc(caller.status()));
  // The workers are asked asynchronously (all at once, each with
  // rpc_timeout_ms); the last answer finishes the call. No thread waits.
  auto* reactor = context->DefaultReactor();
  const int key = *caller;  // -1 without api keys
  registry_.StatusAllAsync([this, reactor, response, key](std::vector<v1::WorkerStatus> workers) {
    for (v1::WorkerStatus& w : workers) *response->add_workers() = std::move(w);
    const bool can_serve = registry_.CanServe();
    v1::WorkerStatus* self = response->mutable_router();
    self->set_name(name_);
    self->set_role(v1::ROLE_ROUTER);
    self->set_address(address_);
    self->set_ready(can_serve);
    self->set_healthy(true);
    self->set_running_requests(static_cast<uint32_t>(admission_.running()));
    self->set_queued_requests(static_cast<uint32_t>(admission_.queued()));
    self->set_model_fingerprint(model_->fingerprint);
    const RouterMetrics::Totals totals = metrics_.totals();
    self->set_router_requests_total(totals.requests);
    self->set_router_request_errors_total(totals.request_errors);
    self->set_router_prompt_tokens_total(totals.prompt_tokens);
    self->set_router_generation_tokens_total(totals.generation_tokens);
    self->set_router_prompt_tokens_cached_total(totals.prompt_tokens_cached);
    response->set_can_serve(can_serve);
    *response->mutable_slo() = slo_;
    response->set_placement(placement_);
    response->set_api_keys_required(api_keys_ != nullptr);
    if (api_keys_ != nullptr) {
      for (const ApiKeys::Usage& u : api_keys_->SnapshotFor(key)) {
        v1::ApiKeyUsage* out = response->add_api_keys();
        out->set_name(u.name);
        out->set_requests(u.requests);
        out->set_refused(u.refused);
        out->set_prompt_tokens(u.prompt_tokens);
        out->set_generated_tokens(u.generated_tokens);
        out->set_in_flight(static_cast<uint32_t>(u.in_flight));
        out->set_tokens_available(u.tokens_available);
        out->set_tokens_per_minute(static_cast<uint64_t>(u.tokens_per_minute));
        out->set_max_concurrent_requests(static_cast<uint32_t>(u.max_concurrent_requests));
      }
    }
    response->set_cluster_auth(
        std::string(registry_.auth() != nullptr ? registry_.auth()->mode() : "open"));
    if (planner_ != nullptr) *response->mutable_planner() = planner_->Status();
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

RouterService::~RouterService() {
  StopPlanner();
  role_changer_.reset();
}

void RouterService::StartRoleControl(const ClusterConfig& config) {
  RoleChangerOptions options;
  options.drain_timeout_ms = config.router.role_drain_timeout_ms;
  options.rpc_timeout_ms = config.router.rpc_timeout_ms;
  role_changer_ = std::make_unique<RoleChanger>(&registry_, options);
  planner_ = std::make_unique<Planner>(PlannerOptionsFromConfig(config), &registry_,
                                       role_changer_.get(), &metrics_);
  planner_->Start();
}

void RouterService::StopPlanner() {
  if (planner_ != nullptr) planner_->Stop();
}

grpc::ServerUnaryReactor* RouterService::SetWorkerRole(grpc::CallbackServerContext* context,
                                                       const v1::SetWorkerRoleRequest* request,
                                                       v1::SetWorkerRoleResponse* response) {
  absl::StatusOr<int> caller = Authenticate(context);
  if (!caller.ok()) return rpc::FinishUnary(context, rpc::ToGrpc(caller.status()));
  if (api_keys_ != nullptr && !api_keys_->IsAdmin(*caller)) {
    return rpc::FinishUnary(
        context, grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                              "changing a worker's role needs an API key with admin: true"));
  }
  if (role_changer_ == nullptr) {
    return rpc::FinishUnary(context, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                  "the router is not ready for role changes"));
  }
  auto* reactor = context->DefaultReactor();
  role_changer_->ChangeAsync(
      request->name(), request->role(), "tandem role",
      [this, reactor, response](absl::StatusOr<v1::SetWorkerRoleResponse> result) {
        if (!result.ok()) {
          reactor->Finish(rpc::ToGrpc(result.status()));
          return;
        }
        if (result->changed() && planner_ != nullptr) planner_->NoteManualChange();
        *response = *std::move(result);
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerUnaryReactor* RouterService::RegistryService::RegisterWorker(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return rpc::AuthorizedUnary<v1::RegisterWorkerRequest, v1::RegisterWorkerResponse>(
      registry_->auth(), context, rpc::kRegisterWorkerMethod, request, response,
      [this](const auto* parsed, auto* out) { return RegisterWorkerParsed(parsed, out); });
}

grpc::Status RouterService::RegistryService::RegisterWorkerParsed(
    const v1::RegisterWorkerRequest* request, v1::RegisterWorkerResponse* response) {
  // A refusal is the RPC's status (FAILED_PRECONDITION for another model or
  // KV layout, INVALID_ARGUMENT for a bad field): the worker exits on it.
  // ALREADY_EXISTS (the name is held by a healthy worker elsewhere) is
  // retried by the worker every heartbeat; the registry logs it once.
  absl::Status s = registry_->Register(*request);
  if (!s.ok()) {
    if (!absl::IsAlreadyExists(s)) {
      rpc::Log(absl::StrCat("refused worker ", request->name(), ": ", s.message()));
    }
    return rpc::ToGrpc(s);
  }
  response->set_accepted(true);
  // A worker with a cluster secret refuses to join an open router.
  response->set_cluster_auth(
      std::string(registry_->auth() != nullptr ? registry_->auth()->mode() : "open"));
  return grpc::Status::OK;
}

}  // namespace tandem::router
