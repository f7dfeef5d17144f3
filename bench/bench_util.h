// Helpers shared by the micro-benchmarks (bench/): locating the model,
// loading it once per thread count, random inputs.
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
#include "engine/model/llama_model.h"

namespace tandem::bench {

// Path of the benchmark model: $TANDEM_MODEL when set, else
// <checkout>/../shared/models/stories260K.gguf (as the tests locate it).
std::string ModelPath();

// The model at ModelPath() loaded with num_threads threads, loaded on first
// use and kept for the life of the process. Errors: those of
// GgufFile::Open and LlamaModel::Load (e.g. UNAVAILABLE for a missing file).
absl::StatusOr<const model::LlamaModel*> GetModel(int32_t num_threads);

// n token ids uniform in [0, vocab_size), from a fixed-seed generator
// (std::mt19937 seeded with `seed`), so runs are reproducible.
std::vector<int32_t> RandomTokens(size_t n, int32_t vocab_size, uint32_t seed);

// n floats uniform in [-1, 1) from std::mt19937(seed).
std::vector<float> RandomFloats(size_t n, uint32_t seed);

}  // namespace tandem::bench

#endif  // TANDEM_BENCH_BENCH_UTIL_H_
