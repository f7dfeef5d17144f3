#include "auth/cluster_auth.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "auth/crypto.h"

namespace tandem::auth {
namespace {

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool IsLowerHex(absl::string_view s, size_t size) {
  if (s.size() != size) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// What a credential's HMAC covers (cluster_auth.h).
std::string SignedText(absl::string_view method, absl::string_view message_bytes, int64_t ts_ms,
                       absl::string_view nonce) {
  return absl::StrCat("tandem-auth-v1\n", method, "\n", Hex(Sha256(message_bytes)), "\n", ts_ms,
                      "\n", nonce);
}

// What an ACCEPT answer's HMAC covers.
std::string AnswerText(absl::string_view purpose, absl::string_view peer_nonce) {
  return absl::StrCat("tandem-auth-v1\n", purpose, "\n", peer_nonce);
}

[[nodiscard]] absl::Status Malformed(absl::string_view what) {
  return absl::UnauthenticatedError(absl::StrCat("malformed credential: ", what));
}

}  // namespace

absl::StatusOr<std::string> LoadSecretFile(const std::string& path, absl::string_view key) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": '", path, "' is a directory, not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::string secret = text.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.size() < kMinSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        key, ": '", path, "' holds a secret of ", secret.size(), " bytes; at least ",
        kMinSecretBytes, " are required (generate one with: openssl rand -hex 32 > ", path, ")"));
  }
  return secret;
}

std::string FormatCredential(const Credential& c) {
  return absl::StrCat("v1 ts=", c.ts_ms, " nonce=", c.nonce, " sig=", c.sig);
}

absl::StatusOr<Credential> ParseCredential(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ' ');
  if (parts.size() != 4) return Malformed("expected 'v1 ts=<ms> nonce=<hex> sig=<hex>'");
  if (parts[0] != "v1") return Malformed("unknown version (expected v1)");
  Credential c;
  absl::string_view ts = parts[1], nonce = parts[2], sig = parts[3];
  if (!absl::ConsumePrefix(&ts, "ts=") || ts.empty() || !absl::SimpleAtoi(ts, &c.ts_ms)) {
    return Malformed("ts: expected ts=<milliseconds since the epoch>");
  }
  if (!absl::ConsumePrefix(&nonce, "nonce=") || !IsLowerHex(nonce, kNonceHexChars)) {
    return Malformed(absl::StrCat("nonce: expected nonce=<", kNonceHexChars, " hex digits>"));
  }
  if (!absl::ConsumePrefix(&sig, "sig=") || !IsLowerHex(sig, kSigHexChars)) {
    return Malformed(absl::StrCat("sig: expected sig=<", kSigHexChars, " hex digits>"));
  }
  c.nonce = std::string(nonce);
  c.sig = std::string(sig);
  return c;
}

ClusterAuth::ClusterAuth(Options options)
    : secret_(std::move(options.secret)),
      accepted_(secret_.empty() ? std::vector<std::string>() : std::move(options.accepted_secrets)),
      max_skew_ms_(options.max_skew_ms),
      max_nonces_(options.max_remembered_nonces),
      clock_(options.clock ? std::move(options.clock) : Clock(SystemNowMs)) {}

absl::StatusOr<std::unique_ptr<ClusterAuth>> ClusterAuth::Load(
    const std::string& secret_file, int32_t max_skew_ms,
    const std::vector<std::string>& accepted_secret_files) {
  Options options;
  options.max_skew_ms = max_skew_ms;
  if (secret_file.empty() && !accepted_secret_files.empty()) {
    return absl::InvalidArgumentError(
        "cluster.accepted_secret_files: needs cluster.secret_file (an open cluster has no "
        "secret to rotate)");
  }
  if (!secret_file.empty()) {
    absl::StatusOr<std::string> secret = LoadSecretFile(secret_file);
    if (!secret.ok()) return secret.status();
    options.secret = std::move(*secret);
  }
  for (size_t i = 0; i < accepted_secret_files.size(); ++i) {
    absl::StatusOr<std::string> secret = LoadSecretFile(
        accepted_secret_files[i], absl::StrCat("cluster.accepted_secret_files[", i, "]"));
    if (!secret.ok()) return secret.status();
    options.accepted_secrets.push_back(std::move(*secret));
  }
  return std::make_unique<ClusterAuth>(std::move(options));
}

