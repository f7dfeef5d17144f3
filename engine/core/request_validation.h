// Checks on a generation request shared by the router and the engine core
// of both workers, so a bad field gets the same INVALID_ARGUMENT message
// wherever it is caught. Threads: pure function.
#ifndef TANDEM_ENGINE_CORE_REQUEST_VALIDATION_H_
#define TANDEM_ENGINE_CORE_REQUEST_VALIDATION_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "engine/sampling/sampler.h"

namespace tandem::core {

// INVALID_ARGUMENT naming the field and the limit when: the prompt is empty
// ("prompt_token_ids");
// max_tokens < 1; prompt + max_tokens > context_length (all three numbers
// named); a token id is outside [0, vocab_size); sampling options are out of
// range (sampling::Validate).
absl::Status ValidateGeneration(std::span<const int32_t> prompt, int64_t max_tokens,
                                int32_t context_length, int32_t vocab_size,
                                const sampling::SamplingOptions& sampling);

}  // namespace tandem::core

#endif  // TANDEM_ENGINE_CORE_REQUEST_VALIDATION_H_
