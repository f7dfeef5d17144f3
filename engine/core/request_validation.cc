#include "engine/core/request_validation.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::core {

absl::Status ValidateGeneration(std::span<const int32_t> prompt, int64_t max_tokens,
                                int32_t context_length, int32_t vocab_size,
                                const sampling::SamplingOptions& sampling) {
  if (prompt.empty()) {
    // The router refuses an empty prompt text first; an empty token list
    // reaches here only through a worker's API.
    return absl::InvalidArgumentError("prompt_token_ids: must not be empty");
  }
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens: must be >= 1, got ", max_tokens));
  }
  const int64_t total = static_cast<int64_t>(prompt.size()) + max_tokens;
  if (total > context_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", prompt.size(), " tokens) + max_tokens (", max_tokens, ") = ", total,
        " exceeds the model's context length (", context_length, " tokens)"));
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt_token_ids[", i, "]: token id ",
                                                     prompt[i], " is outside the vocabulary [0, ",
                                                     vocab_size, ")"));
    }
  }
  return sampling::Validate(sampling, vocab_size);
}

absl::Status ValidateControls(int64_t n, int64_t min_tokens, int64_t max_tokens,
                              std::span<const int32_t> stop_token_ids, int32_t vocab_size) {
  if (n < 1 || n > kMaxSamples) {
    return absl::InvalidArgumentError(
        absl::StrCat("n: must be in [1, ", kMaxSamples, "], got ", n));
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_tokens: must be in [0, max_tokens = ", max_tokens, "], got ", min_tokens));
  }
  if (stop_token_ids.size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat("stop_token_ids: at most ", kMaxStopTokenIds,
                                                   " ids, got ", stop_token_ids.size()));
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    if (stop_token_ids[i] < 0 || stop_token_ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids[", i, "]: token id ", stop_token_ids[i],
                       " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateGenerated(std::span<const int32_t> generated, int64_t n, int64_t max_tokens,
                               int32_t vocab_size) {
  if (generated.empty()) return absl::OkStatus();
  const int64_t k = static_cast<int64_t>(generated.size());
  if (k >= max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("generated_token_ids: ", k,
                                                   " tokens leave nothing to generate under "
                                                   "max_tokens ",
                                                   max_tokens));
  }
  if (n != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("generated_token_ids: for n = 1 only (an n > 1 request migrates with "
                     "migrated_samples), got n = ",
                     n));
  }
  for (size_t i = 0; i < generated.size(); ++i) {
    if (generated[i] < 0 || generated[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("generated_token_ids[", i, "]: ", generated[i],
                                                     " is outside the vocabulary [0, ", vocab_size,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateMigratedSamples(std::span<const EngineRequest::MigratedSample> samples,
                                     std::span<const int32_t> generated, int64_t n,
                                     int64_t max_tokens, int32_t vocab_size) {
  if (samples.empty()) return absl::OkStatus();
  if (!generated.empty()) {
    return absl::InvalidArgumentError(
        "generated_token_ids: must be empty when migrated_samples is set (one list per sample)");
  }
  if (static_cast<int64_t>(samples.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("migrated_samples: ", samples.size(),
                                                   " entries for n = ", n,
                                                   " (one per sample, in sample order)"));
  }
  bool any_unfinished = false;
  for (size_t s = 0; s < samples.size(); ++s) {
    if (samples[s].finished) continue;
    any_unfinished = true;
    const std::vector<int32_t>& ids = samples[s].generated;
    if (static_cast<int64_t>(ids.size()) >= max_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("migrated_samples[", s, "].generated_token_ids: ", ids.size(),
                       " tokens leave nothing to generate under max_tokens ", max_tokens,
                       " (a sample at its limit is finished)"));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("migrated_samples[", s, "].generated_token_ids[", i, "]: ", ids[i],
                         " is outside the vocabulary [0, ", vocab_size, ")"));
      }
    }
  }
  if (!any_unfinished) {
    return absl::InvalidArgumentError("migrated_samples: every sample is finished");
  }
  return absl::OkStatus();
}

}  // namespace tandem::core
