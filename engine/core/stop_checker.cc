#include "engine/core/stop_checker.h"

#include <algorithm>

namespace tandem::core {

FinishReason CheckStop(const StopCriteria& criteria, const RequestStops& stops, int32_t token,
                       int64_t num_generated, int32_t sequence_tokens) {
  if (num_generated >= stops.min_tokens) {
    const auto listed = [token](std::span<const int32_t> ids) {
      return std::binary_search(ids.begin(), ids.end(), token);
    };
    if (!stops.ignore_eos && listed(criteria.eog_token_ids)) return FinishReason::kStop;
    if (listed(stops.stop_token_ids)) return FinishReason::kStop;
  }
  if (num_generated >= stops.max_tokens) return FinishReason::kLength;
  if (sequence_tokens >= criteria.context_length) return FinishReason::kContext;
  return FinishReason::kNone;
}

std::vector<int32_t> MinTokensMaskedIds(const StopCriteria& criteria,
                                        std::span<const int32_t> stop_token_ids, bool ignore_eos) {
  std::vector<int32_t> ids(stop_token_ids.begin(), stop_token_ids.end());
  if (!ignore_eos) {
    ids.insert(ids.end(), criteria.eog_token_ids.begin(), criteria.eog_token_ids.end());
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace tandem::core
