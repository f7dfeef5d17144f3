// The one place that decides whether a newly sampled token ends a sample
// (DESIGN.md, request flow step 7). Used for every token the engine core
// samples, locally or as token 0 of a remote prefill. Stop strings are
// the router's (router/stop_strings.h): they need the detokenized text.
// Threads: pure function.
#ifndef TANDEM_ENGINE_CORE_STOP_CHECKER_H_
#define TANDEM_ENGINE_CORE_STOP_CHECKER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/request.h"

namespace tandem::core {

// The model's part of the stop conditions.
struct StopCriteria {
  // End-of-generation ids (the tokenizer's eog_ids(): EOS, EOT and the end
  // markers llama.cpp recognises), sorted ascending. BOS is an ordinary
  // token unless listed.
  std::vector<int32_t> eog_token_ids;
  int32_t context_length = 0;  // the model's, in tokens
};

// The request's part (EngineRequest's fields).
struct RequestStops {
  std::span<const int32_t> stop_token_ids;  // sorted ascending
  bool ignore_eos = false;
  int64_t min_tokens = 0;
  int64_t max_tokens = 1;
};

// Why generation of a sample ends with `token`, its output number
// `num_generated` (1-based, `token` included), the sequence then holding
// `sequence_tokens` tokens. Checked in this order, as vLLM's StopChecker:
//   1. num_generated >= min_tokens only: `token` is an end-of-generation
//      id and !ignore_eos (kStop), or one of stop_token_ids (kStop);
//   2. num_generated >= max_tokens (kLength);
//   3. sequence_tokens >= context_length (kContext);
// else kNone.
FinishReason CheckStop(const StopCriteria& criteria, const RequestStops& stops, int32_t token,
                       int64_t num_generated, int32_t sequence_tokens);

// The ids the sampler masks while fewer than min_tokens are generated
// (vLLM's all_stop_token_ids): stop_token_ids plus, unless ignore_eos, the
// end-of-generation ids; sorted, unique.
std::vector<int32_t> MinTokensMaskedIds(const StopCriteria& criteria,
                                        std::span<const int32_t> stop_token_ids, bool ignore_eos);

}  // namespace tandem::core

#endif  // TANDEM_ENGINE_CORE_STOP_CHECKER_H_