bool ClusterAuth::AnySecretSigned(absl::string_view data, absl::string_view sig_hex) const {
  bool match = ConstantTimeEqual(Hex(HmacSha256(secret_, data)), sig_hex);
  for (const std::string& secret : accepted_) {
    match |= ConstantTimeEqual(Hex(HmacSha256(secret, data)), sig_hex);
  }
  return match;
}

Credential ClusterAuth::Sign(absl::string_view method, absl::string_view message_bytes) const {
  Credential c;
  if (open()) return c;
  c.ts_ms = clock_();
  c.nonce = RandomHex(kNonceHexChars / 2);
  c.sig = Hex(HmacSha256(secret_, SignedText(method, message_bytes, c.ts_ms, c.nonce)));
  return c;
}

absl::Status ClusterAuth::Verify(absl::string_view method, absl::string_view message_bytes,
                                 const Credential& c) const {
  if (open()) return absl::OkStatus();
  const int64_t now = clock_();
  const int64_t skew = now - c.ts_ms;
  if (skew > max_skew_ms_ || skew < -int64_t{max_skew_ms_}) {
    return absl::UnauthenticatedError(
        absl::StrCat("clock skew: the credential's timestamp is ", skew > 0 ? skew : -skew, " ms ",
                     skew > 0 ? "behind" : "ahead of",
                     " this host's clock (cluster.auth_max_skew_ms ", max_skew_ms_, ")"));
  }
  if (!AnySecretSigned(SignedText(method, message_bytes, c.ts_ms, c.nonce), c.sig)) {
    return absl::UnauthenticatedError(
        "bad signature (another cluster secret, or the message was altered)");
  }
  absl::MutexLock lock(&mu_);
  while (!by_expiry_.empty() && by_expiry_.begin()->first < now) {
    seen_.erase(by_expiry_.begin()->second);
    by_expiry_.erase(by_expiry_.begin());
  }
  if (seen_.contains(c.nonce)) {
    return absl::UnauthenticatedError("replayed nonce: this credential was already used");
  }
  if (seen_.size() >= max_nonces_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("replay cache full: ", seen_.size(),
                     " authenticated messages within cluster.auth_max_skew_ms; retry later"));
  }
  seen_.insert(c.nonce);
  by_expiry_.emplace(c.ts_ms + max_skew_ms_, c.nonce);
  return absl::OkStatus();
}

absl::Status ClusterAuth::VerifyText(absl::string_view method, absl::string_view message_bytes,
                                     const std::string* text) const {
  if (open()) return absl::OkStatus();
  if (text == nullptr) {
    return absl::UnauthenticatedError(absl::StrCat("missing ", kAuthMetadataKey,
                                                   " credential (this cluster requires the "
                                                   "cluster secret)"));
  }
  absl::StatusOr<Credential> c = ParseCredential(*text);
  if (!c.ok()) return c.status();
  return Verify(method, message_bytes, *c);
}

std::string ClusterAuth::Answer(absl::string_view purpose, absl::string_view peer_nonce) const {
  if (open()) return "";
  return Hex(HmacSha256(secret_, AnswerText(purpose, peer_nonce)));
}

bool ClusterAuth::CheckAnswer(absl::string_view purpose, absl::string_view peer_nonce,
                              absl::string_view answer) const {
  if (open()) return true;
  return AnySecretSigned(AnswerText(purpose, peer_nonce), answer);
}

size_t ClusterAuth::remembered_nonces() const {
  absl::MutexLock lock(&mu_);
  return seen_.size();
}

}  // namespace tandem::auth
