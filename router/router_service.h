// The router's gRPC services: public tandem.v1.Generation and internal
// tandem.v1.Registry (callback API). Generate validates and tokenizes once
// (a `messages` request is first rendered with the model's chat template,
// router/chat_template.h), mints the request id and seed, then hands the
// request to a GenerateCall (GenerateCall::Start, non-blocking) once
// admitted (router/admission.h: router.max_inflight running,
// router.max_queued waiting, beyond them RESOURCE_EXHAUSTED with trailing
// metadata retry-after-ms).
//
// With API keys (router.api_keys_file, router/api_keys.h; set_api_keys),
// every Generation call needs `authorization: Bearer <key>` metadata,
// checked before anything else (UNAUTHENTICATED otherwise; the gRPC
// health service stays open). A Generate request is then validated and
// tokenized, admitted by its key's limits (prompt + max_tokens x n
// reserved from the key's bucket; RESOURCE_EXHAUSTED with retry-after-ms
// otherwise, holding no admission slot) and only then submitted to the
// router's admission: refused there or dropped from its queue, the whole
// reservation is refunded; once it starts running the prompt's charge is
// kept whatever happens to the request, and when it ends the generated
// tokens it did not use (counted as GenerateCall emits them) go back.
//
// Every Generate call is measured (router/router_metrics.h, metrics()):
// from its arrival here to its stream's end, refusals included; GetStatus
// reports the same counters (WorkerStatus.router_*_total).
//
// Owns: request admission at the router, the worker registry, health
// status, the router's metrics. Does not touch: engine state (workers own it).
// Threads: gRPC callback threads (no thread per request); the admission
// timer thread (queued deadlines).
#ifndef TANDEM_ROUTER_ROUTER_SERVICE_H_
#define TANDEM_ROUTER_ROUTER_SERVICE_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster_config.h"
#include "common/server/model_bundle.h"
#include "router/admission.h"
#include "router/api_keys.h"
#include "router/chat_template.h"
#include "router/generate_call.h"
#include "router/router_metrics.h"
#include "router/planner.h"
#include "router/role_changer.h"
#include "router/worker_registry.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

// The config's objectives as the proto reports them: each in ms, 0 for one
// not set.
v1::Slo SloToProto(const SloConfig& slo);

// Generation with Generate and Tokenize raw (their requests carry text and
// are parsed with rpc::ParseStrict, common/server/raw_call.h); GetModelInfo
// and GetStatus typed.
using GenerationBase = v1::Generation::WithRawCallbackMethod_Generate<
    v1::Generation::WithRawCallbackMethod_Tokenize<v1::Generation::WithCallbackMethod_GetModelInfo<
        v1::Generation::WithCallbackMethod_GetStatus<
            v1::Generation::WithCallbackMethod_SetWorkerRole<v1::Generation::Service>>>>>;

class RouterService final : public GenerationBase {
 public:
  // `chat_template`: what `messages` are rendered with (ChatTemplate::FromGguf
  // of the model file and the config's chat_template). `admission_options`:
  // router.max_inflight and router.max_queued (valid: Admission::ValidateOptions).
  RouterService(const ModelBundle* model, ChatTemplate chat_template,
                const RegistryOptions& registry_options,
                const Admission::Options& admission_options, std::string name,
                std::function<void(bool)> on_health_change);
  // Stops the planner, then waits for role changes in flight (their
  // callbacks read the planner), before the members go.
  ~RouterService() override;

