// Helpers shared by the micro-benchmarks (bench/): locating the model,
// loading it once per thread count, the size of its matrix weights, random
// inputs.
//
// Owns: the cached models (process lifetime). Threads: call from the
// benchmark's main thread only (Google Benchmark runs one benchmark at a
// time).
#ifndef TANDEM_BENCH_BENCH_UTIL_H_
#define TANDEM_BENCH_BENCH_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/kv_dtype.h"
#include "engine/model/llama_model.h"

namespace tandem::bench {

// Path of the benchmark model: $TANDEM_MODEL when set, else
// <checkout>/../shared/models/stories260K.gguf (as the tests locate it).
std::string ModelPath();

// How the benchmark model multiplies Q8_0 matrices: $TANDEM_BENCH_Q8_MATMUL
// ("exact", the default, or "int8"; engine.q8_matmul). Errors:
// INVALID_ARGUMENT naming the variable for another value.
[[nodiscard]] absl::StatusOr<model::Q8MatMul> BenchQ8MatMul();

// The KV dtype of the engine benchmarks' caches: $TANDEM_BENCH_KV_DTYPE
// ("f32", the default, "f16" or "bf16"; engine.kv_cache_dtype). Errors:
// INVALID_ARGUMENT naming the variable for another value.
[[nodiscard]] absl::StatusOr<kv::KvDtype> BenchKvDtype();

// The model at ModelPath() loaded with num_threads threads and
// BenchQ8MatMul(), loaded on first use and kept for the life of the
// process. Errors: those of BenchQ8MatMul, GgufFile::Open and
// LlamaModel::Load (e.g. UNAVAILABLE for a missing file).
[[nodiscard]] absl::StatusOr<const model::LlamaModel*> GetModel(int32_t num_threads);

// The weights a Llama forward pass multiplies by (MatMul), per token: in
// every layer attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up,
// ffn_down, plus output.weight (token_embd.weight when tied). The token
// embedding lookup and the norm vectors are not counted.
struct MatMulWeights {
  // Elements, from the config: n_layers x (n_embd x (2 q_dim + 2 kv_dim) +
  // 3 n_embd x n_ff) + vocab x n_embd, with q_dim = n_head x head_dim and
  // kv_dim = n_head_kv x head_dim. 2 x params is the FLOPs of one token's
  // MatMuls.
  int64_t params = 0;
  // Bytes of those tensors as stored in the GGUF file (and in memory): 4 a
  // weight for F32, 2 for F16/BF16, 34/32 for Q8_0. One decode step at batch
  // 1 reads each of them once.
  int64_t bytes = 0;
  // GGUF type name of blk.0.attn_q.weight ("F32", "F16", "BF16", "Q8_0"),
  // the model's weight type.
  std::string type;
};

// MatMulWeights of the model at ModelPath() (opened once, cached for the
// process), whose hyperparameters are `config`. Errors: those of
// GgufFile::Open; INVALID_ARGUMENT naming the tensor when one is missing or
// its element count differs from what `config` implies.
[[nodiscard]] absl::StatusOr<MatMulWeights> GetMatMulWeights(const model::LlamaConfig& config);

// n token ids uniform in [0, vocab_size), from a fixed-seed generator
// (std::mt19937 seeded with `seed`), so runs are reproducible.
std::vector<int32_t> RandomTokens(size_t n, int32_t vocab_size, uint32_t seed);

// n floats uniform in [-1, 1) from std::mt19937(seed).
std::vector<float> RandomFloats(size_t n, uint32_t seed);

}  // namespace tandem::bench

#endif  // TANDEM_BENCH_BENCH_UTIL_H_
