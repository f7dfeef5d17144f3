// A token bucket of one API key's tokens_per_minute (router/api_keys.h):
// capacity = tokens_per_minute tokens, refilled continuously at
// tokens_per_minute / 60000 tokens per millisecond, starting full.
//
// The level is kept in exact integers: one token is 60,000,000 units (the
// microseconds of a minute), so a refill of `elapsed` microseconds adds
// tokens_per_minute * elapsed units with no rounding, and the time until
// the level reaches a target is computed exactly (rounded up to whole ms).
// The level stays in [0, capacity]: tokens leave only by TryTake, which
// takes all it is asked for or nothing (ApiKeys reserves a request's whole
// possible use at admission and gives back what it did not use).
//
// Owns: the level and the time of the last refill. Does not touch: clocks
// (the caller passes `now`; time going backwards refills nothing).
// Threads: none; not thread-safe (ApiKeys locks around it).
#ifndef TANDEM_ROUTER_TOKEN_BUCKET_H_
#define TANDEM_ROUTER_TOKEN_BUCKET_H_

#include <cstdint>

#include "absl/time/time.h"

namespace tandem::router {

class TokenBucket {
 public:
  // Upper bound of tokens_per_minute (so every level fits in int64).
  static constexpr int64_t kMaxTokensPerMinute = 1'000'000'000;
  static constexpr int64_t kUnitsPerToken = 60'000'000;  // microseconds per minute

  // A full bucket at `now`. `tokens_per_minute` in [1, kMaxTokensPerMinute]
  // (a programmer error otherwise: the file parser refuses other values).
  TokenBucket(int64_t tokens_per_minute, absl::Time now);

  int64_t capacity() const { return tokens_per_minute_; }  // tokens

  // The level at `now` in whole tokens, rounded down: in [0, capacity()].
  int64_t Available(absl::Time now);
  // Milliseconds from `now` until the level is >= `tokens` (0 when it
  // already is), rounded up. `tokens` in [0, capacity()].
  int64_t MsUntil(int64_t tokens, absl::Time now);
  // Removes `tokens` (>= 0) when the level holds them and returns true;
  // otherwise removes nothing and returns false (the level never goes
  // below 0).
  bool TryTake(int64_t tokens, absl::Time now);
  // Adds `tokens` (>= 0) back, the level capped at capacity().
  void Give(int64_t tokens, absl::Time now);

 private:
  // Adds what flowed in since last_ (capped at capacity).
  void Refill(absl::Time now);

  const int64_t tokens_per_minute_;  // = units added per microsecond
  const int64_t capacity_units_;
  int64_t level_units_;
  absl::Time last_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_TOKEN_BUCKET_H_
