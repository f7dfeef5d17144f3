// Client API keys and their quotas (router.api_keys_file): who may call
// tandem.v1.Generation, and how much each key may use.
//
// The keys file (YAML; unknown keys anywhere are refused, as in the cluster
// config; deploy/api-keys.example.yaml):
//   keys:
//     - name: alice                  # [A-Za-z0-9._-]+, unique
//       sha256: <64 hex digits>      # SHA-256 of the key: printf %s KEY | sha256sum
//       tokens_per_minute: 6000      # optional; absent or 0 = unlimited
//       max_concurrent_requests: 4   # optional; absent or 0 = unlimited
// The key itself is never stored, logged or reported: only its hash is.
//
// Per key:
// - A token bucket (router/token_bucket.h) of tokens_per_minute. A
//   Generate request reserves at admission everything it may use: its
//   prompt's tokens plus max_tokens for each of its n samples
//   (ApiKeys::Reservation; the HTTP front door sets max_tokens to the rest
//   of the context for a chat request without one, and that is what it
//   reserves). It is admitted only when the bucket holds the whole
//   reservation; when it ends, the generated tokens it did not use go
//   back. So the bucket never goes below 0, and requests running at once
//   can never use more than tokens_per_minute between them. A reservation
//   larger than tokens_per_minute can never be admitted: refused at once,
//   without a retry time (HTTP 400, not 429), naming what to lower.
// - A limit on requests in flight (admitted and not yet ended, including
//   those waiting in the router's admission queue).
// The limits are per router replica: each replica keeps its own buckets.
//
// The table can be replaced while the router serves (Replace; the file is
// re-read by router/api_keys_reloader.h). A key is its `name`: a name in
// both tables keeps its bucket level, in-flight count, counters and
// completion times, and takes the new hash and limits (a new key for the
// same name is a rotation of that client's key, not a fresh quota). A
// name no longer listed stops authenticating; the requests it already
// authenticated run to their end against its state.
//
// Owns: the keys, their buckets, in-flight counts, counters and recent
// completion times. Does not touch: gRPC (the router reads the metadata and
// converts the statuses), the router's own admission (router/admission.h),
// files. Threads: every method is thread-safe (table_mu_, a reader lock
// for every call but Replace, is taken before a key's mutex, never while
// holding one).
#ifndef TANDEM_ROUTER_API_KEYS_H_
#define TANDEM_ROUTER_API_KEYS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/token_bucket.h"

namespace tandem::router {

// Lowercase hex SHA-256 of `data` (auth/crypto.h, OpenSSL), as
// `printf %s DATA | sha256sum` prints it.
std::string Sha256Hex(absl::string_view data);

// One entry of the keys file.
struct ApiKeyEntry {
  std::string name;
  std::string sha256_hex;               // 64 lowercase hex digits
  int64_t tokens_per_minute = 0;        // 0 = unlimited; <= TokenBucket::kMaxTokensPerMinute
  int32_t max_concurrent_requests = 0;  // 0 = unlimited
  // May read every key's usage (GetStatus, `tandem status`); any other key
  // sees only its own, so one tenant learns nothing of another.
  bool admin = false;
};

// Parses the keys file's YAML text. Errors (INVALID_ARGUMENT naming the
// entry and field, e.g. "keys[1] (bob).tokens_per_minute: expected an
// integer in [0, 1000000000], got 'ten'"): a YAML syntax error, an unknown
// key, a missing or empty `keys` list, a missing or malformed name or
// sha256, a negative or non-integer limit, a duplicate name or hash.
[[nodiscard]] absl::StatusOr<std::vector<ApiKeyEntry>> ParseApiKeys(const std::string& yaml_text);
// Reads and parses `path`: NOT_FOUND if it cannot be read; parse errors
// prefixed with the path. `text`, when not null, receives the bytes read
// (what router/api_keys_reloader.h compares later reads with).
[[nodiscard]] absl::StatusOr<std::vector<ApiKeyEntry>> LoadApiKeys(const std::string& path,
                                                                   std::string* text = nullptr);
// The bytes of `path` (symlinks followed). NOT_FOUND "cannot read API keys
// file 'PATH': <errno text>"; INVALID_ARGUMENT for a directory.
[[nodiscard]] absl::StatusOr<std::string> ReadApiKeysFile(const std::string& path);

class ApiKeys {
 public:
  // Where time comes from (tests inject a fake one). MonotonicClock():
  // std::chrono::steady_clock as an absl::Time.
  using Clock = std::function<absl::Time()>;
  static Clock MonotonicClock();

