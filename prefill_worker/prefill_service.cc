#include "prefill_worker/prefill_service.h"

#include <utility>

#include "common/server/authorized.h"
#include "common/server/proto_convert.h"
#include "common/server/status_util.h"
#include "worker/worker_engine.h"
#include "prefill_worker/prefill_call.h"

namespace tandem::prefill {
namespace {

// A Prefill call that forwards a client cancel to the core. Deletes itself
// in OnDone.
class PrefillReactor : public rpc::UnaryCall<v1::PrefillRequest, v1::PrefillResponse> {
 public:
  PrefillReactor(core::EngineCore* core, grpc::ByteBuffer* response)
      : UnaryCall(response), core_(core) {}
  void OnCancel() override { core_->Cancel(request()->request_id()); }

 private:
  core::EngineCore* core_;
};

}  // namespace

PrefillService::PrefillService(std::shared_ptr<core::EngineCore> core, KvSendOptions send,
                               std::function<v1::WorkerStatus()> status,
                               const auth::ClusterAuth* auth, const RoleGate* gate)
    : WorkerService(std::move(status), auth),
      send_(std::move(send)),
      core_(std::move(core)),
      gate_(gate) {}

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  return rpc::Authorized(auth(), context, rpc::kPrefillPrefillMethod, *request, [&] {
    auto* reactor = new PrefillReactor(core_.get(), response);
    if (reactor->Parse(*request)) PrefillParsed(reactor, reactor->request(), reactor->response());
    return reactor->reactor();
  });
}

void PrefillService::PrefillParsed(PrefillCall* reactor, const v1::PrefillRequest* request,
                                   v1::PrefillResponse* response) {
  if (gate_ != nullptr) {
    if (absl::Status admitted = gate_->Admit(v1::ROLE_PREFILL); !admitted.ok()) {
      reactor->Finish(rpc::ToGrpc(admitted));
      return;
    }
  }
  PrefillRequest req;
  req.request_id = request->request_id();
  req.prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  req.max_tokens = MaxTokensFromProto(request->max_tokens());
  req.sampling = SamplingFromProto(request->sampling(), request->controls().logprobs());
  req.controls = ControlsFromProto(request->controls());
  req.kv_target = KvTargetFromProto(request->kv_target());
  SubmitPrefill(*core_, send_, std::move(req),
                [reactor, response](absl::StatusOr<PrefillResult> r) {
                  if (!r.ok()) {
                    reactor->Finish(rpc::ToGrpc(r.status()));
                    return;
                  }
                  for (size_t s = 0; s < r->samples.size(); ++s) {
                    TokenToProto(static_cast<uint32_t>(s), 0, r->samples[s].token,
                                 response->add_first_tokens());
                    response->add_finish_reasons(FinishReasonToProto(r->samples[s].finish_reason));
                  }
                  response->set_prompt_tokens_computed(r->prompt_tokens_computed);
                  response->set_kv_bytes_sent(r->kv_bytes_sent);
                  PhasesToProto(r->phases, response->mutable_phases());
                  reactor->Finish(grpc::Status::OK);
                });
}

v1::WorkerStatus PrefillService::Status() {
  v1::WorkerStatus status =
      StatusFromCore(core_->GetStats(), send_.layout.LayoutId(), send_.bit_exact_class);
  for (kvtransfer::KvTransport t : send_.transports()) {
    (*status.mutable_kv_bytes_by_transport())[std::string(kvtransfer::KvTransportName(t))] =
        send_.bytes_by_transport != nullptr ? send_.bytes_by_transport->Get(t) : 0;
  }
  return status;
}

KvTransportCounters PrefillService::KvCounters() {
  KvTransportCounters c;
  for (int t = 0; t < kvtransfer::kNumKvTransports; ++t) {
    const auto transport = static_cast<kvtransfer::KvTransport>(t);
    c.sent(transport) =
        send_.bytes_by_transport != nullptr ? send_.bytes_by_transport->Get(transport) : 0;
  }
  return c;
}

}  // namespace tandem::prefill
