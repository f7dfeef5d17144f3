// The one place that decides whether a newly sampled token ends a request
// (DESIGN.md, request flow step 7). Used for every token the engine core
// samples, locally or as token 0 of a remote prefill.
// Threads: pure function.
#ifndef TANDEM_ENGINE_CORE_STOP_CHECKER_H_
#define TANDEM_ENGINE_CORE_STOP_CHECKER_H_

#include <cstdint>
#include <vector>

#include "engine/core/request.h"

namespace tandem::core {

struct StopCriteria {
  // End-of-generation ids (the tokenizer's eog_ids(): EOS, EOT and the end
  // markers llama.cpp recognises), sorted ascending. BOS is an ordinary
  // token unless listed.
  std::vector<int32_t> eog_token_ids;
  int32_t context_length = 0;  // the model's, in tokens
};

// Why generation ends with `token`, checked in this order: it is an
// end-of-generation id (kStop); it is output number num_generated >=
// max_tokens (kLength, 1-based
// count including `token`); the sequence, `token` included, holds
// sequence_tokens >= context_length tokens (kContext); else kNone.
FinishReason CheckStop(const StopCriteria& criteria, int32_t token, int32_t num_generated,
                       int64_t max_tokens, int32_t sequence_tokens);

}  // namespace tandem::core

#endif  // TANDEM_ENGINE_CORE_STOP_CHECKER_H_