  // What one Generate request may use, reserved from its key's bucket at
  // admission: the prompt once, and max_tokens per sample (a sample never
  // generates more).
  struct Reservation {
    int64_t prompt_tokens = 0;  // the tokenized prompt (BOS included)
    int64_t max_tokens = 0;     // per sample, as the request gave it (>= 1)
    int64_t n = 1;              // samples, 1..16
    int64_t generation() const { return max_tokens * n; }
    int64_t tokens() const { return prompt_tokens + generation(); }
  };

  // What Admit decided.
  struct Decision {
    // OK (reserved: the caller must later call either Refund, or Started
    // and then Ended) or RESOURCE_EXHAUSTED naming the key, the numbers and
    // the limit's field.
    absl::Status status;
    // With RESOURCE_EXHAUSTED: when to retry, ms; -1 when retrying cannot
    // help (the reservation exceeds tokens_per_minute).
    int64_t retry_after_ms = -1;
  };

  // One key's counters and limits (GetStatus).
  struct Usage {
    std::string name;
    uint64_t requests = 0;          // admitted requests that started running
    uint64_t refused = 0;           // refused by this key's limits
    uint64_t prompt_tokens = 0;     // charged for requests that started
    uint64_t generated_tokens = 0;  // reached the client (requests that started)
    int32_t in_flight = 0;          // admitted, not yet ended (queued included)
    // The bucket's level now, >= 0: tokens_per_minute less what the
    // requests in flight reserved and what ended ones used, plus the refill
    // (0 when unlimited).
    int64_t tokens_available = 0;
    int64_t tokens_per_minute = 0;        // 0 = unlimited
    int32_t max_concurrent_requests = 0;  // 0 = unlimited
  };

  // `entries` as ParseApiKeys returns them (valid, unique).
  explicit ApiKeys(const std::vector<ApiKeyEntry>& entries, Clock clock = MonotonicClock());
  ApiKeys(const ApiKeys&) = delete;
  ApiKeys& operator=(const ApiKeys&) = delete;

  // Makes `entries` (as ParseApiKeys returns them) the keys that
  // authenticate from now on, in their order. Per name (see the top):
  // kept names keep their state and take the entry's hash and limits (a
  // changed tokens_per_minute keeps the bucket's level in whole tokens,
  // capped at the new capacity; 0 drops the bucket; a new limit starts
  // full); new names start fresh; a name that comes back after a
  // Replace without it finds its old state. Ids handed out before stay
  // valid for the calls below.
  void Replace(const std::vector<ApiKeyEntry>& entries);

  // The key named by an `authorization` metadata value ("Bearer <key>",
  // the scheme case-insensitive); `value` null when the metadata is absent.
  // Returns the key's id for the calls below (valid for the life of this
  // object, whatever Replace does later). Errors: UNAUTHENTICATED
  // "missing API key (authorization: Bearer ...)" (absent, or no key after
  // "Bearer"), "invalid API key" (not Bearer, or no key has its hash).
  [[nodiscard]] absl::StatusOr<int> Authenticate(const std::string* value) const;

