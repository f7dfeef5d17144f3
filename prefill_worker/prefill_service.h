// gRPC face of the prefill worker: tandem.v1.PrefillWorker (callback API).
// Each Prefill call becomes a prefill-only request of the engine core
// (prefill_call.h) whose KV goes out through the KV sender. Threads: gRPC
// callback threads submit and cancel; the core's loop finishes each call.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
#define TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_

#include <functional>
#include <memory>

#include "common/server/worker_main.h"
#include "engine/core/engine_core.h"
#include "prefill_worker/kv_export.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::prefill {

class PrefillService final : public v1::PrefillWorker::CallbackService,
                             public WorkerRuntime {
 public:
  // `send`: the KV layout, bit-exact class and timeouts of every transfer.
  PrefillService(std::unique_ptr<core::EngineCore> core, KvSendOptions send,
                 std::function<v1::WorkerStatus()> status);

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest* request,
                                      v1::WorkerStatus* response) override;

  grpc::Service* service() override { return this; }
  v1::WorkerStatus Status() override;
  void Shutdown() override { core_->Shutdown(); }

 private:
  const KvSendOptions send_;
  std::unique_ptr<core::EngineCore> core_;
  std::function<v1::WorkerStatus()> status_;
};

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
