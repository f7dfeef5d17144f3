// The CPU forward pass's settings that the cluster config names
// (engine.q8_matmul, engine.threads): vocabulary only, no code, in a header
// of its own at the bottom of engine/ so common/cluster_config names them
// without including any model header (issue #33: config sits above the
// engine, never inside it). The model (engine/model/llama_model.h) takes
// them in LlamaModelOptions.
#ifndef TANDEM_ENGINE_FORWARD_OPTIONS_H_
#define TANDEM_ENGINE_FORWARD_OPTIONS_H_

#include <cstdint>

namespace tandem::model {

// The most threads one model's Forward runs on (engine.threads' upper
// bound; LlamaModel::kMaxThreads).
inline constexpr int32_t kMaxForwardThreads = 256;

// engine.q8_matmul: how a Q8_0 weight matrix is multiplied on the CPU.

//   kExact: dequantized exactly to F32 (q * d) and multiplied in float
//           (internal cpu_kernels.h): the bits of the model's F32
//           conversion.
//   kInt8:  llama.cpp's Q8_0 x Q8_0 path: the activations quantized per
//           block of 32 (ggml's quantize_row_q8_0_ref), exact int32 block
//           dot products, blocks combined in float in index order
//           (internal q8_int8.h). Its own bit-exact class, the same on
//           every ISA, batch size and thread count. A model with no Q8_0
//           matrix computes exactly as with kExact.
enum class Q8MatMul { kExact, kInt8 };

// "exact" or "int8": the engine.q8_matmul value of `mode`.
inline const char* Q8MatMulName(Q8MatMul mode) {
  switch (mode) {
    case Q8MatMul::kExact:
      return "exact";
    case Q8MatMul::kInt8:
      return "int8";
  }
  return "exact";
}

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_FORWARD_OPTIONS_H_
