// gRPC face of the prefill worker: tandem.v1.PrefillWorker (callback API).
// Each Prefill call becomes a prefill-only request of the engine core
// (prefill_call.h) whose KV goes out through the KV sender. Threads: gRPC
// callback threads submit and cancel; the core's loop finishes each call.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
#define TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_

#include <functional>
#include <memory>

#include "common/server/raw_call.h"
#include "worker/worker_main.h"
#include "worker/worker_service.h"
#include "engine/core/engine_core.h"
#include "prefill_worker/kv_export.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::prefill {

// PrefillWorker with Prefill raw (its request carries text and is parsed
// with rpc::ParseStrict, common/server/raw_call.h); GetStatus typed.
using PrefillWorkerBase = v1::PrefillWorker::WithRawCallbackMethod_Prefill<
    v1::PrefillWorker::WithCallbackMethod_GetStatus<v1::PrefillWorker::Service>>;

class PrefillService final : public WorkerService<PrefillWorkerBase, rpc::kPrefillGetStatusMethod>,
                             public WorkerRuntime {
 public:
  // `core`: the worker's engine core (shared with its decode half).
  // `send`: the KV layout, bit-exact class and timeouts of every transfer.
  // `auth`: every method first checks the caller's cluster credential
  // (rpc::Authorized; nullptr or open: none required); outlives the service.
  // `gate`: a Prefill while the worker serves the decode role gets
  // UNAVAILABLE (nullptr: always served); outlives the service.
  PrefillService(std::shared_ptr<core::EngineCore> core, KvSendOptions send,
                 std::function<v1::WorkerStatus()> status, const auth::ClusterAuth* auth = nullptr,
                 const RoleGate* gate = nullptr);

  // A request whose text is not UTF-8 gets INVALID_ARGUMENT naming the
  // field (rpc::ParseStrict); then PrefillParsed.
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;

  grpc::Service* service() override { return this; }
  v1::WorkerStatus Status() override;
  void Shutdown() override { core_->Shutdown(); }
  // Sent bytes per transport (KvSendOptions::bytes_by_transport).
  KvTransportCounters KvCounters() override;

 private:
  // The reactor of one Prefill call: owns the parsed request and the
  // response until the call ends.
  using PrefillCall = rpc::UnaryCall<v1::PrefillRequest, v1::PrefillResponse>;
  // The typed body: submits the prefill; its completion finishes `reactor`.
  // `request` and `response` are the reactor's.
  void PrefillParsed(PrefillCall* reactor, const v1::PrefillRequest* request,
                     v1::PrefillResponse* response);

  const KvSendOptions send_;
  std::shared_ptr<core::EngineCore> core_;
  const RoleGate* const gate_;
};

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