  void set_address(const std::string& address) { address_ = address; }
  // Failure handling of every request (call before serving):
  // router.max_migrations and the status probe deadline (router.rpc_timeout_ms).
  void set_failover(int32_t max_migrations, int32_t probe_timeout_ms) {
    max_migrations_ = max_migrations;
    probe_timeout_ms_ = probe_timeout_ms;
  }
  // Client API keys (router.api_keys_file): from now on every Generation
  // call needs one (call before serving). Without: open, as before.
  void set_api_keys(std::unique_ptr<ApiKeys> keys) { api_keys_ = std::move(keys); }
  // The cluster config's slo and conditional.placement, which GetModelInfo
  // and GetStatus report (call before serving). Without: no objectives,
  // placement "threshold".
  void set_objectives(const SloConfig& slo, PlacementMode placement) {
    slo_ = SloToProto(slo);
    placement_ = PlacementModeName(placement);
  }
  // Role changes (issue #35): router.role_drain_timeout_ms and the SetRole
  // deadline (router.rpc_timeout_ms), then `planner` (off: none runs; its
  // status still says so) with the config's slo and engine limits. Call
  // once, before serving.
  void StartRoleControl(const ClusterConfig& config);
  // The planner's decisions stop (before the registry goes).
  void StopPlanner();
  // SIGTERM: new Generate calls get UNAVAILABLE; running and queued ones
  // continue.
  void StopAccepting() { accepting_ = false; }
  bool accepting() const { return accepting_; }
  WorkerRegistry& registry() { return registry_; }
  // The router's Prometheus metrics (registry() to serve on /metrics).
  RouterMetrics& metrics() { return metrics_; }
  // Generate requests holding an admission slot plus those queued for one.
  int running_requests() const { return admission_.running() + admission_.queued(); }

  // Validates a request and tokenizes its prompt (TokenizeRequestPrompt:
  // `prompt`, or `messages` rendered with the chat template). Errors:
  // TokenizeRequestPrompt's (INVALID_ARGUMENT for prompt/messages both or
  // neither set, a bad role, split_special_tokens with messages;
  // FAILED_PRECONDITION for messages without a chat format), then
  // INVALID_ARGUMENT naming the field and limit (route_override,
  // max_tokens, context length, sampling values including min_p, the
  // penalties, logit_bias and logprobs; stop; n, min_tokens,
  // stop_token_ids).
  [[nodiscard]] absl::StatusOr<std::vector<int32_t>> Validate(
      const v1::GenerateRequest& request) const;
  // The prompt ids of `request` alone (TokenizeRequestPrompt with this
  // router's tokenizer and chat template; its errors), e.g. for the HTTP
  // front end's chat default max_tokens (context - prompt).
  [[nodiscard]] absl::StatusOr<std::vector<int32_t>> PromptTokens(
      const v1::GenerateRequest& request) const;
  // API keys for callers outside gRPC (the HTTP front end's routes that
  // make no Generate call): OK when no keys are configured or
  // `authorization` ("Bearer <key>"; nullptr: absent) names a key;
  // UNAUTHENTICATED otherwise.
  [[nodiscard]] absl::Status AuthenticateHeader(const std::string* authorization) const;

