#include "worker/worker_engine.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/server/log.h"
#include "common/server/proto_convert.h"
#include "engine/backend/fault_injecting_backend.h"
#include "engine/scheduler/prefill_placement.h"

namespace tandem {

core::EngineCoreOptions CoreOptionsFromConfig(const ClusterConfig& config, const ModelBundle& model,
                                              const std::string& worker_label,
                                              KvEventPublisher* kv_events) {
  core::EngineCoreOptions o;
  o.scheduler.max_num_batched_tokens = config.engine.max_num_batched_tokens;
  o.scheduler.max_num_seqs = config.engine.max_num_seqs;
  o.scheduler.prefill_chunk_tokens = config.engine.prefill_chunk_tokens;
  o.scheduler.enable_prefix_caching = config.engine.enable_prefix_caching;
  o.scheduler.max_local_prefill_tokens = config.conditional.max_local_prefill_tokens;
  switch (config.conditional.placement) {
    case PlacementMode::kThreshold:
      o.scheduler.placement = scheduler::PlacementPolicy::kThreshold;
      break;
    case PlacementMode::kSlo:
      o.scheduler.placement = scheduler::PlacementPolicy::kSlo;
      break;
  }
  o.scheduler.slo_ttft_ms = config.slo.ttft_ms.value_or(0);
  o.scheduler.slo_tpot_ms = config.slo.tpot_ms.value_or(0);
  o.eog_token_ids = model.tokenizer->eog_ids();
  o.model_fingerprint = model.fingerprint;
  o.worker_label = worker_label;
  switch (config.conditional.on_prefill_failure) {
    case OnPrefillFailure::kFail:
      o.on_prefill_failure = core::PrefillFailurePolicy::kFail;
      break;
    case OnPrefillFailure::kRetry:
      o.on_prefill_failure = core::PrefillFailurePolicy::kRetry;
      break;
    case OnPrefillFailure::kLocal:
      o.on_prefill_failure = core::PrefillFailurePolicy::kLocal;
      break;
  }
  o.max_prefill_attempts = config.kv.max_prefill_attempts;
  o.log = [](const std::string& line) { rpc::Log(line); };
  if (kv_events != nullptr && config.engine.enable_prefix_caching) {
    o.kv_event_sink = [kv_events](std::vector<kv::KvCacheEvent> events) {
      kv_events->Publish(std::move(events));
    };
  }
  return o;
}

backend::BackendOptions BackendOptionsFromConfig(const ClusterConfig& config,
                                                 const WorkerConfig& worker) {
  backend::BackendOptions o;
  o.device = config.WorkerDevice(worker);
  o.device_key = config.WorkerDeviceKey(worker);
  o.kv_cache_dtype = config.WorkerKvDtype(worker);
  o.block_size = config.engine.block_size;
  o.num_kv_blocks = config.engine.num_kv_blocks;
  o.num_kv_blocks_set = config.engine.num_kv_blocks_set;
  o.gpu_memory_fraction = config.engine.gpu_memory_fraction;
  o.batch_invariant = config.engine.batch_invariant;
  o.q8_matmul = config.engine.q8_matmul;
  o.max_num_batched_tokens = config.engine.max_num_batched_tokens;
  o.max_num_seqs = config.engine.max_num_seqs;
  o.log = [](const std::string& line) { rpc::Log(line); };
  return o;
}

absl::StatusOr<double> ParseGpuMemoryFractionFlag(const std::string& text,
                                                  const backend::DeviceSpec& device) {
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-fraction: expected a number, got '", text, "'"));
  }
  if (!(value > 0 && value <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-fraction: must be in (0, 1], got ", text));
  }
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(
        "--gpu-memory-fraction: this worker runs on cpu (no GPU memory to divide)");
  }
  return value;
}

