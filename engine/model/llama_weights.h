// Loading a Llama model's hyperparameters and weights from GGUF (internal to
// engine/model; LlamaModel::Load is the public entry point).
//
// Weight matrices stay in their GGUF type (F32, F16, BF16, Q8_0), read in
// place from the mapping; MatMul dequantizes them a panel at a time
// (weight_matrix.h). The small norm vectors are converted to F32 at load.
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
#include "engine/model/weight_matrix.h"

namespace tandem::model::internal {

// A norm weight vector as F32. `data` points either into the GGUF mapping
// or into `owned`.
// Moves keep pointers into the owned vectors valid (their buffers move
// with them); copies would not, so the weights are move-only.
struct MoveOnly {
  MoveOnly() = default;
  MoveOnly(MoveOnly&&) = default;
  MoveOnly& operator=(MoveOnly&&) = default;
  MoveOnly(const MoveOnly&) = delete;
  MoveOnly& operator=(const MoveOnly&) = delete;
};

struct Tensor : MoveOnly {
  const float* data = nullptr;
  std::vector<float> owned;
};

// A weight matrix in its GGUF storage type. `view.data` points into the GGUF
// mapping, or into `owned` for an F32 tensor that is not 4-byte aligned in
// the file (copied at load), or into another Matrix (tied output).
struct Matrix : MoveOnly {
  WeightMatrix view;
  std::vector<float> owned;
};

struct LayerWeights {
  Tensor attn_norm;  // [n_embd]
  Matrix wq;         // [n_head * head_dim][n_embd]
  Matrix wk;         // [n_head_kv * head_dim][n_embd]
  Matrix wv;         // [n_head_kv * head_dim][n_embd]
  Matrix wo;         // [n_embd][n_head * head_dim]
  Tensor ffn_norm;   // [n_embd]
  Matrix w_gate;     // [n_ff][n_embd]
  Matrix w_up;       // [n_ff][n_embd]
  Matrix w_down;     // [n_embd][n_ff]
};

struct ModelWeights {
  Matrix token_embd;   // [vocab][n_embd]
  Tensor output_norm;  // [n_embd]
  Matrix output;       // [vocab][n_embd]; token_embd's rows when tied
  std::vector<LayerWeights> layers;
};

// Reads LlamaConfig from general.* and llama.* metadata. Errors:
// INVALID_ARGUMENT naming the key for a non-llama architecture, a missing
// required key, or an out-of-range / inconsistent value.
absl::StatusOr<LlamaConfig> ReadLlamaConfig(const gguf::GgufFile& file);

// Finds and checks (presence, shape, byte size, Q8_0 rows whole blocks)
// every tensor `config` needs. Errors: INVALID_ARGUMENT naming the tensor
// and the file.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadLlamaWeights(const gguf::GgufFile& file,
                                                               const LlamaConfig& config);

}  // namespace tandem::model::internal

#endif  // TANDEM_ENGINE_MODEL_LLAMA_WEIGHTS_H_
