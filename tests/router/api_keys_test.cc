// router::TokenBucket and router::ApiKeys alone, on an injected clock: the
// keys file parser, SHA-256, authentication, the bucket's refill and the
// exact retry-after values, the reservation (prompt + max_tokens x n)
// taken at admission and its unused part given back, a reservation over
// capacity, a level that never goes below 0 (issue #32: "-12 tokens
// available"), also under concurrent callers, the concurrency limit,
// refunds and counters; replacing the
// table (state kept by name, removed keys refused, their ids still valid,
// new limits) and the file reloader (a Kubernetes-style symlink swap, bad
// files logged once per content, the thread).
#include "router/api_keys.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/api_keys_reloader.h"
#include "router/token_bucket.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

// printf %s KEY | sha256sum (coreutils), for the keys used below.
constexpr char kEmptySha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr char kAliceKey[] = "sk-test-alice";
constexpr char kAliceSha[] = "4d692786b022a5d5a48381dcaf1e5e346366feb5579a1d699de2991d153b05f9";
constexpr char kBobKey[] = "sk-test-bob";
constexpr char kBobSha[] = "126fa001bf47b8fca67b958c7cdb3745b15c8eab28dd77b91a53305b5f90632f";

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(Sha256HexTest, MatchesSha256sum) {
  EXPECT_EQ(Sha256Hex(""), kEmptySha);
  EXPECT_EQ(Sha256Hex(kAliceKey), kAliceSha);
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(TokenBucketTest, StartsFullAndRefillsContinuously) {
  TokenBucket b(60, kT0);  // 1 token per second
  EXPECT_EQ(b.capacity(), 60);
  EXPECT_EQ(b.Available(kT0), 60);
  EXPECT_TRUE(b.TryTake(50, kT0));
  EXPECT_EQ(b.Available(kT0), 10);
  EXPECT_EQ(b.Available(kT0 + absl::Milliseconds(999)), 10);
  EXPECT_EQ(b.Available(kT0 + absl::Seconds(1)), 11);
  EXPECT_EQ(b.Available(kT0 + absl::Seconds(30)), 40);
  // Never above capacity, however long it idles.
  EXPECT_EQ(b.Available(kT0 + absl::Hours(100000)), 60);
}

TEST(TokenBucketTest, MsUntilIsExactAndRoundsUp) {
  TokenBucket b(7, kT0);  // 7 tokens per 60 s: one per 8571.43 ms
  EXPECT_TRUE(b.TryTake(7, kT0));
  EXPECT_EQ(b.MsUntil(0, kT0), 0);
  EXPECT_EQ(b.MsUntil(1, kT0), 8572);
  EXPECT_EQ(b.MsUntil(7, kT0), 60000);
  EXPECT_EQ(b.Available(kT0 + absl::Milliseconds(8571)), 0);
  EXPECT_EQ(b.Available(kT0 + absl::Milliseconds(8572)), 1);
  // Time going backwards refills nothing and loses nothing.
  EXPECT_EQ(b.Available(kT0), 1);
}

TEST(TokenBucketTest, TryTakeTakesAllOrNothingNeverBelowZero) {
  TokenBucket b(60, kT0);  // 1 token per second
  EXPECT_FALSE(b.TryTake(61, kT0));
  EXPECT_EQ(b.Available(kT0), 60);  // nothing taken
  EXPECT_TRUE(b.TryTake(60, kT0));
  EXPECT_EQ(b.Available(kT0), 0);
  EXPECT_FALSE(b.TryTake(1, kT0));
  EXPECT_EQ(b.Available(kT0), 0);
  EXPECT_EQ(b.Available(kT0 + absl::Milliseconds(500)), 0);  // 0.5 rounds down
  // From 0.5 to 5 at 1 token per second.
  EXPECT_EQ(b.MsUntil(5, kT0 + absl::Milliseconds(500)), 4500);
  EXPECT_FALSE(b.TryTake(5, kT0 + absl::Milliseconds(4999)));
  EXPECT_TRUE(b.TryTake(5, kT0 + absl::Seconds(5)));
  EXPECT_EQ(b.Available(kT0 + absl::Seconds(5)), 0);
  EXPECT_TRUE(b.TryTake(0, kT0 + absl::Seconds(5)));  // nothing: always fine
  b.Give(1000, kT0 + absl::Seconds(6));  // a refund never overfills
  EXPECT_EQ(b.Available(kT0 + absl::Seconds(6)), 60);
}

// A clock the test moves by hand.
struct FakeClock {
  absl::Time now = kT0;
  ApiKeys::Clock clock() {
    return [this] { return now; };
  }
};

std::vector<ApiKeyEntry> TwoKeys(int64_t alice_tpm, int32_t alice_max) {
  return {{"alice", kAliceSha, alice_tpm, alice_max}, {"bob", kBobSha, 0, 0}};
}

TEST(ApiKeysTest, AuthenticatesBearerKeysByHash) {
  FakeClock t;
  ApiKeys keys(TwoKeys(100, 0), t.clock());
  const std::string alice = std::string("Bearer ") + kAliceKey;
  const std::string bob = std::string("bearer   ") + kBobKey + " ";
  EXPECT_EQ(*keys.Authenticate(&alice), 0);
  EXPECT_EQ(*keys.Authenticate(&bob), 1);
  auto expect = [&](const std::string* value, const std::string& message) {
    absl::StatusOr<int> id = keys.Authenticate(value);
    ASSERT_FALSE(id.ok()) << (value ? *value : "null");
    EXPECT_EQ(id.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(id.status().message(), message);
  };
  const std::string missing = "missing API key (authorization: Bearer ...)";
  expect(nullptr, missing);
  const std::string empty = "Bearer ";
  expect(&empty, missing);
  const std::string wrong = "Bearer sk-test-carol";
  expect(&wrong, "invalid API key");
  const std::string basic = std::string("Basic ") + kAliceKey;
  expect(&basic, "invalid API key");
  const std::string glued = std::string("Bearer") + kAliceKey;
  expect(&glued, "invalid API key");
  // The hash itself is not a key.
  const std::string hash = std::string("Bearer ") + kAliceSha;
  expect(&hash, "invalid API key");
}

// A request's reservation: `prompt` tokens, `max_tokens` per sample, n.
ApiKeys::Reservation R(int64_t prompt, int64_t max_tokens, int64_t n = 1) {
  return {prompt, max_tokens, n};
}

TEST(ApiKeysTest, ReservationTakenAtAdmissionRetryAfterExact) {
  FakeClock t;
  ApiKeys keys(TwoKeys(120, 0), t.clock());  // 2 tokens per second
  ApiKeys::Decision d = keys.Admit(0, R(90, 10));
  ASSERT_TRUE(d.status.ok()) << d.status;
  keys.Started(0, 90);
  // 20 left: a request that may use 30 waits for 10 more = 5000 ms.
  d = keys.Admit(0, R(20, 10));
  EXPECT_EQ(d.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(d.status.message(),
            "API key 'alice': 20 tokens available, this request reserves 30 (prompt 20 + "
            "max_tokens 10; tokens_per_minute 120)");
  EXPECT_EQ(d.retry_after_ms, 5000);
  t.now += absl::Milliseconds(4999);
  d = keys.Admit(0, R(20, 10));
  EXPECT_EQ(d.retry_after_ms, 1);
  t.now += absl::Milliseconds(1);
  d = keys.Admit(0, R(20, 10));
  EXPECT_TRUE(d.status.ok()) << d.status;
  keys.Started(0, 20);
  // Bob is unlimited meanwhile.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(keys.Admit(1, R(1000, 100000, 16)).status.ok());
  std::vector<ApiKeys::Usage> u = keys.Snapshot();
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0].name, "alice");
  EXPECT_EQ(u[0].requests, 2u);
  EXPECT_EQ(u[0].refused, 2u);
  EXPECT_EQ(u[0].prompt_tokens, 110u);
  EXPECT_EQ(u[0].in_flight, 2);
  EXPECT_EQ(u[0].tokens_available, 0);
  EXPECT_EQ(u[0].tokens_per_minute, 120);
  EXPECT_EQ(u[1].name, "bob");
  EXPECT_EQ(u[1].in_flight, 5);
  EXPECT_EQ(u[1].tokens_available, 0);  // unlimited: no bucket
  EXPECT_EQ(u[1].requests, 0u);         // admitted, not started
}

TEST(ApiKeysTest, ReservationOverCapacityIsNeverAdmissible) {
  FakeClock t;
  ApiKeys keys(TwoKeys(120, 0), t.clock());
  // 21 + 25 x 4 = 121 > 120, though the prompt alone fits.
  ApiKeys::Decision d = keys.Admit(0, R(21, 25, 4));
  EXPECT_EQ(d.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(d.status.message(),
            "API key 'alice': this request may use 121 tokens (prompt 21 + max_tokens 25 x n 4), "
            "more than its tokens_per_minute of 120; lower max_tokens or n, or shorten the "
            "prompt");
  EXPECT_EQ(d.retry_after_ms, -1);
  d = keys.Admit(0, R(100, 21));
  EXPECT_EQ(d.status.message(),
            "API key 'alice': this request may use 121 tokens (prompt 100 + max_tokens 21), more "
            "than its tokens_per_minute of 120; lower max_tokens or n, or shorten the prompt");
  EXPECT_EQ(keys.Snapshot()[0].tokens_available, 120);  // nothing taken
  EXPECT_TRUE(keys.Admit(0, R(20, 25, 4)).status.ok());  // exactly the capacity: fine
  EXPECT_EQ(keys.Snapshot()[0].refused, 2u);
}

// Issue #32: a request's generation used to be charged after the fact, so
// one request could overshoot the minute by its whole max_tokens and the
// next refusal said "-12 tokens available".
TEST(ApiKeysTest, UnusedGenerationGoesBackTheLevelNeverGoesNegative) {
  FakeClock t;
  ApiKeys keys(TwoKeys(60, 0), t.clock());  // 1 token per second
  const ApiKeys::Reservation big = R(10, 50);
  ASSERT_TRUE(keys.Admit(0, big).status.ok());
  keys.Started(0, 10);
  EXPECT_EQ(keys.Snapshot()[0].tokens_available, 0);  // all 60 reserved
  // A second request cannot start while the first may still use it all.
  ApiKeys::Decision d = keys.Admit(0, R(3, 2));
  EXPECT_EQ(d.status.message(),
            "API key 'alice': 0 tokens available, this request reserves 5 (prompt 3 + max_tokens "
            "2; tokens_per_minute 60)");
  EXPECT_EQ(d.retry_after_ms, 5000);
  keys.Generated(0, 15);
  keys.Generated(0, 5);
  EXPECT_EQ(keys.Snapshot()[0].tokens_available, 0);  // generation was reserved
  t.now += absl::Seconds(2);
  keys.Ended(0, big, 20);  // 30 of the 50 unused: back, plus 2 s of refill
  ApiKeys::Usage u = keys.Snapshot()[0];
  EXPECT_EQ(u.tokens_available, 32);
  EXPECT_EQ(u.generated_tokens, 20u);
  EXPECT_EQ(u.prompt_tokens, 10u);
  EXPECT_EQ(u.in_flight, 0);
  EXPECT_EQ(u.requests, 1u);
  // Several samples: max_tokens x n reserved, all used, nothing back.
  const ApiKeys::Reservation three = R(2, 10, 3);
  ASSERT_TRUE(keys.Admit(0, three).status.ok());
  keys.Started(0, 2);
  keys.Generated(0, 30);
  keys.Ended(0, three, 30);
  EXPECT_EQ(keys.Snapshot()[0].tokens_available, 0);
  // More generated than reserved (no request does): nothing back, and the
  // level stays at 0.
  t.now += absl::Seconds(5);
  ASSERT_TRUE(keys.Admit(0, R(1, 4)).status.ok());
  keys.Started(0, 1);
  keys.Ended(0, R(1, 4), 9);
  EXPECT_EQ(keys.Snapshot()[0].tokens_available, 0);
}

TEST(ApiKeysTest, RefundReturnsTheWholeReservationAndTheSlot) {
  FakeClock t;
  ApiKeys keys(TwoKeys(60, 1), t.clock());
  ASSERT_TRUE(keys.Admit(0, R(20, 15, 2)).status.ok());
  EXPECT_EQ(keys.Snapshot()[0].tokens_available, 10);
  keys.Refund(0, R(20, 15, 2));
  ApiKeys::Usage u = keys.Snapshot()[0];
  EXPECT_EQ(u.tokens_available, 60);
  EXPECT_EQ(u.in_flight, 0);
  EXPECT_EQ(u.requests, 0u);
  EXPECT_EQ(u.prompt_tokens, 0u);
  EXPECT_TRUE(keys.Admit(0, R(30, 30)).status.ok());
}

// Many callers at once on a stopped clock (no refill), more than the
// bucket can hold at once (8 x 13 tokens > 60): the reservations admitted
// at any moment never add up to more than the capacity, no snapshot shows
// a level below 0, and once every request ended or was refunded the bucket
// holds exactly the capacity less what the ended ones used.
TEST(ApiKeysTest, ConcurrentCallersNeverOverdrawTheBucket) {
  FakeClock t;  // never moved: nothing refills
  constexpr int64_t kCapacity = 60;
  ApiKeys keys(TwoKeys(kCapacity, 0), t.clock());
  const ApiKeys::Reservation r = R(1, 6, 2);  // 13 tokens
  std::atomic<int64_t> reserved{0}, peak{0}, used{0}, lowest{kCapacity};
  // a = min(a, v) and a = max(a, v), atomically.
  auto keep_min = [](std::atomic<int64_t>& a, int64_t v) {
    for (int64_t old = a.load(); v < old && !a.compare_exchange_weak(old, v);) {
    }
  };
  auto keep_max = [](std::atomic<int64_t>& a, int64_t v) {
    for (int64_t old = a.load(); v > old && !a.compare_exchange_weak(old, v);) {
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < 300; ++j) {
        if (!keys.Admit(0, r).status.ok()) continue;
        // Counted only between a granted Admit and its return below, so
        // never more than the bucket actually has out.
        const int64_t out = reserved.fetch_add(r.tokens()) + r.tokens();
        keep_max(peak, out);
        keep_min(lowest, keys.Snapshot()[0].tokens_available);
        reserved.fetch_sub(r.tokens());
        if ((i * 1000 + j) % 97 != 0) {
          keys.Refund(0, r);
        } else {  // a few run: the prompt and 0 or 1 generated tokens used
          const int64_t generated = j % 2;
          keys.Started(0, r.prompt_tokens);
          keys.Generated(0, generated);
          keys.Ended(0, r, generated);
          used.fetch_add(r.prompt_tokens + generated);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_LE(peak.load(), kCapacity);
  EXPECT_GE(lowest.load(), 0);
  const ApiKeys::Usage u = keys.Snapshot()[0];
  EXPECT_EQ(u.in_flight, 0);
  EXPECT_GT(used.load(), 0);
  EXPECT_EQ(u.tokens_available, kCapacity - used.load());
}

TEST(ApiKeysTest, ConcurrencyLimitRetryAfterFromTheKeysCompletions) {
  FakeClock t;
  ApiKeys keys(TwoKeys(0, 2), t.clock());  // no token limit, 2 at once
  const ApiKeys::Reservation r = R(5, 1);
  ASSERT_TRUE(keys.Admit(0, r).status.ok());
  ASSERT_TRUE(keys.Admit(0, r).status.ok());
  ApiKeys::Decision d = keys.Admit(0, r);
  EXPECT_EQ(d.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(d.status.message(), "API key 'alice': 2 requests in flight (max_concurrent_requests 2)");
  EXPECT_EQ(d.retry_after_ms, 10000);  // no completion yet: Admission::kMaxRetryAfterMs
  keys.Started(0, 5);
  keys.Started(0, 5);
  t.now += absl::Seconds(1);
  keys.Ended(0, r, 1);
  ASSERT_TRUE(keys.Admit(0, r).status.ok());
  keys.Started(0, 5);
  t.now += absl::Seconds(1);
  keys.Ended(0, r, 1);
  ASSERT_TRUE(keys.Admit(0, r).status.ok());
  keys.Started(0, 5);
  t.now += absl::Seconds(1);
  // Two completions, the older 2 s ago: one ends every 1000 ms.
  d = keys.Admit(0, r);
  EXPECT_EQ(d.retry_after_ms, 1000);
  EXPECT_EQ(keys.Snapshot()[0].refused, 2u);
  // Bob has no limit.
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(keys.Admit(1, r).status.ok());
}

TEST(ApiKeysTest, ConcurrencyRefusalWaitsForTheBucketToo) {
  FakeClock t;
  ApiKeys keys(TwoKeys(60, 1), t.clock());
  ASSERT_TRUE(keys.Admit(0, R(50, 10)).status.ok());  // bucket empty, slot taken
  ApiKeys::Decision d = keys.Admit(0, R(20, 10));
  EXPECT_THAT(d.status.message(), HasSubstr("max_concurrent_requests 1"));
  EXPECT_EQ(d.retry_after_ms, 30000);  // the bucket's wait beats the 10 s default
}

// ---- the keys file ---------------------------------------------------------

TEST(ParseApiKeysTest, ReadsEntriesAndDefaults) {
  absl::StatusOr<std::vector<ApiKeyEntry>> e = ParseApiKeys(
      std::string("keys:\n"
                  "  - name: alice\n"
                  "    sha256: ") + absl::AsciiStrToUpper(kAliceSha) + "\n" +
      "    tokens_per_minute: 6000\n"
      "    max_concurrent_requests: 4\n"
      "  - name: bob.batch-2\n"
      "    sha256: " + kBobSha + "\n");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 2u);
  EXPECT_EQ((*e)[0].name, "alice");
  EXPECT_EQ((*e)[0].sha256_hex, kAliceSha);  // lowercased
  EXPECT_EQ((*e)[0].tokens_per_minute, 6000);
  EXPECT_EQ((*e)[0].max_concurrent_requests, 4);
  EXPECT_EQ((*e)[1].name, "bob.batch-2");
  EXPECT_EQ((*e)[1].tokens_per_minute, 0);  // absent: unlimited
  EXPECT_EQ((*e)[1].max_concurrent_requests, 0);
}

// Issue #32: a key reads its own usage; only an admin key reads every
// key's (one tenant learns nothing of another's).
TEST(ApiKeysTest, EachKeySeesItsOwnUsageAnAdminKeySeesAll) {
  absl::StatusOr<std::vector<ApiKeyEntry>> e = ParseApiKeys(
      absl::StrCat("keys:\n  - name: alice\n    sha256: ", kAliceSha,
                   "\n  - name: bob\n    sha256: ", kBobSha, "\n    admin: true\n"));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_FALSE((*e)[0].admin);
  EXPECT_TRUE((*e)[1].admin);
  FakeClock t;
  ApiKeys keys(*e, t.clock());
  std::vector<ApiKeys::Usage> alice = keys.SnapshotFor(0);
  ASSERT_EQ(alice.size(), 1u);
  EXPECT_EQ(alice[0].name, "alice");
  std::vector<ApiKeys::Usage> bob = keys.SnapshotFor(1);
  ASSERT_EQ(bob.size(), 2u);
  EXPECT_EQ(bob[0].name, "alice");
  EXPECT_EQ(bob[1].name, "bob");
  EXPECT_TRUE(keys.SnapshotFor(7).empty());
}

TEST(ParseApiKeysTest, ErrorsNameTheEntryAndField) {
  const std::string alice = std::string("  - name: alice\n    sha256: ") + kAliceSha + "\n";
  const std::string bob = std::string("  - name: bob\n    sha256: ") + kBobSha + "\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "api keys file: expected a mapping with 'keys'"},
      {"keys: []\n", "keys: expected a non-empty list of keys"},
      {"key:\n" + alice, "api keys file: unknown key 'key'"},
      {"keys:\n  - sha256: " + std::string(kAliceSha) + "\n",
       "keys[0].name: required, letters, digits, '.', '_' or '-'"},
      {"keys:\n  - name: al ice\n    sha256: " + std::string(kAliceSha) + "\n",
       "keys[0].name: required, letters, digits, '.', '_' or '-'"},
      {"keys:\n" + alice + "  - name: bob\n    sha256: 1234\n",
       "keys[1] (bob).sha256: expected the key's SHA-256 as 64 hex digits "
       "(printf %s KEY | sha256sum), got 4 characters (the value is not shown: it may be "
       "the key itself)"},
      // A raw key pasted instead of its hash is never echoed.
      {"keys:\n" + alice + "  - name: bob\n    sha256: sk-my-raw-key\n",
       "keys[1] (bob).sha256: expected the key's SHA-256 as 64 hex digits "
       "(printf %s KEY | sha256sum), got 13 characters, not all hex (the value is not shown: "
       "it may be the key itself)"},
      {"keys:\n" + bob + "    tokens_per_minute: 5\n    tokens_per_minute: 10\n",
       "keys[0] (bob): duplicate key 'tokens_per_minute'"},
      {"keys:\n" + alice + "keys:\n" + bob, "api keys file: duplicate key 'keys'"},
      {"keys:\n  - name: bob\n", "keys[0] (bob).sha256: expected the key's SHA-256"},
      {"keys:\n" + bob + "    tokens_per_minute: ten\n",
       "keys[0] (bob).tokens_per_minute: expected an integer in [0, 1000000000], got 'ten'"},
      {"keys:\n" + bob + "    tokens_per_minute: -1\n",
       "keys[0] (bob).tokens_per_minute: expected an integer in [0, 1000000000], got '-1'"},
      {"keys:\n" + bob + "    max_concurrent_requests: 1.5\n",
       "keys[0] (bob).max_concurrent_requests: expected an integer in [0, 2147483647], got '1.5'"},
      {"keys:\n" + bob + "    tokens_per_min: 5\n",
       "keys[0] (bob): unknown key 'tokens_per_min'"},
      {"keys:\n" + bob + "    key: sk-test-bob\n", "keys[0] (bob): unknown key 'key'"},
      {"keys:\n" + bob + "    admin: yes\n",
       "keys[0] (bob).admin: expected true or false, got 'yes'"},
      {"keys:\n" + alice + "  - name: alice\n    sha256: " + kBobSha + "\n",
       "keys[1].name: duplicate name 'alice'"},
      {"keys:\n" + alice + "  - name: carol\n    sha256: " + kAliceSha + "\n",
       "keys[1] (carol).sha256: the same hash as key 'alice'"},
      {"keys: [\n", "YAML error at line"},
  };
  for (const auto& [text, message] : cases) {
    absl::StatusOr<std::vector<ApiKeyEntry>> e = ParseApiKeys(text);
    ASSERT_FALSE(e.ok()) << text;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(e.status().message(), HasSubstr(message)) << text;
  }
}

TEST(ParseApiKeysTest, TheDeployExampleParses) {
  absl::StatusOr<std::vector<ApiKeyEntry>> e =
      LoadApiKeys(std::string(TANDEM_SOURCE_DIR) + "/deploy/api-keys.example.yaml");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 3u);
  EXPECT_EQ((*e)[0].name, "team-a");
  EXPECT_FALSE((*e)[0].admin);
  EXPECT_EQ((*e)[2].name, "operator");
  EXPECT_TRUE((*e)[2].admin);
  EXPECT_EQ((*e)[0].tokens_per_minute, 60000);
  EXPECT_EQ((*e)[0].max_concurrent_requests, 8);
  EXPECT_EQ((*e)[1].name, "batch-jobs");
  EXPECT_EQ((*e)[1].max_concurrent_requests, 0);
}

TEST(ParseApiKeysTest, LoadNamesTheFile) {
  absl::StatusOr<std::vector<ApiKeyEntry>> e = LoadApiKeys("/nonexistent/keys.yaml");
  EXPECT_EQ(e.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(e.status().message(),
            "cannot read API keys file '/nonexistent/keys.yaml': No such file or directory");
  e = LoadApiKeys("/tmp");
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(), "API keys file '/tmp' is a directory, not a file");
}

// ---- Replace: a new table while serving ----------------------------------

std::string Bearer(const std::string& key) { return "Bearer " + key; }

// The id `key` authenticates as, or -1 with the status message in *why.
int IdOf(const ApiKeys& keys, const std::string& key, std::string* why = nullptr) {
  const std::string value = Bearer(key);
  absl::StatusOr<int> id = keys.Authenticate(&value);
  if (!id.ok() && why != nullptr) *why = std::string(id.status().message());
  return id.ok() ? *id : -1;
}

TEST(ApiKeysReplaceTest, KeptNamesKeepTheirStateRemovedOnesAreRefused) {
  FakeClock t;
  ApiKeys keys(TwoKeys(120, 0), t.clock());
  ASSERT_TRUE(keys.Admit(0, R(90, 10)).status.ok());
  keys.Started(0, 90);                              // alice: 1 in flight, 20 tokens left
  ASSERT_TRUE(keys.Admit(1, R(7, 3)).status.ok());  // bob: 1 in flight
  keys.Started(1, 7);
  const std::string carol_key = "sk-test-carol";
  keys.Replace({{"alice", kAliceSha, 120, 0}, {"carol", Sha256Hex(carol_key), 0, 0}});
  EXPECT_EQ(keys.size(), 2);
  EXPECT_EQ(IdOf(keys, kAliceKey), 0);  // same id, same state
  EXPECT_EQ(IdOf(keys, carol_key), 2);
  std::string why;
  EXPECT_EQ(IdOf(keys, kBobKey, &why), -1);
  EXPECT_EQ(why, "invalid API key");
  std::vector<ApiKeys::Usage> u = keys.Snapshot();
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0].name, "alice");
  EXPECT_EQ(u[0].in_flight, 1);
  EXPECT_EQ(u[0].requests, 1u);
  EXPECT_EQ(u[0].prompt_tokens, 90u);
  EXPECT_EQ(u[0].tokens_available, 20);
  EXPECT_EQ(u[1].name, "carol");
  EXPECT_EQ(u[1].in_flight, 0);
  // Bob's running request ends against his state (its id is still valid).
  keys.Generated(1, 3);
  keys.Ended(1, R(7, 3), 3);
  // Bob listed again: his old state, with the request that ended.
  keys.Replace(TwoKeys(120, 0));
  EXPECT_EQ(IdOf(keys, kBobKey), 1);
  u = keys.Snapshot();
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[1].name, "bob");
  EXPECT_EQ(u[1].in_flight, 0);
  EXPECT_EQ(u[1].requests, 1u);
  EXPECT_EQ(u[1].generated_tokens, 3u);
  EXPECT_EQ(IdOf(keys, carol_key, &why), -1);
}

