// What both workers build from the cluster config and the loaded model,
// written once: the engine core's options, the backend (CPU or CUDA, per
// the worker's device), the KV layout a KV transfer must agree on, and the
// status fields that come from the core's counters.
//
// Owns: these mappings. Does not touch: the engine's behaviour (engine/),
// sockets (kvtransfer/), gRPC serving (the services).
// Threads: pure functions.
#ifndef TANDEM_WORKER_WORKER_ENGINE_H_
#define TANDEM_WORKER_WORKER_ENGINE_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster_config.h"
#include "worker/kv_event_publisher.h"
#include "common/server/model_bundle.h"
#include "absl/status/statusor.h"
#include "engine/backend/backend_factory.h"
#include "engine/backend/model_backend.h"
#include "engine/core/engine_core.h"
#include "kvtransfer/kv_transfer.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

// engine.{max_num_batched_tokens, max_num_seqs, prefill_chunk_tokens,
// enable_prefix_caching}, conditional.{max_local_prefill_tokens,
// placement (scheduler.placement), on_prefill_failure},
// slo.{ttft_ms, tpot_ms} (scheduler.slo_ttft_ms / slo_tpot_ms, 0 when
// unset), kv.max_prefill_attempts, the tokenizer's
// end-of-generation ids and the model fingerprint; failover lines go to
// rpc::Log. `worker_label` names the worker in errors ("decode worker").
// `kv_events` (may be null) receives the engine's KV events
// (kv_event_sink), only when engine.enable_prefix_caching is on: without
// it nothing is recorded.
core::EngineCoreOptions CoreOptionsFromConfig(const ClusterConfig& config, const ModelBundle& model,
                                              const std::string& worker_label,
                                              KvEventPublisher* kv_events = nullptr);

// The backend options of `worker` (its entry in `config`): its device
// (entry's `device:`, else engine.device) and the key it came from, its KV
// dtype (ClusterConfig::WorkerKvDtype), engine.{block_size, num_kv_blocks
// (and whether it was given), gpu_memory_fraction, batch_invariant,
// max_num_batched_tokens, max_num_seqs, q8_matmul}; start-up lines go to rpc::Log.
backend::BackendOptions BackendOptionsFromConfig(const ClusterConfig& config,
                                                 const WorkerConfig& worker);

// The backend `worker` computes on: backend::CreateBackend over
// BackendOptionsFromConfig. Errors (a start-up refusal the worker prints in
// one line before exiting non-zero): CreateBackend's, e.g.
// FAILED_PRECONDITION "engine.device: cuda:0, but this machine has no CUDA
// GPU (...)", INVALID_ARGUMENT "engine.batch_invariant: false on
// engine.device cpu, but the CPU backend is always batch-invariant (...)".
[[nodiscard]] absl::StatusOr<std::unique_ptr<backend::ModelBackend>> BackendFromConfig(
    const ClusterConfig& config, const ModelBundle& model, const WorkerConfig& worker,
    const backend::DeviceQuery& query = backend::SystemDeviceQuery());

// Parses the worker flag --gpu-memory-fraction F (overrides
// engine.gpu_memory_fraction): a number in (0, 1], refused on a worker
// whose device is cpu. INVALID_ARGUMENT naming the flag otherwise.
[[nodiscard]] absl::StatusOr<double> ParseGpuMemoryFractionFlag(const std::string& text,
                                                                const backend::DeviceSpec& device);

// --fault-backend-error KIND@N in `flags` (tests only;
// backend::ParseBackendFault): `backend` wrapped in a
// backend::FaultInjectingBackend whose N-th Forward fails; without the
// flag, `backend` itself. A bad value: INVALID_ARGUMENT naming the flag.
[[nodiscard]] absl::StatusOr<std::unique_ptr<backend::ModelBackend>> WithBackendFault(
    const std::map<std::string, std::string>& flags,
    std::unique_ptr<backend::ModelBackend> backend);

// The KV layout of `storage` for the model with `fingerprint` (layers, KV
// heads, head dim, dtype): both ends of a KV transfer must have equal ones.
kvtransfer::KvLayout KvLayoutFor(const kv::KvStorage& storage, const std::string& fingerprint);

// The KV layout `worker` (an entry of `config`) serving `model` has,
// without building its backend: KvLayoutFor of BackendFromConfig(config,
// model, worker)'s storage (the model's KV shape, the worker's KV dtype:
// ClusterConfig::WorkerKvDtype, so a cluster mixing CPU and GPU workers
// expects each its own). A WorkerConfig{} (no entry) gets engine.device's.
// The router refuses a worker whose KvLayout::LayoutId differs from the
// one of its entry.
kvtransfer::KvLayout ExpectedKvLayout(const ClusterConfig& config, const ModelBundle& model,
                                      const WorkerConfig& worker);

// The status fields a worker's engine core counts (running requests, KV
// blocks, transfers, token and byte counters), plus the KV layout id and
// the bit-exact class; name/role/address/ready are the caller's.
v1::WorkerStatus StatusFromCore(const core::CoreStats& stats, const std::string& kv_layout_id,
                                const std::string& bit_exact_class);

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_ENGINE_H_
