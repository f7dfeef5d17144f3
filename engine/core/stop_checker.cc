#include "engine/core/stop_checker.h"

#include <algorithm>

namespace tandem::core {

FinishReason CheckStop(const StopCriteria& criteria, int32_t token, int32_t num_generated,
                       int64_t max_tokens, int32_t sequence_tokens) {
  if (std::binary_search(criteria.eog_token_ids.begin(), criteria.eog_token_ids.end(), token)) {
    return FinishReason::kStop;
  }
  if (num_generated >= max_tokens) return FinishReason::kLength;
  if (sequence_tokens >= criteria.context_length) return FinishReason::kContext;
  return FinishReason::kNone;
}

}  // namespace tandem::core
