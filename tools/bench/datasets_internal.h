// Shared by datasets.cc (LoadDataset, random, prefix-repetition) and
// datasets_files.cc (the ShareGPT and Mooncake files). Not a public API.
#ifndef TANDEM_TOOLS_BENCH_DATASETS_INTERNAL_H_
#define TANDEM_TOOLS_BENCH_DATASETS_INTERNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tools/bench/bench_types.h"
#include "tools/bench/dataset_sampling.h"
#include "tools/bench/datasets.h"

namespace tandem::bench {

// Bounds that keep a typo from allocating gigabytes: one prompt or output
// holds at most kMaxRequestTokens tokens (16 Mi), a whole dataset at most
// kMaxDatasetTokens prompt ids (256 Mi ids = 1 GiB).
inline constexpr int64_t kMaxRequestTokens = int64_t{1} << 24;
inline constexpr int64_t kMaxDatasetTokens = int64_t{1} << 28;

// OK when context_length is 0 or prompt_len + output_len <= context_length;
// else INVALID_ARGUMENT "request I: prompt_len P + output_len O = T tokens
// exceeds the model's context length C; lower HINT". `what` names the
// request ("request 3" or "request 3 (line 4)").
[[nodiscard]] absl::Status CheckContextLength(const std::string& what, int64_t prompt_len,
                                              int64_t output_len, int32_t context_length,
                                              const std::string& hint);

// OK when total_prompt_tokens <= kMaxDatasetTokens, else INVALID_ARGUMENT
// naming the total and `hint` (the flags that make it smaller).
[[nodiscard]] absl::Status CheckDatasetSize(int64_t total_prompt_tokens, const std::string& hint);

// The sharegpt dataset (datasets.h): options.path is set and
// options.num_prompts >= 1 (checked by LoadDataset).
[[nodiscard]] absl::StatusOr<std::vector<BenchRequest>> LoadShareGpt(const DatasetOptions& options,
                                                                     const Tokenizer& tokenizer);

// The mooncake dataset (datasets.h), ids drawn with `sampler`.
[[nodiscard]] absl::StatusOr<std::vector<BenchRequest>> LoadMooncake(const DatasetOptions& options,
                                                                     const TokenSampler& sampler);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_DATASETS_INTERNAL_H_