TEST(ApiKeysReplaceTest, NewHashForANameIsARotationNotAFreshQuota) {
  FakeClock t;
  ApiKeys keys(TwoKeys(120, 0), t.clock());
  ASSERT_TRUE(keys.Admit(0, R(90, 10)).status.ok());
  const std::string rotated = "sk-test-alice-2";
  keys.Replace({{"alice", Sha256Hex(rotated), 120, 0}, {"bob", kBobSha, 0, 0}});
  EXPECT_EQ(IdOf(keys, kAliceKey), -1);
  EXPECT_EQ(IdOf(keys, rotated), 0);
  EXPECT_EQ(keys.Snapshot()[0].tokens_available, 20);
  EXPECT_EQ(keys.Snapshot()[0].in_flight, 1);
}

TEST(ApiKeysReplaceTest, NewLimitsKeepTheBucketLevelAndInFlight) {
  FakeClock t;
  ApiKeys keys(TwoKeys(120, 0), t.clock());
  ASSERT_TRUE(keys.Admit(0, R(90, 10)).status.ok());
  ASSERT_TRUE(keys.Admit(0, R(5, 5)).status.ok());  // 10 left, 2 in flight
  auto alice = [&](int64_t tpm, int32_t max) {
    keys.Replace({{"alice", kAliceSha, tpm, max}});
    return keys.Snapshot()[0];
  };
  EXPECT_EQ(alice(60, 0).tokens_available, 10);   // below the new capacity: kept
  EXPECT_EQ(alice(6, 0).tokens_available, 6);     // capped at the new capacity
  EXPECT_EQ(alice(0, 0).tokens_available, 0);     // unlimited: no bucket
  EXPECT_EQ(alice(600, 0).tokens_available, 600);  // a new limit starts full
  ApiKeys::Usage u = alice(600, 1);
  EXPECT_EQ(u.in_flight, 2);
  EXPECT_EQ(u.max_concurrent_requests, 1);
  ApiKeys::Decision d = keys.Admit(0, R(1, 1));
  EXPECT_EQ(d.status.message(), "API key 'alice': 2 requests in flight (max_concurrent_requests 1)");
}

