// tandem-decode-worker: thin main; see common/server/worker_main.h.
#include "common/server/worker_main.h"
#include "decode_worker/decode_service.h"

int main(int argc, char** argv) {
  using namespace tandem;
  return RunWorkerMain(
      argc, argv, v1::ROLE_DECODE, {},
      [](const WorkerContext& ctx) -> absl::StatusOr<std::unique_ptr<WorkerRuntime>> {
        decode::DecodeEngineOptions options;
        options.kv_host = ctx.worker->kv_listen.host;
        options.kv_port = ctx.worker->kv_listen.port;
        options.block_size = ctx.config->engine.block_size;
        options.num_kv_blocks = ctx.config->engine.num_kv_blocks;
        options.max_num_seqs = ctx.config->engine.max_num_seqs;
        options.max_num_batched_tokens = ctx.config->engine.max_num_batched_tokens;
        options.prefill_chunk_tokens = ctx.config->engine.prefill_chunk_tokens;
        options.enable_prefix_caching = ctx.config->engine.enable_prefix_caching;
        options.max_local_prefill_tokens = ctx.config->conditional.max_local_prefill_tokens;
        options.handshake_timeout_ms = ctx.config->kv.handshake_timeout_ms;
        options.transfer_timeout_ms = ctx.config->kv.transfer_timeout_ms;
        options.eos_token_id = ctx.model->tokenizer->eos_id();
        options.model_fingerprint = ctx.model->fingerprint;
        auto engine = decode::DecodeEngine::Create(options, ctx.model->model.get());
        if (!engine.ok()) {
          return absl::Status(engine.status().code(),
                              absl::StrCat("decode_workers[", ctx.worker->name,
                                           "].kv_listen: ", engine.status().message()));
        }
        return std::make_unique<decode::DecodeService>(std::move(*engine), ctx.status);
      });
}