absl::StatusOr<std::unique_ptr<backend::ModelBackend>> WithBackendFault(
    const std::map<std::string, std::string>& flags,
    std::unique_ptr<backend::ModelBackend> backend) {
  auto it = flags.find("fault-backend-error");
  if (it == flags.end()) return backend;
  absl::StatusOr<backend::BackendFault> fault =
      backend::ParseBackendFault(it->second, "--fault-backend-error");
  if (!fault.ok()) return fault.status();
  rpc::Log(absl::StrCat("fault injection: --fault-backend-error ",
                        backend::BackendFaultToString(*fault)));
  return std::make_unique<backend::FaultInjectingBackend>(std::move(backend), *fault);
}

namespace {

kvtransfer::KvLayout LayoutOf(const kv::KvShape& shape, kv::KvDtype dtype,
                              const std::string& fingerprint) {
  kvtransfer::KvLayout layout;
  layout.model_fingerprint = fingerprint;
  layout.n_layers = static_cast<uint32_t>(shape.n_layers);
  layout.n_kv_heads = static_cast<uint32_t>(shape.n_kv_heads);
  layout.head_dim = static_cast<uint32_t>(shape.head_dim);
  layout.dtype = dtype;
  return layout;
}

}  // namespace

kvtransfer::KvLayout KvLayoutFor(const kv::KvStorage& storage, const std::string& fingerprint) {
  return LayoutOf(storage.shape(), storage.dtype(), fingerprint);
}

kvtransfer::KvLayout ExpectedKvLayout(const ClusterConfig& config, const ModelBundle& model,
                                      const WorkerConfig& worker) {
  // The backend BackendFromConfig builds: model->kv_shape (block size is
  // not part of the layout) in the worker's KV dtype.
  return LayoutOf(model.model->kv_shape(config.engine.block_size), config.WorkerKvDtype(worker),
                  model.fingerprint);
}

v1::WorkerStatus StatusFromCore(const core::CoreStats& stats, const std::string& kv_layout_id,
                                const std::string& bit_exact_class) {
  v1::WorkerStatus status;
  status.set_running_requests(stats.running_requests);
  status.set_waiting_requests(stats.waiting_requests);
  status.set_queued_prefill_tokens(stats.queued_prefill_tokens);
  status.set_kv_blocks_in_use(stats.kv_blocks_in_use);
  status.set_kv_blocks_total(stats.kv_blocks_total);
  status.set_kv_blocks_cached(stats.kv_blocks_cached);
  status.set_transfers_in_flight(stats.transfers_in_flight);
  status.set_prefill_tokens_computed_total(stats.prefill_tokens_computed_total);
  status.set_kv_bytes_sent_total(stats.kv_bytes_sent_total);
  status.set_kv_bytes_received_total(stats.kv_bytes_received_total);
  status.set_decode_tokens_total(stats.decode_tokens_total);
  status.set_max_decode_batch_size(stats.max_decode_batch_size);
  status.set_preemptions_total(stats.preemptions_total);
  status.set_prompt_tokens_total(stats.prompt_tokens_total);
  status.set_prompt_tokens_cached_total(stats.prompt_tokens_cached_total);
  status.set_generation_tokens_total(stats.generation_tokens_total);
  status.set_prefix_cache_queried_tokens_total(stats.prefix_cache.queried_tokens);
  status.set_prefix_cache_hit_tokens_total(stats.prefix_cache.hit_tokens);
  status.set_engine_steps_total(stats.engine_steps_total);
  status.set_kv_transfers_sent_total(stats.kv_transfers_sent_total);
  status.set_kv_transfers_received_total(stats.kv_transfers_received_total);
  status.set_kv_transfer_seconds_sent_total(stats.kv_transfer_seconds_sent_total);
  status.set_kv_transfer_seconds_received_total(stats.kv_transfer_seconds_received_total);
  status.set_kv_layout_id(kv_layout_id);
  status.set_bit_exact_class(bit_exact_class);
  StepModelToProto(stats.step_model, status.mutable_step_model());
  return status;
}

}  // namespace tandem