// ---- ApiKeysReloader: the file while serving -----------------------------

constexpr char kAliceFile[] = "keys:\n  - name: alice\n    sha256: "
                              "4d692786b022a5d5a48381dcaf1e5e346366feb5579a1d699de2991d153b05f9\n";
constexpr char kBobFile[] = "keys:\n  - name: bob\n    sha256: "
                            "126fa001bf47b8fca67b958c7cdb3745b15c8eab28dd77b91a53305b5f90632f\n";

// A directory laid out as Kubernetes mounts a Secret: keys.yaml ->
// ..data/keys.yaml, ..data -> ..v<N>; Publish swaps ..data atomically.
class ApiKeysReloaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("tandem_keys_reload_" + std::to_string(getpid())))
               .string();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = dir_ + "/keys.yaml";
    Publish(kAliceFile);
    std::filesystem::create_symlink("..data/keys.yaml", path_);
    std::string text;
    absl::StatusOr<std::vector<ApiKeyEntry>> entries = LoadApiKeys(path_, &text);
    ASSERT_TRUE(entries.ok()) << entries.status();
    EXPECT_EQ(text, kAliceFile);
    keys_ = std::make_unique<ApiKeys>(*entries);
    reloader_ = std::make_unique<ApiKeysReloader>(keys_.get(), path_, text,
                                                  [this](absl::string_view line) {
                                                    absl::MutexLock lock(&mu_);
                                                    lines_.emplace_back(line);
                                                  });
  }
  void TearDown() override {
    reloader_.reset();
    std::filesystem::remove_all(dir_);
  }
  // Writes `text` to a fresh ..v<N>/keys.yaml and points ..data at it.
  void Publish(const std::string& text) {
    const std::string version = "..v" + std::to_string(++versions_);
    std::filesystem::create_directories(dir_ + "/" + version);
    std::ofstream(dir_ + "/" + version + "/keys.yaml", std::ios::binary) << text;
    std::filesystem::create_symlink(version, dir_ + "/..data_tmp");
    std::filesystem::rename(dir_ + "/..data_tmp", dir_ + "/..data");
  }
  std::vector<std::string> Lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }
  std::string dir_, path_;
  int versions_ = 0;
  std::unique_ptr<ApiKeys> keys_;
  std::unique_ptr<ApiKeysReloader> reloader_;
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

