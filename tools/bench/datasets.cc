// LoadDataset (datasets.h): option checks, the random and prefix-repetition
// datasets; the file datasets are in datasets_files.cc.
#include "tools/bench/datasets.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tools/bench/dataset_sampling.h"
#include "tools/bench/datasets_internal.h"

namespace tandem::bench {
namespace {

[[nodiscard]] absl::Status AtLeast(const char* flag, int64_t value, int64_t min) {
  if (value >= min) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, ": must be >= ", min, ", got ", value));
}

// vLLM's length range (benchmarks/datasets.py, RandomDataset.
// get_sampling_params): [floor(len * (1 - ratio)), ceil(len * (1 + ratio))],
// both ends included, computed in IEEE double exactly as Python's
// math.floor / math.ceil of the same products (so len 1000, ratio 0.9 gives
// [99, 1900]: 1000 * 0.1 is 99.99999999999997 in double). The low end is
// raised to 1 (vLLM does so for outputs; a zero-length input is not sent).
struct LengthRange {
  int64_t lo;
  int64_t hi;
};
LengthRange RangeOf(int32_t len, double ratio) {
  const auto lo = static_cast<int64_t>(std::floor(static_cast<double>(len) * (1 - ratio)));
  const auto hi = static_cast<int64_t>(std::ceil(static_cast<double>(len) * (1 + ratio)));
  return {std::max<int64_t>(lo, 1), hi};
}

[[nodiscard]] absl::StatusOr<std::vector<BenchRequest>> LoadRandom(const DatasetOptions& o,
                                                                   const TokenSampler& sampler) {
  if (auto s = AtLeast("--random-input-len", o.random_input_len, 1); !s.ok()) return s;
  if (auto s = AtLeast("--random-output-len", o.random_output_len, 1); !s.ok()) return s;
  if (auto s = AtLeast("--random-prefix-len", o.random_prefix_len, 0); !s.ok()) return s;
  if (!(o.random_range_ratio >= 0 && o.random_range_ratio < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--random-range-ratio: must be in [0, 1), got ", o.random_range_ratio));
  }
  const LengthRange in = RangeOf(o.random_input_len, o.random_range_ratio);
  const LengthRange out = RangeOf(o.random_output_len, o.random_range_ratio);
  if (o.random_prefix_len + in.hi > kMaxRequestTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--random-input-len / --random-prefix-len: prompts of up to ", o.random_prefix_len + in.hi,
        " tokens are over the limit of ", kMaxRequestTokens));
  }
  if (out.hi > kMaxRequestTokens) {
    return absl::InvalidArgumentError(absl::StrCat("--random-output-len: outputs of up to ", out.hi,
                                                   " tokens are over the limit of ",
                                                   kMaxRequestTokens));
  }
  const size_t n = static_cast<size_t>(o.num_prompts);
  std::mt19937_64 rng = SeededRng(o.seed, RngStream::kRandom);
  // Draw order (fixed, so a seed always gives the same set): the shared
  // prefix, every input length, every output length, then each request's ids.
  std::vector<int32_t> prefix;
  sampler.Append(rng, o.random_prefix_len, prefix);
  std::vector<int64_t> input_lens(n), output_lens(n);
  for (auto& len : input_lens) len = UniformInRange(rng, in.lo, in.hi);
  for (auto& len : output_lens) len = UniformInRange(rng, out.lo, out.hi);

  const std::string hint = "--random-input-len, --random-prefix-len or --random-output-len";
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t prompt_len = o.random_prefix_len + input_lens[i];
    if (auto s = CheckContextLength(absl::StrCat("request ", i), prompt_len, output_lens[i],
                                    o.context_length, hint);
        !s.ok()) {
      return s;
    }
    total += prompt_len;
  }
  if (auto s = CheckDatasetSize(total, absl::StrCat("--num-prompts or ", hint)); !s.ok()) return s;

  std::vector<BenchRequest> requests(n);
  for (size_t i = 0; i < n; ++i) {
    BenchRequest& r = requests[i];
    r.prompt_token_ids.reserve(static_cast<size_t>(o.random_prefix_len + input_lens[i]));
    r.prompt_token_ids = prefix;
    sampler.Append(rng, input_lens[i], r.prompt_token_ids);
    r.prompt_len = static_cast<int32_t>(r.prompt_token_ids.size());
    r.output_len = static_cast<int32_t>(output_lens[i]);
  }
  return requests;
}

