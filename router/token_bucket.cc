#include "router/token_bucket.h"

#include <algorithm>
#include <cstdlib>

namespace tandem::router {

TokenBucket::TokenBucket(int64_t tokens_per_minute, absl::Time now)
    : tokens_per_minute_(tokens_per_minute),
      capacity_units_(tokens_per_minute * kUnitsPerToken),
      level_units_(capacity_units_),
      last_(now) {
  if (tokens_per_minute < 1 || tokens_per_minute > kMaxTokensPerMinute) std::abort();
}

void TokenBucket::Refill(absl::Time now) {
  if (now <= last_) return;
  const int64_t elapsed_us = absl::ToInt64Microseconds(now - last_);
  if (elapsed_us <= 0) return;  // under a microsecond: keep last_, nothing lost
  last_ += absl::Microseconds(elapsed_us);
  const int64_t missing = capacity_units_ - level_units_;
  if (missing <= 0) return;
  // elapsed_us * rate could overflow after a long idle time; compare first.
  if (elapsed_us >= (missing + tokens_per_minute_ - 1) / tokens_per_minute_) {
    level_units_ = capacity_units_;
  } else {
    level_units_ += elapsed_us * tokens_per_minute_;
  }
}

int64_t TokenBucket::Available(absl::Time now) {
  Refill(now);
  return level_units_ / kUnitsPerToken;  // level_units_ >= 0: rounds down
}

int64_t TokenBucket::MsUntil(int64_t tokens, absl::Time now) {
  Refill(now);
  const int64_t need = tokens * kUnitsPerToken - level_units_;
  if (need <= 0) return 0;
  const int64_t per_ms = tokens_per_minute_ * 1000;
  return (need + per_ms - 1) / per_ms;
}

bool TokenBucket::TryTake(int64_t tokens, absl::Time now) {
  Refill(now);
  if (tokens * kUnitsPerToken > level_units_) return false;
  level_units_ -= tokens * kUnitsPerToken;
  return true;
}

void TokenBucket::Give(int64_t tokens, absl::Time now) {
  Refill(now);
  level_units_ = std::min(capacity_units_, level_units_ + tokens * kUnitsPerToken);
}

}  // namespace tandem::router
