#include "prefill_worker/prefill_service.h"

#include <utility>

#include "common/server/proto_convert.h"
#include "common/server/status_util.h"

namespace tandem::prefill {
namespace {

// Unary reactor that forwards a client cancel to the engine. Deletes
// itself in OnDone.
class PrefillReactor : public grpc::ServerUnaryReactor {
 public:
  PrefillReactor(PrefillEngine* engine, std::string request_id)
      : engine_(engine), request_id_(std::move(request_id)) {}
  void OnCancel() override { engine_->Cancel(request_id_); }
  void OnDone() override { delete this; }

 private:
  PrefillEngine* engine_;
  std::string request_id_;
};

}  // namespace

PrefillService::PrefillService(std::unique_ptr<PrefillEngine> engine,
                               std::function<v1::WorkerStatus()> status)
    : engine_(std::move(engine)), status_(std::move(status)) {}

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext*,
                                                  const v1::PrefillRequest* request,
                                                  v1::PrefillResponse* response) {
  auto* reactor = new PrefillReactor(engine_.get(), request->request_id());
  PrefillRequest req;
  req.request_id = request->request_id();
  req.prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  req.max_tokens = MaxTokensFromProto(request->max_tokens());
  req.sampling = SamplingFromProto(request->sampling());
  req.kv_endpoint = request->kv_target().endpoint();
  req.attempt = request->kv_target().attempt();
  req.hit_tokens = request->kv_target().hit_tokens();
  engine_->Submit(std::move(req), [reactor, response](absl::StatusOr<PrefillResult> r) {
    if (!r.ok()) {
      reactor->Finish(rpc::ToGrpc(r.status()));
      return;
    }
    auto* t = response->mutable_first_token();
    t->set_index(0);
    t->set_token_id(r->first_token.token_id);
    t->set_logprob(r->first_token.logprob);
    response->set_finish_reason(static_cast<v1::FinishReason>(r->finish_reason));
    response->set_prompt_tokens_computed(r->prompt_tokens_computed);
    response->set_kv_bytes_sent(r->kv_bytes_sent);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

v1::WorkerStatus PrefillService::Status() {
  PrefillStats stats = engine_->GetStats();
  v1::WorkerStatus status;
  status.set_running_requests(stats.running_requests);
  status.set_kv_blocks_in_use(stats.kv_blocks_in_use);
  status.set_kv_blocks_total(stats.kv_blocks_total);
  status.set_kv_blocks_cached(stats.kv_blocks_cached);
  status.set_transfers_in_flight(stats.transfers_in_flight);
  status.set_prefill_tokens_computed_total(stats.prefill_tokens_computed_total);
  status.set_kv_bytes_sent_total(stats.kv_bytes_sent_total);
  return status;
}

grpc::ServerUnaryReactor* PrefillService::GetStatus(grpc::CallbackServerContext* context,
                                                    const v1::GetStatusRequest*,
                                                    v1::WorkerStatus* response) {
  *response = status_();
  return rpc::FinishUnary(context, grpc::Status::OK);
}

}  // namespace tandem::prefill
