// Small value types shared by the router and both workers.
#ifndef TANDEM_COMMON_SERVING_TYPES_H_
#define TANDEM_COMMON_SERVING_TYPES_H_

#include <cstdint>
#include <string>

#include "engine/model/llama_model.h"
#include "kvtransfer/kv_transfer.h"

namespace tandem {

// Why a request stopped; values equal tandem.v1.FinishReason.
enum class FinishReason : uint32_t {
  kNone = 0,       // still running
  kLength = 1,     // max_tokens reached
  kStop = 2,       // EOS
  kContext = 3,    // context length reached
  kCancelled = 4,
};

// Where the prompt is prefilled; values equal tandem.v1.RouteOverride.
enum class RouteChoice : uint32_t { kAuto = 0, kLocal = 1, kRemote = 2 };

// Identifies the numerics of this process's CPU engine, including the
// kernel ISA picked at start-up: both ends of a KV transfer must compute K/V
// the same way (DESIGN.md, KV transfer), e.g. "tandem-cpu/avx512/f32-kv/v2".
// The trailing version changes whenever the engine's arithmetic does
// (v2: attention's vectorized exp and 4-lane softmax sum).
inline std::string CpuNumericsId() {
  return std::string("tandem-cpu/") + model::KernelIsa() + "/f32-kv/v2";
}

// The KV layout this process offers or expects for `model`.
inline kvtransfer::KvLayout KvLayoutForModel(const model::LlamaConfig& config,
                                             const std::string& fingerprint) {
  kvtransfer::KvLayout layout;
  layout.model_fingerprint = fingerprint;
  layout.n_layers = static_cast<uint32_t>(config.n_layers);
  layout.n_kv_heads = static_cast<uint32_t>(config.n_head_kv);
  layout.head_dim = static_cast<uint32_t>(config.head_dim);
  layout.dtype = "f32";
  layout.rope_freq_base = config.rope_freq_base;
  layout.rope_dim = static_cast<uint32_t>(config.rope_dim);
  layout.rope_type = "norm";
  layout.numerics_id = CpuNumericsId();
  return layout;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_TYPES_H_
