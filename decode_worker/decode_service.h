// gRPC face of the decode worker: tandem.v1.DecodeWorker (callback API).
// One StreamSink-backed reactor per Generate call; all logic lives in the
// engine core (engine/core), with the KV receiver as its remote KV loader.
// Threads: gRPC callback threads submit and cancel; the core's loop writes
// into the streams.
#ifndef TANDEM_DECODE_WORKER_DECODE_SERVICE_H_
#define TANDEM_DECODE_WORKER_DECODE_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "worker/worker_main.h"
#include "worker/worker_service.h"
#include "decode_worker/remote_kv_loader.h"
#include "engine/core/engine_core.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::decode {

// DecodeWorker with Generate and CancelSample raw (their requests carry
// text and are parsed with rpc::ParseStrict, common/server/raw_call.h);
// GetStatus typed.
using DecodeWorkerBase = v1::DecodeWorker::WithRawCallbackMethod_Generate<
    v1::DecodeWorker::WithRawCallbackMethod_CancelSample<
        v1::DecodeWorker::WithRawCallbackMethod_AbortTransfer<
            v1::DecodeWorker::WithCallbackMethod_GetStatus<v1::DecodeWorker::Service>>>>;

class DecodeService final : public WorkerService<DecodeWorkerBase, rpc::kDecodeGetStatusMethod>,
                            public WorkerRuntime {
 public:
  // `receiver` is the core's loader (owned by the core). `status` fills
  // name/role/address for GetStatus (from RunWorkerMain). `auth`: every
  // method first checks the caller's cluster credential (rpc::Authorized;
  // nullptr or open: none required); it outlives the service.
  // `core` is the worker's (shared with its prefill half). `gate`: a
  // Generate while the worker serves the prefill role gets UNAVAILABLE
  // before any message (the router sends it elsewhere; nullptr: always
  // served); outlives the service.
  DecodeService(std::shared_ptr<core::EngineCore> core, const ReceiverKvLoader* receiver,
                std::string bit_exact_class, std::function<v1::WorkerStatus()> status,
                const auth::ClusterAuth* auth = nullptr, const RoleGate* gate = nullptr);

  // Generate, CancelSample and AbortTransfer: a request whose text is not UTF-8 gets
  // INVALID_ARGUMENT naming the field (rpc::ParseStrict); then the typed
  // bodies below.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* CancelSample(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* AbortTransfer(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;

  // WorkerRuntime
  grpc::Service* service() override { return this; }
  v1::WorkerStatus Status() override;
  void Shutdown() override { core_->Shutdown(); }
  // Received bytes per transport and the stream seconds from the KV
  // receiver; FINAL .. first decode step from the core's stats.
  KvTransportCounters KvCounters() override;

 private:
  // The typed bodies, once the request parsed. `request` is valid until
  // they return.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateParsed(
      grpc::CallbackServerContext* context, const v1::DecodeGenerateRequest* request);
  // Ends one sample of a running Generate call (core::EngineCore::
  // CancelSample). An unknown request id or a finished sample is not an
  // error (the sample may have ended meanwhile); sample_index >= 16
  // (core::kMaxSamples) is INVALID_ARGUMENT.
  grpc::Status CancelSampleParsed(const v1::CancelSampleRequest* request,
                                  v1::CancelSampleResponse* response);
  // The router's word that a remote prefill attempt will not deliver
  // (core::EngineCore::AbortRemotePrefill). An attempt no longer awaited
  // is not an error; an empty request_id or attempt 0 is INVALID_ARGUMENT.
  grpc::Status AbortTransferParsed(const v1::AbortTransferRequest* request,
                                   v1::AbortTransferResponse* response);

  std::shared_ptr<core::EngineCore> core_;
  const ReceiverKvLoader* const receiver_;
  const std::string bit_exact_class_;
  const RoleGate* const gate_;
};

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_SERVICE_H_
