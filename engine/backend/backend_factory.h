// Builds a worker's ModelBackend from its options: the CPU backend, or the
// CUDA backend on engine.device cuda:N (DESIGN.md, GPU workers). The one
// place that knows which backends this build has.
//
// Owns: the choice and the start-up refusals (device missing, option not
// available on the device). Does not touch: the backends' insides.
// Threads: call once at start-up.
#ifndef TANDEM_ENGINE_BACKEND_BACKEND_FACTORY_H_
#define TANDEM_ENGINE_BACKEND_BACKEND_FACTORY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/backend/device.h"
#include "engine/backend/model_backend.h"
#include "engine/kv/kv_dtype.h"
#include "engine/model/llama_model.h"

namespace tandem::backend {

struct BackendOptions {
  DeviceSpec device;  // engine.device (or the worker entry's device:)
  // The config key `device` came from, named in the refusals
  // ("engine.device" or "decode_workers[0].device").
  std::string device_key = "engine.device";
  // engine.kv_cache_dtype: f32, f16 or bf16 on either backend (the config
  // layer fills in the device's default: f32 on cpu, bf16 on cuda:N).
  kv::KvDtype kv_cache_dtype = kv::KvDtype::kF32;
  int32_t block_size = 16;  // engine.block_size, tokens
  // CPU: the pool, blocks. CUDA: a cap on the planned pool when
  // num_kv_blocks_set (the key was given), else unused.
  int32_t num_kv_blocks = 2048;
  bool num_kv_blocks_set = false;
  double gpu_memory_fraction = 0.9;  // engine.gpu_memory_fraction (CUDA)
  // engine.batch_invariant (CUDA: one GEMM algorithm, split-K 1, fixed
  // attention split; the CPU backend is always batch-invariant).
  bool batch_invariant = true;
  int32_t max_num_batched_tokens = 2048;  // engine.max_num_batched_tokens
  int32_t max_num_seqs = 64;              // engine.max_num_seqs
  uint64_t transfer_buffer_bytes = 0;     // KV transfer staging on the device
  // CUDA accuracy mode (tandem selftest): F32 weights stay F32 on the
  // device (else every matrix is uploaded as BF16, F16 ones as F16), and
  // TF32 is off.
  bool keep_f32_weights = false;
  // engine.q8_matmul. CPU: must be what the model was loaded with
  // (LlamaModelOptions::q8_matmul, which does the work); CUDA: exact only.
  model::Q8MatMul q8_matmul = model::Q8MatMul::kExact;
  // Called with one line per start-up fact (the memory plan); may be null.
  std::function<void(const std::string&)> log;
};

// The backend for `model` (which must outlive it). For cuda:N the device
// is checked (CheckDeviceAvailable), described through `query` (logged as
// "device cuda:0: NVIDIA H200, 139.80 GiB (139.20 GiB free), sm_90"; the
// real query also makes it the thread's current device), then
// cuda::CudaBackend::Create builds it. Errors, one line naming the key and
// the numbers: FAILED_PRECONDITION for cuda:N without such a GPU (or one
// the runtime cannot describe) or in a build without CUDA, INVALID_ARGUMENT for an option the
// device does not have (batch_invariant false on the CPU,
// q8_matmul int8 on cuda:N, checked before the device), FAILED_PRECONDITION
// for a CPU q8_matmul other than the model's q8_matmul(),
// RESOURCE_EXHAUSTED when the model or one KV block does not fit
// (PlanGpuMemory).
[[nodiscard]] absl::StatusOr<std::unique_ptr<ModelBackend>> CreateBackend(
    const model::LlamaModel& model, const BackendOptions& options,
    const DeviceQuery& query = SystemDeviceQuery());

// True when this build contains the CUDA backend (TANDEM_ENABLE_CUDA).
bool HasCudaBackend();

}  // namespace tandem::backend

#endif  // TANDEM_ENGINE_BACKEND_BACKEND_FACTORY_H_
