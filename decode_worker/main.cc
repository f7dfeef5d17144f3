// tandem-decode-worker: thin main; see common/server/worker_main.h.
#include "absl/strings/str_cat.h"
#include "common/server/kv_data_planes.h"
#include "common/server/worker_engine.h"
#include "common/server/worker_main.h"
#include "decode_worker/decode_service.h"

int main(int argc, char** argv) {
  using namespace tandem;
  return RunWorkerMain(
      argc, argv, v1::ROLE_DECODE, {},
      [](const WorkerContext& ctx) -> absl::StatusOr<std::unique_ptr<WorkerRuntime>> {
        absl::StatusOr<std::unique_ptr<backend::ModelBackend>> created = BuildWorkerBackend(ctx);
        if (!created.ok()) return created.status();
        std::unique_ptr<backend::ModelBackend> backend = *std::move(created);
        kvtransfer::KvReceiver::Options kv_options =
            decode::ReceiverKvLoader::OptionsFromConfig(ctx.worker->kv_listen, ctx.config->kv);
        kv_options.auth = ctx.auth;  // HELLOs must carry the cluster credential
        // kv.transport: the transports this worker offers and their data paths.
        absl::StatusOr<KvDataPlanes> planes =
            BuildKvDataPlanes(*ctx.config, *ctx.worker, backend->kv_storage());
        if (!planes.ok()) return planes.status();
        auto receiver = decode::ReceiverKvLoader::Start(
            kv_options, KvLayoutFor(backend->kv_storage(), ctx.model->fingerprint),
            std::make_shared<const KvDataPlanes>(*std::move(planes)));
        if (!receiver.ok()) {
          return absl::Status(receiver.status().code(),
                              absl::StrCat("decode_workers[", ctx.worker->name,
                                           "].kv_listen: ", receiver.status().message()));
        }
        const std::string key = absl::StrCat("decode_workers[", ctx.worker->name, "].");
        auto kv_address =
            AdvertisedAddress(ctx.worker->kv_listen, (*receiver)->port(),
                              ctx.worker->kv_advertise, key + "kv_listen", key + "kv_advertise");
        if (!kv_address.ok()) return kv_address.status();
        (*receiver)->set_endpoint(kv_address->ToString());
        decode::ReceiverKvLoader* loader = receiver->get();
        const std::string bit_exact_class = backend->bit_exact_class();
        loader->set_bit_exact_class(bit_exact_class);
        core::EngineCoreOptions core_options =
            CoreOptionsFromConfig(*ctx.config, *ctx.model, "decode worker", ctx.kv_events);
        core_options.step_observer = ctx.step_observer;
        core_options.on_device_lost = ctx.on_device_lost;
        auto core = std::make_unique<core::EngineCore>(
            core_options, std::move(backend),
            *std::move(receiver));
        return std::make_unique<decode::DecodeService>(std::move(core), loader, bit_exact_class,
                                                       ctx.status, ctx.auth);
      });
}
