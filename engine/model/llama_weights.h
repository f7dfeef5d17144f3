// Loading a model's hyperparameters and weights from GGUF, for every
// architecture of the table (model_arch.h); internal to engine/model,
// LlamaModel::Load is the public entry point.
//
// Weight matrices stay in their GGUF type (F32, F16, BF16, Q8_0), read in
// place from the mapping (a tied output is a second view of token_embd, not
// a copy); MatMul dequantizes them a panel at a time (weight_matrix.h), or,
// for Q8_0 under engine.q8_matmul: int8, reads a packed copy made at load
// (PackQ8Int8, q8_int8.h). The
// small vectors (norms, Q/K/V biases, RoPE frequency factors) are used in
// place when F32 and aligned, else converted to F32 at load.
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
#include "engine/model/f32_panels.h"
#include "engine/model/q8_int8.h"
#include "engine/model/weight_matrix.h"

namespace tandem::model::internal {

// A weight vector (norm, bias, frequency factors) as F32, or absent
// (data null) for an optional tensor the file does not have. `data` points
// either into the GGUF mapping or into `owned`.
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
  // The int8 packing of a Q8_0 matrix (PackQ8Int8), which view.int8
  // points to; null otherwise.
  std::unique_ptr<const Q8Int8Matrix> int8;
  // The panel packing of an F32 matrix (PackF32Panels), which
  // view.f32_panels points to; null otherwise.
  std::unique_ptr<const F32PanelMatrix> f32_panels;
};

struct LayerWeights {
  Tensor attn_norm;  // [n_embd]
  Matrix wq;         // [n_head * head_dim][n_embd]
  Matrix wk;         // [n_head_kv * head_dim][n_embd]
  Matrix wv;         // [n_head_kv * head_dim][n_embd]
  Tensor bq;         // [n_head * head_dim]     } when config.qkv_bias,
  Tensor bk;         // [n_head_kv * head_dim]  } else data null
  Tensor bv;         // [n_head_kv * head_dim]  }
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
  Tensor rope_freqs;   // [rope_dim / 2] when config.rope_freq_factors, else null
  std::vector<LayerWeights> layers;
};

// Reads LlamaConfig from general.* and the architecture's "<arch>.*"
// metadata keys (llama.cpp's llama_model::load_hparams), and which optional
// tensors of its row the file has (qkv_bias, rope_freq_factors). Errors:
// INVALID_ARGUMENT naming the key or tensor for an architecture outside the
// table (with the supported names), a missing required key, an
// out-of-range / inconsistent value, a key whose value changes the math in
// a way not supported ("<arch>.attention.key_length" / "value_length" other
// than n_embd / n_head, "<arch>.rope.scaling.type" other than "none", a
// linear "<arch>.rope.scaling.factor" or "rope.scale_linear" other than 1
// while the type is absent (llama.cpp then scales linearly),
// "<arch>.rope.scaling.attn_factor" other than 1, "<arch>.expert_count" >
// 0), or rope_freqs.weight in an architecture that does not use it.
[[nodiscard]] absl::StatusOr<LlamaConfig> ReadLlamaConfig(const gguf::GgufFile& file);

// Finds and checks (presence, shape, byte size, Q8_0 rows whole blocks)
// every tensor `config` needs, and that the file has no other tensor
// (llama.cpp's loader refuses a tensor count that differs from what it
// created, too). Q/K/V biases: all of q, k, v in every layer when
// config.qkv_bias. rope_freqs.weight: rope_dim / 2 finite values > 0.
// Errors: INVALID_ARGUMENT naming the tensor and the file.
[[nodiscard]] absl::StatusOr<std::unique_ptr<ModelWeights>> LoadLlamaWeights(
    const gguf::GgufFile& file, const LlamaConfig& config);

// engine.q8_matmul: int8: packs every Q8_0 matrix Forward multiplies (each
// layer's seven and `output`; not token_embd, which is only looked up)
// with Q8Int8Matrix::Pack and points its view.int8 at the packing. Other
// types are left as they are (a model without Q8_0 matrices is unchanged).
// Returns true when every matrix Forward multiplies is Q8_0 (so no MatMul
// of the model runs the ISA-dependent float path).
bool PackQ8Int8(ModelWeights* weights);

// LlamaModelOptions::f32_panels: packs every F32 matrix Forward multiplies
// (each layer's seven and `output`) with F32PanelMatrix::Pack and points
// its view.f32_panels at the packing (4 bytes per weight beside the
// mapping's). Other types are left as they are. Returns true when every
// matrix Forward multiplies is F32 (so no MatMul of the model depends on
// the ISA).
bool PackF32Panels(ModelWeights* weights);

}  // namespace tandem::model::internal

#endif  // TANDEM_ENGINE_MODEL_LLAMA_WEIGHTS_H_
