// tandem-prefill-worker: thin main; see common/server/worker_main.h.
// Extra flag --fault-stall-after-frames N (tests only): stall the KV send
// after N frames, to exercise the decode worker's transfer timeout.
// --fault-fail-reply true (tests only): answer every Prefill whose KV
// transfer succeeded with UNAVAILABLE (a reply lost after FINAL).
// kv.send_buffer_bytes and kv.transfer_timeout_ms configure the KV sender
// (kvtransfer::KvSendQueue: one thread for every transfer); kv.transport
// its transports (common/server/kv_data_planes.h).
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/server/kv_data_planes.h"
#include "common/server/worker_engine.h"
#include "common/server/worker_main.h"
#include "prefill_worker/prefill_service.h"

int main(int argc, char** argv) {
  using namespace tandem;
  return RunWorkerMain(
      argc, argv, v1::ROLE_PREFILL, {"fault-stall-after-frames", "fault-fail-reply"},
      [](const WorkerContext& ctx) -> absl::StatusOr<std::unique_ptr<WorkerRuntime>> {
        absl::StatusOr<std::unique_ptr<backend::ModelBackend>> created = BuildWorkerBackend(ctx);
        if (!created.ok()) return created.status();
        std::unique_ptr<backend::ModelBackend> backend = *std::move(created);
        prefill::KvSendOptions send;
        send.layout = KvLayoutFor(backend->kv_storage(), ctx.model->fingerprint);
        send.bit_exact_class = backend->bit_exact_class();
        send.transfer_timeout_ms = ctx.config->kv.transfer_timeout_ms;
        send.send_buffer_bytes = ctx.config->kv.send_buffer_bytes;
        send.auth = ctx.auth;
        // kv.transport: this worker's transports and their data paths.
        absl::StatusOr<KvDataPlanes> planes =
            BuildKvDataPlanes(*ctx.config, *ctx.worker, backend->kv_storage());
        if (!planes.ok()) return planes.status();
        send.planes = std::make_shared<const KvDataPlanes>(*std::move(planes));
        auto it = ctx.flags->find("fault-stall-after-frames");
        if (it != ctx.flags->end() &&
            !absl::SimpleAtoi(it->second, &send.fault_stall_after_frames)) {
          return absl::InvalidArgumentError("--fault-stall-after-frames: not an integer");
        }
        if (auto fail = ctx.flags->find("fault-fail-reply"); fail != ctx.flags->end()) {
          if (fail->second != "true" && fail->second != "false") {
            return absl::InvalidArgumentError(absl::StrCat(
                "--fault-fail-reply: expected true or false, got '", fail->second, "'"));
          }
          send.fault_fail_reply = fail->second == "true";
        }
        if (absl::Status started = prefill::StartKvSendQueue(&send); !started.ok()) {
          return started;
        }
        core::EngineCoreOptions core_options =
            CoreOptionsFromConfig(*ctx.config, *ctx.model, "prefill worker", ctx.kv_events);
        core_options.step_observer = ctx.step_observer;
        core_options.on_device_lost = ctx.on_device_lost;
        auto core = std::make_unique<core::EngineCore>(
            core_options, std::move(backend),
            nullptr);
        return std::make_unique<prefill::PrefillService>(std::move(core), std::move(send),
                                                         ctx.status, ctx.auth);
      });
}
