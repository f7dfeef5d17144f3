#include "decode_worker/decode_service.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/server/authorized.h"
#include "common/server/proto_convert.h"
#include "common/server/raw_call.h"
#include "common/server/status_util.h"
#include "common/server/stream_sink.h"
#include "worker/worker_engine.h"

namespace tandem::decode {
namespace {

using Sink = rpc::StreamSink<v1::DecodeGenerateResponse>;

// Engine-core results as stream messages.
class GrpcDecodeOutput : public core::RequestOutput {
 public:
  explicit GrpcDecodeOutput(std::shared_ptr<Sink> sink) : sink_(std::move(sink)) {}
  void OnRemotePrefill(const core::KvTarget& target) override {
    v1::DecodeGenerateResponse msg;
    KvTargetToProto(target, msg.mutable_need_remote_prefill()->mutable_kv_target());
    sink_->Write(std::move(msg));
  }
  // Loop thread, right before sample 0's first token: it carries them.
  void OnPhases(const core::RequestPhases& phases,
                const core::PlacementReport& placement) override {
    phases_ = phases;
    placement_ = placement;
  }
  void OnToken(uint32_t sample_index, uint32_t index, const sampling::SampledToken& token,
               uint32_t prompt_tokens_computed) override {
    v1::DecodeGenerateResponse msg;
    TokenToProto(sample_index, index, token, msg.add_tokens());
    msg.set_prompt_tokens_computed(prompt_tokens_computed);
    if (sample_index == 0 && phases_.has_value()) {
      PhasesToProto(*phases_, msg.mutable_phases());
      PlacementToProto(*placement_, msg.mutable_placement());
      phases_.reset();
    }
    sink_->Write(std::move(msg));
  }
  void OnSampleFinish(uint32_t sample_index, core::FinishReason reason) override {
    v1::DecodeGenerateResponse msg;
    msg.set_sample_index(sample_index);
    msg.set_finish_reason(FinishReasonToProto(reason));
    sink_->Write(std::move(msg));
  }
  void OnFinish(const absl::Status& status) override { sink_->Finish(rpc::ToGrpc(status)); }

 private:
  std::shared_ptr<Sink> sink_;
  // OnPhases' report until the token it rides with (loop thread only).
  std::optional<core::RequestPhases> phases_;
  std::optional<core::PlacementReport> placement_;
};

}  // namespace

DecodeService::DecodeService(std::shared_ptr<core::EngineCore> core,
                             const ReceiverKvLoader* receiver, std::string bit_exact_class,
                             std::function<v1::WorkerStatus()> status,
                             const auth::ClusterAuth* auth, const RoleGate* gate)
    : WorkerService(std::move(status), auth),
      core_(std::move(core)),
      receiver_(receiver),
      bit_exact_class_(std::move(bit_exact_class)),
      gate_(gate) {}

grpc::ServerWriteReactor<grpc::ByteBuffer>* DecodeService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return rpc::AuthorizedStream<v1::DecodeGenerateRequest>(
      auth(), context, rpc::kDecodeGenerateMethod, request,
      [&](const v1::DecodeGenerateRequest* parsed) { return GenerateParsed(context, parsed); });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* DecodeService::GenerateParsed(
    grpc::CallbackServerContext* context, const v1::DecodeGenerateRequest* request) {
  core::EngineCore* core = core_.get();
  const std::string id = request->request_id();
  auto [reactor, sink] = Sink::Create([core, id] { core->Cancel(id); });
  if (gate_ != nullptr) {
    if (absl::Status admitted = gate_->Admit(v1::ROLE_DECODE); !admitted.ok()) {
      sink->Finish(rpc::ToGrpc(admitted));
      return reactor;
    }
  }
  absl::StatusOr<core::RouteChoice> route = RouteFromProto(request->route_override());
  if (!route.ok()) {
    sink->Finish(rpc::ToGrpc(route.status()));
    return reactor;
  }
  core::EngineRequest req;
  req.request_id = id;
  req.prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  req.max_tokens = MaxTokensFromProto(request->max_tokens());
  req.sampling = SamplingFromProto(request->sampling(), request->controls().logprobs());
  req.controls = ControlsFromProto(request->controls());
  req.route = *route;
  req.remote_estimate = EstimateFromProto(*request);
  req.generated.assign(request->generated_token_ids().begin(),
                       request->generated_token_ids().end());
  if (request->first_output_index() != req.generated.size()) {
    sink->Finish(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("first_output_index: must equal the number of generated_token_ids (",
                     req.generated.size(), "), got ", request->first_output_index())));
    return reactor;
  }
  for (const v1::DecodeGenerateRequest::MigratedSample& m : request->migrated_samples()) {
    core::EngineRequest::MigratedSample& sample = req.migrated_samples.emplace_back();
    sample.generated.assign(m.generated_token_ids().begin(), m.generated_token_ids().end());
    sample.finished = m.finished();
  }
  req.output = std::make_shared<GrpcDecodeOutput>(sink);
  absl::Status submitted = core->Submit(std::move(req));
  if (!submitted.ok()) sink->Finish(rpc::ToGrpc(submitted));
  return reactor;
}

