// The cluster secret and what is signed with it (docs/architecture.md,
// "Trust: the cluster secret (HMAC)").
//
// Every router <-> worker RPC and the KV HELLO carry a credential: a
// timestamp, a random nonce and
//   sig = HMAC-SHA256(secret, "tandem-auth-v1\n" + method + "\n" +
//                     hex(SHA-256(message bytes)) + "\n" + ts_ms + "\n" + nonce)
// The verifier checks the timestamp against its own clock (|now - ts| <=
// max_skew_ms), the HMAC (constant time), then that the nonce was not
// seen in the window (nonces are remembered until their timestamp leaves
// the window, so a captured message cannot be replayed).
//
// Rotation (cluster.accepted_secret_files): a process signs with one secret
// (cluster.secret_file) and also accepts credentials made with any of its
// accepted secrets, so the secret changes with three rolling restarts and
// no refused call:
//   1. roll every process to secret_file=OLD, accepted=[NEW];
//   2. roll every process to secret_file=NEW, accepted=[OLD];
//   3. roll every process to secret_file=NEW, accepted=[] (OLD retired).
// During each roll some processes run the step before and some the step
// after; every pair still accepts each other's calls, because each signs
// with a secret the other holds (step 1: all sign OLD, all hold OLD; step
// 2: a rolled process signs NEW, held by all since step 1, an unrolled
// one signs OLD, held by all; step 3: all sign NEW, all hold NEW). Start a
// step only once the previous one has reached every process.
//
// Owns: the secrets (never logged, never in an error), signing, verifying,
// the replay cache. Does not touch: gRPC, sockets, serving
// (common/server/auth_call.h binds it to gRPC metadata; kvtransfer to the
// HELLO). Threads: every method is thread-safe (the replay cache is under
// a mutex); the object outlives every caller (one per process).
#ifndef TANDEM_AUTH_CLUSTER_AUTH_H_
#define TANDEM_AUTH_CLUSTER_AUTH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace tandem::auth {

// gRPC metadata key of the credential:
//   "v1 ts=<ms since the epoch> nonce=<32 hex> sig=<64 hex>".
inline constexpr char kAuthMetadataKey[] = "x-tandem-auth";
inline constexpr size_t kMinSecretBytes = 32;
inline constexpr int32_t kDefaultMaxSkewMs = 30000;
inline constexpr size_t kNonceHexChars = 32;  // 16 random bytes
inline constexpr size_t kSigHexChars = 64;    // HMAC-SHA256

// Reads a secret file: its bytes with trailing '\n' / '\r' removed.
// INVALID_ARGUMENT naming `key` (e.g. "cluster.secret_file") for an
// unreadable file, a directory or a secret shorter than kMinSecretBytes; the secret's
// bytes are never in the message.
[[nodiscard]] absl::StatusOr<std::string> LoadSecretFile(
    const std::string& path, absl::string_view key = "cluster.secret_file");

// One credential: what a signer sends, what a verifier checks.
struct Credential {
  int64_t ts_ms = 0;  // signer's wall clock, ms since the Unix epoch
  std::string nonce;  // kNonceHexChars lower-case hex
  std::string sig;    // kSigHexChars lower-case hex
};

// "v1 ts=<ts_ms> nonce=<nonce> sig=<sig>".
std::string FormatCredential(const Credential& credential);
// Parses FormatCredential's text. UNAUTHENTICATED "malformed credential:
// <what>" for anything else (the text itself is not echoed).
[[nodiscard]] absl::StatusOr<Credential> ParseCredential(absl::string_view text);

class ClusterAuth {
 public:
  // Wall-clock milliseconds since the Unix epoch (injectable for tests).
  using Clock = std::function<int64_t()>;
  struct Options {
    std::string secret;  // signs and verifies; empty: the cluster runs open
    // Verify only (rotation): credentials and ACCEPT answers made with any
    // of these are accepted too. Dropped when `secret` is empty.
    std::vector<std::string> accepted_secrets;
    int32_t max_skew_ms = kDefaultMaxSkewMs;
    // Replay cache bound; beyond it Verify answers RESOURCE_EXHAUSTED.
    size_t max_remembered_nonces = size_t{1} << 20;
    Clock clock;  // unset: the system clock
  };

