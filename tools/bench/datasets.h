// The request sets of `tandem bench` (--dataset), as vLLM's `bench serve`
// builds them (benchmarks/datasets.py), except that prompts made of token
// ids are sent as ids (GenerateRequest.prompt_token_ids / an OpenAI token
// array) instead of being decoded to text, so their lengths are exact.
//
//   random             prompt and output lengths drawn uniformly from
//                      [floor(len*(1-ratio)), ceil(len*(1+ratio))] in
//                      double as vLLM computes it, the low end at least 1
//                      (--random-input-len, --random-output-len,
//                      --random-range-ratio in [0,1)),
//                      after a fixed --random-prefix-len shared prefix;
//                      ids uniform over the vocabulary minus its special
//                      ids (BOS/EOS/EOG given in DatasetOptions)
//   prefix-repetition  --prefix-repetition-num-prefixes random prefixes of
//                      --prefix-repetition-prefix-len tokens, each followed
//                      by a random suffix of --prefix-repetition-suffix-len;
//                      requests cycle through the prefixes, then are
//                      shuffled; --prefix-repetition-output-len each
//   sharegpt           a ShareGPT JSON file (--dataset-path: a list of
//                      {"conversations": [{"from", "value"}, ...]}): the
//                      first two turns are prompt and reply; the reply's
//                      token count is the output length (or
//                      --sharegpt-output-len); pairs with a prompt or reply
//                      under 4 tokens, a prompt over 1024, or prompt+output
//                      over 2048 are skipped (vLLM's filter); shuffled by seed
//   mooncake           a Mooncake trace (--dataset-path, JSONL: one
//                      {"timestamp": ms, "input_length": N, "output_length":
//                      M, "hash_ids": [...]} per line, in file order): block
//                      i of the prompt is --mooncake-block-size tokens drawn
//                      from a generator seeded by (seed, hash_ids[i]), so
//                      equal hash ids give equal blocks (prefix sharing
//                      replays); the prompt is cut to input_length, or
//                      extended with tokens of its own; timestamp_s =
//                      timestamp / 1000 (relative to the first line)
// All are deterministic for a given --seed.
#ifndef TANDEM_TOOLS_BENCH_DATASETS_H_
#define TANDEM_TOOLS_BENCH_DATASETS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/bench_types.h"

namespace tandem::bench {

// The dataset names --dataset accepts.
inline constexpr const char* kDatasetNames[] = {"random", "prefix-repetition", "sharegpt",
                                                "mooncake"};

struct DatasetOptions {
  std::string name = "random";  // one of kDatasetNames
  std::string path;             // sharegpt / mooncake: the file (required for them only)
  int32_t num_prompts = 1000;   // requests made (mooncake/sharegpt: at most the file's)
  uint64_t seed = 0;
  // The model's vocabulary (GetModelInfo): ids are drawn from [0,
  // vocab_size) minus `special_token_ids`.
  int32_t vocab_size = 0;
  std::vector<int32_t> special_token_ids;
  int32_t context_length = 0;  // > 0: a request with prompt_len + output_len over it is an error

  int32_t random_input_len = 1024;
  int32_t random_output_len = 128;
  double random_range_ratio = 0;
  int32_t random_prefix_len = 0;

  int32_t prefix_repetition_prefix_len = 256;
  int32_t prefix_repetition_suffix_len = 256;
  int32_t prefix_repetition_num_prefixes = 10;
  int32_t prefix_repetition_output_len = 128;

  std::optional<int32_t> sharegpt_output_len;

  int32_t mooncake_block_size = 512;
};

// Tokenizes text as the server does (Generation.Tokenize, add_bos true):
// ShareGPT needs it for prompt and reply lengths.
using Tokenizer = std::function<absl::StatusOr<std::vector<int32_t>>(const std::string& text)>;

// Builds options.num_prompts requests (fewer only where a file has fewer
// usable entries). Errors, INVALID_ARGUMENT naming the flag or the line:
// unknown dataset ("--dataset: unknown 'x' (expected random,
// prefix-repetition, sharegpt or mooncake)"); a length or count out of
// range (--random-input-len >= 1, --random-range-ratio in [0, 1),
// --num-prompts below --prefix-repetition-num-prefixes, a prompt over 2^24
// tokens or a dataset over 2^28 prompt ids in all, ...); vocab_size < 2 or
// every id special (the datasets that draw ids: all but sharegpt);
// sharegpt/mooncake without --dataset-path; a file that
// cannot be read (NOT_FOUND naming the path); a malformed ShareGPT file
// (naming the entry index); a malformed Mooncake line ("<path>:<line>:
// ..." naming the field: not JSON, a missing or negative input_length /
// output_length, hash_ids not a list of integers, timestamps going
// backwards); a request longer than context_length (naming it). The
// tokenizer's error is passed through.
[[nodiscard]] absl::StatusOr<std::vector<BenchRequest>> LoadDataset(const DatasetOptions& options,
                                                                    const Tokenizer& tokenizer);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_DATASETS_H_
