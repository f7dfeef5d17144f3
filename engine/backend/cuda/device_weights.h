// The model's weights uploaded once to the device for the CUDA forward
// (DESIGN.md, GPU workers). Every matrix is stored in one compute dtype:
// F32 when keep_f32_weights (the accuracy mode), else F16 when every
// matrix of the file is F16, else BF16. Quantized matrices (Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) are dequantized at load on the host
// (model::internal::DequantizeRows, the CPU engine's exact dequantization)
// and converted on the device (round to nearest even); no kernel reads a
// quantized type. Per layer, Wq/Wk/Wv are fused into one [q_dim + 2*kv_dim]
// x [n_embd] matrix and Wgate/Wup into one [2*n_ff] x [n_embd] matrix, so
// each is one GEMM. Norms, biases and RoPE factors are F32.
//
// Owns: the device copies. Does not touch: the host model (read once).
// Threads: built once at start-up; immutable after.
#ifndef TANDEM_ENGINE_BACKEND_CUDA_DEVICE_WEIGHTS_H_
#define TANDEM_ENGINE_BACKEND_CUDA_DEVICE_WEIGHTS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/cuda/device_buffer.h"
#include "engine/model/llama_model.h"

namespace tandem::backend::cuda {

// A row-major matrix [rows][cols] of DeviceWeights::dtype on the device
// (GEMM: out[m][rows] = act[m][cols] . W^T).
struct DeviceMatrix {
  const void* data = nullptr;  // into DeviceWeights::arena
  int32_t rows = 0;
  int32_t cols = 0;
};

struct DeviceLayer {
  const float* attn_norm = nullptr;  // [n_embd]
  DeviceMatrix wqkv;                 // [q_dim + 2*kv_dim][n_embd]
  const float* bqkv = nullptr;       // [q_dim + 2*kv_dim], null without qkv_bias
  DeviceMatrix wo;                   // [n_embd][q_dim]
  const float* ffn_norm = nullptr;   // [n_embd]
  DeviceMatrix w_gate_up;            // [2*n_ff][n_embd]: gate rows, then up rows
  DeviceMatrix w_down;               // [n_embd][n_ff]
};

struct DeviceWeights {
  Dtype dtype = Dtype::kBF16;          // every DeviceMatrix's element type
  DeviceMatrix token_embd;             // [vocab][n_embd]
  DeviceMatrix output;                 // [vocab][n_embd] (token_embd's when tied)
  const float* output_norm = nullptr;  // [n_embd]
  const float* rope_freqs = nullptr;   // [rope_dim/2] or null
  std::vector<DeviceLayer> layers;
  std::vector<DeviceBuffer> arena;  // owns everything above
  uint64_t bytes = 0;               // device bytes of the weights
};

// Uploads `model`'s weights on `stream` (synchronizing it at the end:
// start-up only). Errors: RESOURCE_EXHAUSTED "the model does not fit:
// weights need N GiB, the device has M GiB free" (naming the numbers),
// INTERNAL for another CUDA error.
[[nodiscard]] absl::StatusOr<DeviceWeights> UploadWeights(const model::LlamaModel& model,
                                                          bool keep_f32_weights,
                                                          cudaStream_t stream);

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_DEVICE_WEIGHTS_H_
