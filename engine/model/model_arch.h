// The architecture table: which GGUF architectures the forward pass serves
// and what sets each apart, one row per architecture (llama.cpp's llm_arch,
// LLM_ARCH_NAMES and LLM_KV_* key names in src/llama-arch.cpp, the tensor
// lists of llama_model::load_tensors and llama_model_rope_type in
// src/llama-model.cpp, commit c392e50).
//
// Owns: the rows (constants). Does not touch: files, weights, the graph
// (llama_weights.cc reads a row to know which keys and tensors to expect;
// llama_model.cc runs the one shared graph with the row's choices, copied
// into LlamaConfig).
// Threads: immutable data; any thread.
//
// Adding an architecture whose graph is the shared one (RMSNorm, attention
// with RoPE, SwiGLU FFN, optional tied output) is a new enumerator and a
// new row; a different graph (QK norm, MoE, sliding windows) needs new
// pieces in the forward and is refused until then.
#ifndef TANDEM_ENGINE_MODEL_MODEL_ARCH_H_
#define TANDEM_ENGINE_MODEL_MODEL_ARCH_H_

#include <span>
#include <string>
#include <string_view>

namespace tandem::model {

// The architectures served (general.architecture). Order carries no
// meaning; switches over it have no default.
enum class ModelArch { kLlama, kQwen2 };

// How RoPE pairs the dimensions of a head (ggml's GGML_ROPE_TYPE_NORM = 0 and
// GGML_ROPE_TYPE_NEOX = 2). Both rotate pair i, 0 <= i < rope_dim / 2, by
// the angle theta_i (llama_model.h); they differ in which dimensions form
// pair i:
//   kNorm: (2i, 2i + 1), consecutive (Llama, GPT-J style).
//   kNeox: (i, i + rope_dim / 2), the two halves (GPT-NeoX style, Qwen2).
enum class RopeType { kNorm, kNeox };

// Whether a tensor family may or must appear in a file.
enum class TensorRule { kAbsent, kOptional, kRequired };

// One row of the table.
struct ArchInfo {
  ModelArch arch;
  // general.architecture's value, and the prefix of the architecture's
  // metadata keys: "<name>.context_length", "<name>.rope.freq_base", ...
  // (llama.cpp formats LLM_KV_* names with the architecture name).
  const char* name;
  RopeType rope_type;
  // blk.N.attn_{q,k,v}.bias: F32 vectors of the projection's output width,
  // added after the matmul (llama.cpp: required for qwen2, optional for
  // llama, where it is used when present).
  TensorRule qkv_bias;
  // rope_freqs.weight: rope_dim / 2 F32 frequency divisors, one per pair
  // (Llama 3.1's RoPE scaling, written by convert_hf_to_gguf.py). llama.cpp
  // loads it for llama only; a qwen2 file with it has an extra tensor.
  TensorRule rope_freqs;
  // output.weight absent: logits use token_embd.weight (tied embeddings).
  bool output_may_be_tied;
};

// Every row, in enum order.
std::span<const ArchInfo> Architectures();

// The row of `arch`.
const ArchInfo& GetArchInfo(ModelArch arch);

// The row whose name is `name` exactly, or null (an architecture not
// served, e.g. "qwen3").
const ArchInfo* FindArch(std::string_view name);

// The served names, comma-separated in table order: "llama, qwen2".
std::string SupportedArchNames();

// "<arch name>.<suffix>": the architecture's metadata key.
std::string ArchKey(const ArchInfo& arch, std::string_view suffix);

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_MODEL_MODEL_ARCH_H_
