// Per-request sampling options and their range checks (DESIGN.md, Engine:
// Sampling). Split out of sampler.h so that the logits processors and the
// sampling view can name the options without the sampler.
#ifndef TANDEM_ENGINE_SAMPLING_SAMPLING_OPTIONS_H_
#define TANDEM_ENGINE_SAMPLING_SAMPLING_OPTIONS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tandem::sampling {

// Upper limit of SamplingOptions::top_logprobs (OpenAI's API allows 20).
inline constexpr int32_t kMaxTopLogprobs = 20;
// Limit of |presence_penalty| and |frequency_penalty| (OpenAI's range).
inline constexpr float kMaxAbsPenalty = 2.0f;
// Limit of |logit_bias| values (OpenAI's range; -100 bans a token).
inline constexpr float kMaxAbsLogitBias = 100.0f;
// Smallest temperature above 0 (vLLM's _SAMPLING_EPS). Together with the
// repetition penalty's range it keeps every processed logit of a model
// finite: l / 1e-5 / 0.01 stays far below FLT_MAX for |l| < 1e30, whereas
// a logit overflowing to +inf would make every such id an equal winner.
inline constexpr float kMinTemperature = 1e-5f;
// repetition_penalty's range.
inline constexpr float kMinRepetitionPenalty = 0.01f;
inline constexpr float kMaxRepetitionPenalty = 100.0f;

// One sequence's sampling parameters (the public SamplingParams of
// proto/tandem/v1/common.proto plus the engine's min_tokens mask). The
// processors (logits_processor.h) run in vLLM v1's order: min_tokens mask,
// logit_bias, repetition, frequency, presence penalty, temperature; the
// draw (sampler.h) then applies min_p, top_k, top_p.
struct SamplingOptions {
  float temperature = 0.0f;  // 0 = greedy argmax, ties -> lowest id; else
                             // >= kMinTemperature, finite
  int32_t top_k = 0;         // <= 0 = off
  float top_p = 1.0f;        // in (0, 1]
  // Keep the candidates whose probability after the processors is >=
  // min_p x the most likely one's (vLLM's min_p); in [0, 1], 0 = off.
  // Ignored by greedy.
  float min_p = 0.0f;
  uint64_t seed = 0;         // randomness for output index i = f(seed, i);
                             // SampleSeed(request seed, s) for sample s
  int64_t top_logprobs = 0;  // raw top-n alternatives reported per token;
                             // 0 (none) .. kMaxTopLogprobs
  // Hugging Face / vLLM repetition penalty over the ids of the prompt and
  // the generated tokens; in [0.01, 100], 1 = off.
  float repetition_penalty = 1.0f;
  // OpenAI presence / frequency penalties over the generated tokens; each
  // in [-2, 2], 0 = off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // (token id, bias) added to the logit before the penalties (OpenAI /
  // vLLM logit_bias). Sorted by id, ids unique and in [0, vocab), biases
  // in [-100, 100].
  std::vector<std::pair<int32_t, float>> logit_bias;
  // While fewer than min_tokens tokens have been generated, the logits of
  // min_tokens_masked_ids become -inf (vLLM's min_tokens). The engine core
  // fills the ids (sorted, unique, in [0, vocab)) with the request's
  // stop_token_ids plus the model's end-of-generation ids unless
  // ignore_eos, as vLLM's all_stop_token_ids, and validates both fields;
  // Validate() does not look at them.
  int32_t min_tokens = 0;
  std::vector<int32_t> min_tokens_masked_ids;
};

// OK, or INVALID_ARGUMENT naming the public field and its limit, checked in
// this order:
//   "temperature: must be 0 (greedy) or in [1e-05, inf), got X"
//   "top_p: must be in (0, 1], got X"
//   "min_p: must be in [0, 1], got X"
//   "repetition_penalty: must be in [0.01, 100], got X"
//   "presence_penalty: must be in [-2, 2], got X"
//   "frequency_penalty: must be in [-2, 2], got X"
//   "logprobs: must be in [0, 20], got N" (top_logprobs is the public
//     GenerateRequest.logprobs)
//   "logit_bias[ID]: token id ID is outside the vocabulary [0, V)"
//   "logit_bias[ID]: bias must be in [-100, 100], got X"
//   "logit_bias: token ids must be sorted and unique, got ID after PREV"
//     (the converter from the proto map builds them so; a caller bug)
// NaN fails every range. `vocab_size` is the model's (V > 0).
// min_tokens and min_tokens_masked_ids are the engine core's to check.
[[nodiscard]] absl::Status Validate(const SamplingOptions& options, int32_t vocab_size);

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_SAMPLING_OPTIONS_H_
