// gRPC face of the prefill worker: tandem.v1.PrefillWorker (callback API).
// All logic lives in PrefillEngine. Threads: gRPC callback threads submit;
// the engine thread finishes each call.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
#define TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_

#include <functional>
#include <memory>

#include "common/server/worker_main.h"
#include "prefill_worker/prefill_engine.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::prefill {

class PrefillService final : public v1::PrefillWorker::CallbackService,
                             public WorkerRuntime {
 public:
  PrefillService(std::unique_ptr<PrefillEngine> engine,
                 std::function<v1::WorkerStatus()> status);

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest* request,
                                      v1::WorkerStatus* response) override;

  grpc::Service* service() override { return this; }
  v1::WorkerStatus Status() override;
  void Shutdown() override { engine_->Shutdown(); }

 private:
  std::unique_ptr<PrefillEngine> engine_;
  std::function<v1::WorkerStatus()> status_;
};

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