  // Admits a Generate request under key `id`, checked in this order:
  //   1. r.tokens() > tokens_per_minute: RESOURCE_EXHAUSTED, never
  //      admissible (retry_after_ms -1): "API key 'alice': this request
  //      may use 1210 tokens (prompt 10 + max_tokens 300 x n 4), more than
  //      its tokens_per_minute of 1000; lower max_tokens or n, or shorten
  //      the prompt" (" x n K" only when n > 1);
  //   2. in flight == max_concurrent_requests: RESOURCE_EXHAUSTED with
  //      retry_after_ms = Admission::RetryAfterMs(0, n, span) over the
  //      key's own recent completions (one of its requests ends every
  //      span / n on average; none recorded: Admission::kMaxRetryAfterMs),
  //      or the bucket's wait below when that is longer;
  //   3. the bucket holds fewer than r.tokens(): RESOURCE_EXHAUSTED with
  //      retry_after_ms = the exact time until it holds them (rounded up):
  //      "API key 'alice': 20 tokens available, this request reserves 110
  //      (prompt 10 + max_tokens 100; tokens_per_minute 120)";
  // else OK: r.tokens() are taken from the bucket and the request counts
  // as in flight. Each refusal counts in `refused`.
  Decision Admit(int id, const Reservation& r);
  // An admitted request that never ran (the router's admission refused or
  // dropped it): its whole reservation goes back (the bucket capped at its
  // capacity) and it leaves the in-flight count. Counters are untouched.
  void Refund(int id, const Reservation& r);
  // An admitted request started running: counts it and its prompt tokens
  // (the prompt's part of the reservation is kept from now on, whatever
  // happens to the request).
  void Started(int id, int64_t prompt_tokens);
  // `tokens` generated tokens reached the client: counted (they were
  // reserved at admission).
  void Generated(int id, int64_t tokens);
  // A started request with reservation `r` ended (any outcome) after
  // `generated` of its tokens reached the client: r.generation() -
  // generated go back to the bucket (none when generated is larger, which
  // no request does), it leaves the in-flight count and is recorded for
  // the concurrency retry-after estimate.
  void Ended(int id, const Reservation& r, int64_t generated);

  std::vector<Usage> Snapshot() const;  // the current keys, in file order
  // What key `id` may see of Snapshot(): every key for an admin key, else
  // its own usage only (empty for an id no longer in the file).
  std::vector<Usage> SnapshotFor(int id) const;
  int size() const;  // the current keys
  // Whether key `id` is a current key with `admin: true` (may change the
  // cluster: Generation.SetWorkerRole).
  bool IsAdmin(int id) const;

 private:
  struct Key {
    Key(const ApiKeyEntry& entry, absl::Time now);
    // Takes `e`'s hash and limits (same name), keeping the state.
    void Update(const ApiKeyEntry& e, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
    mutable absl::Mutex mu;
    ApiKeyEntry entry ABSL_GUARDED_BY(mu);
    std::optional<TokenBucket> bucket ABSL_GUARDED_BY(mu);  // unset: unlimited
    int32_t in_flight ABSL_GUARDED_BY(mu) = 0;
    uint64_t requests ABSL_GUARDED_BY(mu) = 0;
    uint64_t refused ABSL_GUARDED_BY(mu) = 0;
    uint64_t prompt_tokens ABSL_GUARDED_BY(mu) = 0;
    uint64_t generated_tokens ABSL_GUARDED_BY(mu) = 0;
    std::deque<absl::Time> completions ABSL_GUARDED_BY(mu);  // oldest first
  };

  // keys_[id], the table lock held only while looking it up (a Key is
  // never destroyed or moved before this object).
  Key& At(int id) const ABSL_LOCKS_EXCLUDED(table_mu_);

  const Clock clock_;
  mutable absl::Mutex table_mu_;
  // Every key ever listed, by id; only grows (by the names ever seen).
  std::vector<std::unique_ptr<Key>> keys_ ABSL_GUARDED_BY(table_mu_);
  std::map<std::string, int> by_name_ ABSL_GUARDED_BY(table_mu_);  // every key
  std::map<std::string, int> by_hash_ ABSL_GUARDED_BY(table_mu_);  // current keys only
  std::vector<int> current_ ABSL_GUARDED_BY(table_mu_);            // file order
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_API_KEYS_H_
