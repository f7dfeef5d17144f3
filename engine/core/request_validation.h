// Checks on a generation request shared by the router and the engine core
// of both workers, so a bad field gets the same INVALID_ARGUMENT message
// wherever it is caught. Threads: pure function.
#ifndef TANDEM_ENGINE_CORE_REQUEST_VALIDATION_H_
#define TANDEM_ENGINE_CORE_REQUEST_VALIDATION_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "engine/core/request.h"
#include "engine/sampling/sampler.h"

namespace tandem::core {

// INVALID_ARGUMENT naming the field and the limit when: the prompt is empty
// ("prompt_token_ids");
// max_tokens < 1; prompt + max_tokens > context_length (all three numbers
// named); a token id is outside [0, vocab_size); sampling options are out of
// range (sampling::Validate).
[[nodiscard]] absl::Status ValidateGeneration(std::span<const int32_t> prompt, int64_t max_tokens,
                                              int32_t context_length, int32_t vocab_size,
                                              const sampling::SamplingOptions& sampling);

// Most stop_token_ids per request.
inline constexpr size_t kMaxStopTokenIds = 256;

// INVALID_ARGUMENT naming the field and the limit when: n is outside
// [1, kMaxSamples] ("n"); min_tokens is negative or above max_tokens
// ("min_tokens"); stop_token_ids holds more than kMaxStopTokenIds ids or an
// id outside [0, vocab_size) ("stop_token_ids[i]").
[[nodiscard]] absl::Status ValidateControls(int64_t n, int64_t min_tokens, int64_t max_tokens,
                                            std::span<const int32_t> stop_token_ids,
                                            int32_t vocab_size);

// INVALID_ARGUMENT naming the field when a migrated request's already
// generated tokens (EngineRequest::generated, k of them) cannot continue:
// k >= max_tokens ("generated_token_ids": nothing left to generate), n > 1
// (an n > 1 request migrates with migrated_samples), an id outside [0, vocab_size)
// ("generated_token_ids[i]"). Empty `generated` is always fine.
[[nodiscard]] absl::Status ValidateGenerated(std::span<const int32_t> generated, int64_t n,
                                             int64_t max_tokens, int32_t vocab_size);

// INVALID_ARGUMENT naming the field when an n > 1 migration
// (EngineRequest::migrated_samples) cannot continue: not exactly n entries
// ("migrated_samples"), every sample finished, an unfinished sample with
// k >= max_tokens or an id outside [0, vocab_size)
// ("migrated_samples[s].generated_token_ids[i]"), or both it and a
// non-empty `generated` ("generated_token_ids"). Empty `samples` is fine.
[[nodiscard]] absl::Status ValidateMigratedSamples(
    std::span<const EngineRequest::MigratedSample> samples, std::span<const int32_t> generated,
    int64_t n, int64_t max_tokens, int32_t vocab_size);

}  // namespace tandem::core

#endif  // TANDEM_ENGINE_CORE_REQUEST_VALIDATION_H_
