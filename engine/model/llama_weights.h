// Loading a Llama model's hyperparameters and weights from GGUF (internal to
// engine/model; LlamaModel::Load is the public entry point).
//
// Every weight ends up as F32 rows in memory: F32 tensors are read in place
// from the mapping (when 4-byte aligned), F16 / BF16 are widened and Q8_0 is
// dequantized at load (ggml's dequantize_row_q8_0: x = d * q).
// Threads: load once; the result is immutable.
#ifndef TANDEM_ENGINE_MODEL_LLAMA_WEIGHTS_H_
#define TANDEM_ENGINE_MODEL_LLAMA_WEIGHTS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/llama_model.h"

namespace tandem::model::internal {

// One weight as F32, row-major [ne1][ne0]. `data` points either into the
// GGUF mapping, into `owned`, or into another Tensor (tied output). Move
// keeps `data` valid (the vector's buffer moves with it); copying would not.
struct Tensor {
  Tensor() = default;
  Tensor(Tensor&&) = default;
  Tensor& operator=(Tensor&&) = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  const float* data = nullptr;
  std::vector<float> owned;
};

struct LayerWeights {
  Tensor attn_norm;  // [n_embd]
  Tensor wq;         // [n_head * head_dim][n_embd]
  Tensor wk;         // [n_head_kv * head_dim][n_embd]
  Tensor wv;         // [n_head_kv * head_dim][n_embd]
  Tensor wo;         // [n_embd][n_head * head_dim]
  Tensor ffn_norm;   // [n_embd]
  Tensor w_gate;     // [n_ff][n_embd]
  Tensor w_up;       // [n_ff][n_embd]
  Tensor w_down;     // [n_embd][n_ff]
};

struct ModelWeights {
  Tensor token_embd;   // [vocab][n_embd]
  Tensor output_norm;  // [n_embd]
  Tensor output;       // [vocab][n_embd]; token_embd's rows when tied
  std::vector<LayerWeights> layers;
};

// Reads LlamaConfig from general.* and llama.* metadata. Errors:
// INVALID_ARGUMENT naming the key for a non-llama architecture, a missing
// required key, or an out-of-range / inconsistent value.
absl::StatusOr<LlamaConfig> ReadLlamaConfig(const gguf::GgufFile& file);

// Finds, checks (presence, shape) and converts every tensor `config` needs.
// Errors: INVALID_ARGUMENT naming the tensor and the file.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadLlamaWeights(const gguf::GgufFile& file,
                                                               const LlamaConfig& config);

// Writes n elements of `type` starting at `data` (GGUF little-endian bytes,
// n a multiple of the type's block size) as floats to `out`.
void ConvertToF32(gguf::TensorType type, const uint8_t* data, size_t n, float* out);

}  // namespace tandem::model::internal

#endif  // TANDEM_ENGINE_MODEL_LLAMA_WEIGHTS_H_