// vLLM's PrefixRepetitionRandomDataset, except that it makes exactly
// num_prompts requests (vLLM: num_prefixes * (num_prompts / num_prefixes)):
// request i uses prefix i mod num_prefixes, then all are shuffled.
[[nodiscard]] absl::StatusOr<std::vector<BenchRequest>> LoadPrefixRepetition(
    const DatasetOptions& o, const TokenSampler& sampler) {
  if (auto s = AtLeast("--prefix-repetition-prefix-len", o.prefix_repetition_prefix_len, 1);
      !s.ok()) {
    return s;
  }
  if (auto s = AtLeast("--prefix-repetition-suffix-len", o.prefix_repetition_suffix_len, 0);
      !s.ok()) {
    return s;
  }
  if (auto s = AtLeast("--prefix-repetition-num-prefixes", o.prefix_repetition_num_prefixes, 1);
      !s.ok()) {
    return s;
  }
  if (auto s = AtLeast("--prefix-repetition-output-len", o.prefix_repetition_output_len, 1);
      !s.ok()) {
    return s;
  }
  if (o.num_prompts < o.prefix_repetition_num_prefixes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-prompts: ", o.num_prompts, " is fewer than --prefix-repetition-num-prefixes ",
        o.prefix_repetition_num_prefixes, " (each prefix needs at least one request)"));
  }
  const int64_t prompt_len =
      int64_t{o.prefix_repetition_prefix_len} + o.prefix_repetition_suffix_len;
  const std::string hint =
      "--prefix-repetition-prefix-len, --prefix-repetition-suffix-len or "
      "--prefix-repetition-output-len";
  if (prompt_len > kMaxRequestTokens || o.prefix_repetition_output_len > kMaxRequestTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix-repetition: prompts of ", prompt_len, " and outputs of ",
                     o.prefix_repetition_output_len, " tokens: each must be at most ",
                     kMaxRequestTokens, "; lower ", hint));
  }
  // Every request has the same lengths: request 0 stands for all.
  if (auto s = CheckContextLength("request 0", prompt_len, o.prefix_repetition_output_len,
                                  o.context_length, hint);
      !s.ok()) {
    return s;
  }
  if (auto s =
          CheckDatasetSize(prompt_len * o.num_prompts, absl::StrCat("--num-prompts or ", hint));
      !s.ok()) {
    return s;
  }
  std::mt19937_64 rng = SeededRng(o.seed, RngStream::kPrefixRepetition);
  std::vector<std::vector<int32_t>> prefixes(static_cast<size_t>(o.prefix_repetition_num_prefixes));
  for (auto& prefix : prefixes) sampler.Append(rng, o.prefix_repetition_prefix_len, prefix);
  std::vector<BenchRequest> requests(static_cast<size_t>(o.num_prompts));
  for (size_t i = 0; i < requests.size(); ++i) {
    BenchRequest& r = requests[i];
    r.prompt_token_ids.reserve(static_cast<size_t>(prompt_len));
    r.prompt_token_ids = prefixes[i % prefixes.size()];
    sampler.Append(rng, o.prefix_repetition_suffix_len, r.prompt_token_ids);
    r.prompt_len = static_cast<int32_t>(prompt_len);
    r.output_len = o.prefix_repetition_output_len;
  }
  Shuffle(requests, rng);
  return requests;
}

}  // namespace

[[nodiscard]] absl::Status CheckContextLength(const std::string& what, int64_t prompt_len,
                                              int64_t output_len, int32_t context_length,
                                              const std::string& hint) {
  if (context_length <= 0 || prompt_len + output_len <= context_length) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": prompt_len ", prompt_len, " + output_len ", output_len, " = ",
                   prompt_len + output_len, " tokens exceeds the model's context length ",
                   context_length, "; lower ", hint));
}

[[nodiscard]] absl::Status CheckDatasetSize(int64_t total_prompt_tokens, const std::string& hint) {
  if (total_prompt_tokens <= kMaxDatasetTokens) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("the dataset would hold ", total_prompt_tokens,
                                                 " prompt tokens, over the limit of ",
                                                 kMaxDatasetTokens, "; lower ", hint));
}

absl::StatusOr<std::vector<BenchRequest>> LoadDataset(const DatasetOptions& options,
                                                      const Tokenizer& tokenizer) {
  const std::string& name = options.name;
  const bool known = std::find(std::begin(kDatasetNames), std::end(kDatasetNames), name) !=
                     std::end(kDatasetNames);
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dataset: unknown '", name,
                     "' (expected random, prefix-repetition, sharegpt or mooncake)"));
  }
  if (auto s = AtLeast("--num-prompts", options.num_prompts, 1); !s.ok()) return s;
  if (name == "sharegpt" || name == "mooncake") {
    if (options.path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dataset-path: required with --dataset ", name));
    }
  }
  if (name == "sharegpt") {
    if (!tokenizer) {
      return absl::FailedPreconditionError("sharegpt: no tokenizer to count prompt tokens with");
    }
    return LoadShareGpt(options, tokenizer);
  }
  // The other datasets draw token ids.
  absl::StatusOr<TokenSampler> sampler =
      TokenSampler::Make(options.vocab_size, options.special_token_ids);
  if (!sampler.ok()) return sampler.status();
  if (name == "random") return LoadRandom(options, *sampler);
  if (name == "prefix-repetition") return LoadPrefixRepetition(options, *sampler);
  return LoadMooncake(options, *sampler);
}

}  // namespace tandem::bench
