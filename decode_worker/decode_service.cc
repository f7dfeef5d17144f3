#include "decode_worker/decode_service.h"

#include <utility>

#include "common/server/proto_convert.h"
#include "common/server/status_util.h"
#include "common/server/stream_sink.h"

namespace tandem::decode {
namespace {

using Sink = rpc::StreamSink<v1::DecodeGenerateResponse>;

// Adapts engine events to stream messages.
class GrpcDecodeSink : public DecodeSink {
 public:
  explicit GrpcDecodeSink(std::shared_ptr<Sink> sink) : sink_(std::move(sink)) {}
  void NeedRemotePrefill(const std::string& kv_endpoint, uint32_t hit_tokens,
                         uint32_t attempt) override {
    v1::DecodeGenerateResponse msg;
    auto* need = msg.mutable_need_remote_prefill();
    need->set_kv_endpoint(kv_endpoint);
    need->set_hit_tokens(hit_tokens);
    need->set_attempt(attempt);
    sink_->Write(std::move(msg));
  }
  void Token(uint32_t index, int32_t token_id, float logprob,
             uint32_t prompt_tokens_computed) override {
    v1::DecodeGenerateResponse msg;
    auto* t = msg.add_tokens();
    t->set_index(index);
    t->set_token_id(token_id);
    t->set_logprob(logprob);
    msg.set_prompt_tokens_computed(prompt_tokens_computed);
    sink_->Write(std::move(msg));
  }
  void Finish(const absl::Status& status, FinishReason reason) override {
    if (status.ok()) {
      v1::DecodeGenerateResponse msg;
      msg.set_finish_reason(static_cast<v1::FinishReason>(reason));
      sink_->Write(std::move(msg));
    }
    sink_->Finish(rpc::ToGrpc(status));
  }

 private:
  std::shared_ptr<Sink> sink_;
};

}  // namespace

DecodeService::DecodeService(std::unique_ptr<DecodeEngine> engine,
                             std::function<v1::WorkerStatus()> status)
    : engine_(std::move(engine)), status_(std::move(status)) {}

grpc::ServerWriteReactor<v1::DecodeGenerateResponse>* DecodeService::Generate(
    grpc::CallbackServerContext* context, const v1::DecodeGenerateRequest* request) {
  DecodeEngine* engine = engine_.get();
  const std::string id = request->request_id();
  auto [reactor, sink] = Sink::Create([engine, id] { engine->Cancel(id); });
  DecodeRequest req;
  req.request_id = id;
  req.prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  req.max_tokens = MaxTokensFromProto(request->max_tokens());
  req.sampling = SamplingFromProto(request->sampling());
  req.route = static_cast<RouteChoice>(request->route_override());
  absl::Status submitted =
      engine->Submit(std::move(req), std::make_shared<GrpcDecodeSink>(sink));
  if (!submitted.ok()) sink->Finish(rpc::ToGrpc(submitted));
  return reactor;
}

v1::WorkerStatus DecodeService::Status() {
  DecodeStats stats = engine_->GetStats();
  v1::WorkerStatus status;
  status.set_kv_endpoint(engine_->kv_endpoint());
  status.set_running_requests(stats.running_requests);
  status.set_kv_blocks_in_use(stats.kv_blocks_in_use);
  status.set_kv_blocks_total(stats.kv_blocks_total);
  status.set_transfers_in_flight(stats.transfers_in_flight);
  status.set_prefill_tokens_computed_total(stats.prefill_tokens_computed_total);
  status.set_kv_bytes_received_total(stats.kv_bytes_received_total);
  status.set_decode_tokens_total(stats.decode_tokens_total);
  status.set_max_decode_batch_size(stats.max_decode_batch_size);
  status.set_kv_blocks_cached(stats.kv_blocks_cached);
  status.set_preemptions_total(stats.preemptions_total);
  return status;
}

grpc::ServerUnaryReactor* DecodeService::GetStatus(grpc::CallbackServerContext* context,
                                                   const v1::GetStatusRequest*,
                                                   v1::WorkerStatus* response) {
  *response = status_();
  return rpc::FinishUnary(context, grpc::Status::OK);
}

}  // namespace tandem::decode
