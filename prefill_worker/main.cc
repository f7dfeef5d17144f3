// tandem-prefill-worker: thin main; see common/server/worker_main.h.
// Extra flag --fault-stall-after-frames N (tests only): stall the KV send
// after N frames, to exercise the decode worker's transfer timeout.
#include "absl/strings/numbers.h"
#include "common/server/worker_main.h"
#include "prefill_worker/prefill_service.h"

int main(int argc, char** argv) {
  using namespace tandem;
  return RunWorkerMain(
      argc, argv, v1::ROLE_PREFILL, {"fault-stall-after-frames"},
      [](const WorkerContext& ctx) -> absl::StatusOr<std::unique_ptr<WorkerRuntime>> {
        prefill::PrefillEngineOptions options;
        options.block_size = ctx.config->engine.block_size;
        options.num_kv_blocks = ctx.config->engine.num_kv_blocks;
        options.max_num_batched_tokens = ctx.config->engine.max_num_batched_tokens;
        options.prefill_chunk_tokens = ctx.config->engine.prefill_chunk_tokens;
        options.max_num_seqs = ctx.config->engine.max_num_seqs;
        options.enable_prefix_caching = ctx.config->engine.enable_prefix_caching;
        options.transfer_timeout_ms = ctx.config->kv.transfer_timeout_ms;
        options.eos_token_id = ctx.model->tokenizer->eos_id();
        options.model_fingerprint = ctx.model->fingerprint;
        auto it = ctx.flags->find("fault-stall-after-frames");
        if (it != ctx.flags->end() &&
            !absl::SimpleAtoi(it->second, &options.fault_stall_after_frames)) {
          return absl::InvalidArgumentError("--fault-stall-after-frames: not an integer");
        }
        auto engine = std::make_unique<prefill::PrefillEngine>(options, ctx.model->model.get());
        return std::make_unique<prefill::PrefillService>(std::move(engine), ctx.status);
      });
}