grpc::ServerUnaryReactor* DecodeService::CancelSample(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return rpc::AuthorizedUnary(auth(), context, rpc::kDecodeCancelSampleMethod, request, response,
                              this, &DecodeService::CancelSampleParsed);
}

grpc::ServerUnaryReactor* DecodeService::AbortTransfer(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return rpc::AuthorizedUnary(auth(), context, rpc::kDecodeAbortTransferMethod, request, response,
                              this, &DecodeService::AbortTransferParsed);
}

grpc::Status DecodeService::CancelSampleParsed(const v1::CancelSampleRequest* request,
                                               v1::CancelSampleResponse*) {
  if (request->sample_index() >= static_cast<uint32_t>(core::kMaxSamples)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("sample_index: must be < ", core::kMaxSamples, ", got ",
                                     request->sample_index()));
  }
  core_->CancelSample(request->request_id(), request->sample_index());
  return grpc::Status::OK;
}

grpc::Status DecodeService::AbortTransferParsed(const v1::AbortTransferRequest* request,
                                                v1::AbortTransferResponse*) {
  if (request->request_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request_id: must not be empty");
  }
  if (request->attempt() == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "attempt: must be >= 1, got 0");
  }
  std::string reason = request->reason();
  if (reason.empty()) reason = "aborted by the router";
  core_->AbortRemotePrefill(request->request_id(), request->attempt(), reason,
                            request->no_prefill_worker());
  return grpc::Status::OK;
}

v1::WorkerStatus DecodeService::Status() {
  v1::WorkerStatus status =
      StatusFromCore(core_->GetStats(), receiver_->layout().LayoutId(), bit_exact_class_);
  status.set_kv_endpoint(receiver_->endpoint());
  for (kvtransfer::KvTransport t : receiver_->offer().transports) {
    (*status.mutable_kv_bytes_by_transport())[std::string(kvtransfer::KvTransportName(t))] =
        receiver_->bytes_received_total(t);
  }
  return status;
}

KvTransportCounters DecodeService::KvCounters() {
  KvTransportCounters c;
  for (int t = 0; t < kvtransfer::kNumKvTransports; ++t) {
    const auto transport = static_cast<kvtransfer::KvTransport>(t);
    c.received(transport) = receiver_->bytes_received_total(transport);
  }
  c.transfers = receiver_->transfers_completed_total();
  c.transfer_seconds_sum = receiver_->transfer_seconds_total();
  const core::CoreStats stats = core_->GetStats();
  c.loads = stats.kv_load_to_first_decode_total;
  c.load_to_first_decode_seconds_sum = stats.kv_load_to_first_decode_seconds_total;
  return c;
}

}  // namespace tandem::decode