  // Every method below first checks the API key when keys are configured
  // (Authenticate: UNAUTHENTICATED before the request is even parsed).
  // Generate and Tokenize: a request whose text is not UTF-8 gets
  // INVALID_ARGUMENT naming the field (rpc::ParseStrict); then the typed
  // bodies below. A valid Generate runs when admitted: at once, after
  // waiting in the FIFO (its deadline passing there: DEADLINE_EXCEEDED;
  // the client cancelling: CANCELLED), or refused with RESOURCE_EXHAUSTED
  // "router at capacity: ..." and trailing metadata retry-after-ms. With
  // keys, the key's limits come first (ApiKeys::Admit: RESOURCE_EXHAUSTED
  // "API key '<name>': ..." with retry-after-ms, none for a request that
  // may use more than tokens_per_minute: prompt + max_tokens x n, what
  // the key reserves at admission).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  // The model's metadata, its chat format, and the objectives and
  // placement of set_objectives.
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::GetModelInfoResponse* response) override;
  // The router's own status plus a fresh GetStatus of every worker
  // (WorkerRegistry::StatusAllAsync: asynchronous, rpc_timeout_ms each; the
  // call finishes on the last answer, no thread waits). can_serve and
  // router.ready: >= 1 healthy decode worker. api_keys_required, and with
  // keys each key's usage on this replica (ApiKeys::Snapshot). slo and
  // placement as set_objectives gave them.
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest* request,
                                      v1::ClusterStatus* response) override;
  // `tandem role` (generation.proto SetWorkerRoleRequest): with API keys
  // only an admin key may (PERMISSION_DENIED otherwise); then
  // RoleChanger::Change on a thread of its own (the call finishes when the
  // worker serves its new role or the change failed).
  grpc::ServerUnaryReactor* SetWorkerRole(grpc::CallbackServerContext* context,
                                          const v1::SetWorkerRoleRequest* request,
                                          v1::SetWorkerRoleResponse* response) override;

  // tandem.v1.Registry, registered alongside; RegisterWorker is raw (its
  // request carries text).
  class RegistryService final
      : public v1::Registry::WithRawCallbackMethod_RegisterWorker<v1::Registry::Service> {
   public:
    explicit RegistryService(WorkerRegistry* registry) : registry_(registry) {}
    grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;

   private:
    // The typed body, once the request parsed: OK with accepted = true, or
    // the registry's refusal as the RPC's status (FAILED_PRECONDITION for
    // another model fingerprint or KV layout id, INVALID_ARGUMENT for a bad
    // field), logged.
    grpc::Status RegisterWorkerParsed(const v1::RegisterWorkerRequest* request,
                                      v1::RegisterWorkerResponse* response);

    WorkerRegistry* registry_;
  };
  RegistryService* registry_service() { return &registry_service_; }

 private:
  // The caller's API key id (ApiKeys::Authenticate of the `authorization`
  // metadata), or -1 when no keys are configured. UNAUTHENTICATED when
  // keys are required and the metadata is missing or names no key.
  [[nodiscard]] absl::StatusOr<int> Authenticate(const grpc::CallbackServerContext* context) const;

  // The typed bodies of Generate and Tokenize, once the request parsed.
  // `request` is valid until they return. `key`: Authenticate's id.
  // `arrival`, `steady_arrival`: when Generate was called (metrics; each
  // sample's RequestTiming).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateParsed(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request, int key,
      absl::Time arrival, std::chrono::steady_clock::time_point steady_arrival);
  // Ends a Generate call that never got an admission slot: counted in the
  // metrics (RouterMetrics::RequestRefused), then `sink` finished.
  void Refuse(GenerateCall::Sink& sink, const absl::Status& status,
              GenerateCall::Sink::Trailers trailers = {});
  grpc::Status TokenizeParsed(const v1::TokenizeRequest* request, v1::TokenizeResponse* response);

  // Const after construction.
  const ModelBundle* const model_;
  const ChatTemplate chat_template_;
  const std::string bos_text_;  // BOS's vocabulary text ("<s>"), "" when unknown
  const std::string name_;
  std::string address_;
  WorkerRegistry registry_;
  RegistryService registry_service_;
  int32_t max_migrations_ = 0;
  int32_t probe_timeout_ms_ = 2000;
  // Before admission_, which reports to it until destroyed.
  RouterMetrics metrics_;
  // router.max_inflight / max_queued; its timer thread is joined when the
  // service is destroyed.
  Admission admission_;
  std::unique_ptr<ApiKeys> api_keys_;  // null: no key required; set before serving
  // StartRoleControl; before serving. The planner flips through the
  // changer, so it is declared after it (stopped first).
  std::unique_ptr<RoleChanger> role_changer_;
  std::unique_ptr<Planner> planner_;
  // set_objectives; before serving.
  v1::Slo slo_;
  std::string placement_ = PlacementModeName(PlacementMode::kThreshold);
  std::atomic<bool> accepting_{true};
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROUTER_SERVICE_H_
