// The router's gRPC services: public tandem.v1.Generation and internal
// tandem.v1.Registry (callback API). Generate validates and tokenizes once
// (a `messages` request is first rendered with the model's chat template,
// router/chat_template.h), mints the request id and seed, then hands the
// request to a GenerateCall on its own thread.
//
// Owns: request admission at the router, the worker registry, health
// status. Does not touch: engine state (workers own it).
// Threads: gRPC callback threads; one thread per running request.
#ifndef TANDEM_ROUTER_ROUTER_SERVICE_H_
#define TANDEM_ROUTER_ROUTER_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/server/model_bundle.h"
#include "router/chat_template.h"
#include "router/worker_registry.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

class RouterService final : public v1::Generation::CallbackService {
 public:
  // `chat_template`: what `messages` are rendered with (ChatTemplate::FromGguf
  // of the model file and the config's chat_template).
  RouterService(const ModelBundle* model, ChatTemplate chat_template,
                const RegistryOptions& registry_options, std::string name,
                std::function<void(bool)> on_health_change);

  void set_address(const std::string& address) { address_ = address; }
  // SIGTERM: new Generate calls get UNAVAILABLE; running ones continue.
  void StopAccepting() { accepting_ = false; }
  WorkerRegistry& registry() { return registry_; }
  int running_requests() const { return running_; }

  // Validates a request and tokenizes its prompt (TokenizeRequestPrompt:
  // `prompt`, or `messages` rendered with the chat template). Errors:
  // TokenizeRequestPrompt's (INVALID_ARGUMENT for prompt/messages both or
  // neither set, a bad role, split_special_tokens with messages;
  // FAILED_PRECONDITION for messages without a chat format), then
  // INVALID_ARGUMENT naming the field and limit (route_override,
  // max_tokens, context length, sampling values).
  absl::StatusOr<std::vector<int32_t>> Validate(const v1::GenerateRequest& request) const;

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::GetModelInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest* request,
                                      v1::ClusterStatus* response) override;

  // tandem.v1.Registry, registered alongside.
  class RegistryService final : public v1::Registry::CallbackService {
   public:
    explicit RegistryService(WorkerRegistry* registry) : registry_(registry) {}
    grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                             const v1::RegisterWorkerRequest* request,
                                             v1::RegisterWorkerResponse* response) override;

   private:
    WorkerRegistry* registry_;
  };
  RegistryService* registry_service() { return &registry_service_; }

 private:
  // Const after construction.
  const ModelBundle* const model_;
  const ChatTemplate chat_template_;
  const std::string bos_text_;  // BOS's vocabulary text ("<s>"), "" when unknown
  const std::string name_;
  std::string address_;
  WorkerRegistry registry_;
  RegistryService registry_service_;
  std::atomic<int> running_{0};
  std::atomic<bool> accepting_{true};
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROUTER_SERVICE_H_