TEST_F(ApiKeysReloaderTest, SwappedFileIsReloadedUnchangedOneIsNot) {
  reloader_->Check();
  EXPECT_TRUE(Lines().empty());
  Publish(kBobFile);
  reloader_->Check();
  EXPECT_EQ(Lines(), std::vector<std::string>{"api keys: reloaded " + path_ + " (1 keys)"});
  EXPECT_EQ(IdOf(*keys_, kAliceKey), -1);
  EXPECT_EQ(IdOf(*keys_, kBobKey), 1);
  reloader_->Check();
  EXPECT_EQ(Lines().size(), 1u);
}

TEST_F(ApiKeysReloaderTest, BadFileKeepsTheTableAndIsLoggedOncePerContent) {
  const std::string keeping = "; keeping the 1 keys loaded before";
  const std::string yaml_error = "api keys: " + path_ + ": YAML error";
  Publish("keys: [");
  reloader_->Check();
  reloader_->Check();
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind(yaml_error, 0), 0u) << lines[0];
  EXPECT_THAT(lines[0], ::testing::EndsWith(keeping));
  EXPECT_EQ(IdOf(*keys_, kAliceKey), 0);
  // Another bad content is news; so is the first one again after a good check.
  Publish("keys: []\n");
  reloader_->Check();
  Publish(kAliceFile);  // the bytes in use: nothing to do
  reloader_->Check();
  Publish("keys: [");
  reloader_->Check();
  std::filesystem::remove(dir_ + "/..data");  // dangling: unreadable, also once
  reloader_->Check();
  reloader_->Check();
  lines = Lines();
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[1], "api keys: " + path_ + ": keys: expected a non-empty list of keys" + keeping);
  EXPECT_EQ(lines[2].rfind(yaml_error, 0), 0u) << lines[2];
  EXPECT_EQ(lines[3], "api keys: " + path_ + ": cannot read API keys file '" + path_ +
                          "': No such file or directory" + keeping);
  EXPECT_EQ(keys_->size(), 1);
  EXPECT_EQ(IdOf(*keys_, kAliceKey), 0);
}

TEST_F(ApiKeysReloaderTest, TheThreadChecksEveryIntervalAndStops) {
  reloader_->Start(absl::Milliseconds(20));
  Publish(kBobFile);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Lines().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(Lines(), std::vector<std::string>{"api keys: reloaded " + path_ + " (1 keys)"});
  EXPECT_EQ(IdOf(*keys_, kBobKey), 1);
  reloader_.reset();  // joins
}

}  // namespace
}  // namespace tandem::router