  // An empty `secret` means open whatever accepted_secrets holds (Load
  // refuses that combination with an error before it gets here).
  explicit ClusterAuth(Options options);
  ClusterAuth(const ClusterAuth&) = delete;
  ClusterAuth& operator=(const ClusterAuth&) = delete;

  // The process's auth from the config's cluster.secret_file (empty: open),
  // cluster.auth_max_skew_ms and cluster.accepted_secret_files. Errors:
  // LoadSecretFile's, naming "cluster.secret_file" or
  // "cluster.accepted_secret_files[i]"; INVALID_ARGUMENT naming
  // cluster.accepted_secret_files when it is not empty but secret_file is.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ClusterAuth>> Load(
      const std::string& secret_file, int32_t max_skew_ms,
      const std::vector<std::string>& accepted_secret_files = {});

  // No secret: Sign* return empty credentials and Verify* accept anything.
  bool open() const { return secret_.empty(); }
  // ClusterStatus.cluster_auth: "hmac-sha256" or "open".
  absl::string_view mode() const { return open() ? "open" : "hmac-sha256"; }
  int32_t max_skew_ms() const { return max_skew_ms_; }
  // How many accepted (verify-only) secrets besides the signing one.
  size_t accepted_secrets() const { return accepted_.size(); }

  // A credential for `message_bytes` sent to `method` (a gRPC full method
  // name "/tandem.v1.DecodeWorker/Generate", or "kv/HELLO"), with the
  // clock's time and a fresh nonce, made with the signing secret only.
  // Open: an empty Credential.
  Credential Sign(absl::string_view method, absl::string_view message_bytes) const;

  // Checks `credential` for `message_bytes` sent to `method`: timestamp
  // within max_skew_ms of the clock, HMAC under the signing secret or any
  // accepted one (each compared in constant time, all of them computed),
  // nonce not seen within the window whichever secret made it (then
  // remembered: one replay cache). Open: OK. Errors: UNAUTHENTICATED "clock
  // skew: ...", "bad signature ...", "replayed nonce ..."; RESOURCE_EXHAUSTED
  // when the replay cache is full.
  [[nodiscard]] absl::Status Verify(absl::string_view method, absl::string_view message_bytes,
                                    const Credential& credential) const;

  // Verify of a metadata value; `text` nullptr = no credential sent.
  // UNAUTHENTICATED "missing x-tandem-auth credential" / "malformed ..."
  // before Verify's checks. Open: OK.
  [[nodiscard]] absl::Status VerifyText(absl::string_view method, absl::string_view message_bytes,
                                        const std::string* text) const;

  // Challenge-response: the 64-hex tag that proves to the holder of
  // `peer_nonce` (a nonce it sent) that this side holds the secret:
  // HMAC(secret, "tandem-auth-v1\n" + purpose + "\n" + peer_nonce), made
  // with the signing secret. Open: "".
  std::string Answer(absl::string_view purpose, absl::string_view peer_nonce) const;
  // Whether `answer` is the Answer(purpose, peer_nonce) of the signing
  // secret or of an accepted one (constant time per secret). Open: true.
  bool CheckAnswer(absl::string_view purpose, absl::string_view peer_nonce,
                   absl::string_view answer) const;

  // Nonces in the replay cache now (tests).
  size_t remembered_nonces() const;

 private:
  // Whether `sig_hex` is the HMAC of `data` under the signing secret or an
  // accepted one: every candidate computed and compared in constant time.
  bool AnySecretSigned(absl::string_view data, absl::string_view sig_hex) const;

  const std::string secret_;
  const std::vector<std::string> accepted_;
  const int32_t max_skew_ms_;
  const size_t max_nonces_;
  const Clock clock_;
  mutable absl::Mutex mu_;
  // nonce -> expiry (ts + max_skew_ms): after it the skew check refuses the
  // timestamp anyway. `by_expiry_` orders them for pruning.
  mutable absl::flat_hash_set<std::string> seen_ ABSL_GUARDED_BY(mu_);
  mutable std::multimap<int64_t, std::string> by_expiry_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::auth

#endif  // TANDEM_AUTH_CLUSTER_AUTH_H_
