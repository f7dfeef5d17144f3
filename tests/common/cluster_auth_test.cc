// common/auth: HMAC-SHA256 against RFC 4231, the credential format, the
// verifier (skew, replay, wrong secret, tampered message, missing and
// malformed credentials, the replay cache bound) and secret-file loading.
#include "common/auth/cluster_auth.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/auth/crypto.h"

namespace tandem::auth {
namespace {

const std::string kSecret(40, 's');
const std::string kMethod = "/tandem.v1.DecodeWorker/Generate";

// RFC 4231 section 4.2 and 4.3 (test cases 1 and 2), HMAC-SHA-256.
TEST(CryptoTest, HmacSha256MatchesRfc4231) {
  EXPECT_EQ(Hex(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(Hex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

// FIPS 180-2 example "abc".
TEST(CryptoTest, Sha256OfAbc) {
  EXPECT_EQ(Hex(Sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(CryptoTest, ConstantTimeEqualAndRandomHex) {
  EXPECT_TRUE(ConstantTimeEqual("abcd", "abcd"));
  EXPECT_FALSE(ConstantTimeEqual("abcd", "abce"));
  EXPECT_FALSE(ConstantTimeEqual("abc", "abcd"));
  const std::string a = RandomHex(16), b = RandomHex(16);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
}

// A verifier and signer pair on a manual clock.
struct Fixture {
  explicit Fixture(std::string secret = kSecret, int32_t skew = 1000, size_t max_nonces = 1000) {
    ClusterAuth::Options o;
    o.secret = std::move(secret);
    o.max_skew_ms = skew;
    o.max_remembered_nonces = max_nonces;
    o.clock = [this] { return now; };
    auth = std::make_unique<ClusterAuth>(std::move(o));
  }
  int64_t now = 1'800'000'000'000;
  std::unique_ptr<ClusterAuth> auth;
};

TEST(ClusterAuthTest, SignatureIsTheDocumentedHmac) {
  Fixture f;
  const Credential c = f.auth->Sign(kMethod, "body");
  EXPECT_EQ(c.ts_ms, f.now);
  EXPECT_EQ(c.nonce.size(), kNonceHexChars);
  EXPECT_EQ(c.sig, Hex(HmacSha256(kSecret, "tandem-auth-v1\n" + kMethod + "\n" +
                                               Hex(Sha256("body")) + "\n" +
                                               std::to_string(f.now) + "\n" + c.nonce)));
  EXPECT_TRUE(f.auth->Verify(kMethod, "body", c).ok());
  EXPECT_FALSE(f.auth->open());
  EXPECT_EQ(f.auth->mode(), "hmac-sha256");
}

TEST(ClusterAuthTest, RoundTripThroughText) {
  Fixture f;
  const Credential c = f.auth->Sign(kMethod, "body");
  const std::string text = FormatCredential(c);
  EXPECT_EQ(text, "v1 ts=" + std::to_string(f.now) + " nonce=" + c.nonce + " sig=" + c.sig);
  EXPECT_TRUE(f.auth->VerifyText(kMethod, "body", &text).ok());
}

TEST(ClusterAuthTest, ReplayIsRefused) {
  Fixture f;
  const Credential c = f.auth->Sign(kMethod, "body");
  ASSERT_TRUE(f.auth->Verify(kMethod, "body", c).ok());
  absl::Status again = f.auth->Verify(kMethod, "body", c);
  EXPECT_EQ(again.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(again.message(), "replayed nonce: this credential was already used");
}

TEST(ClusterAuthTest, ClockSkewBothWays) {
  Fixture f;
  const Credential c = f.auth->Sign(kMethod, "body");
  f.now += 1001;
  absl::Status late = f.auth->Verify(kMethod, "body", c);
  EXPECT_EQ(late.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(late.message(),
            "clock skew: the credential's timestamp is 1001 ms behind this host's clock "
            "(cluster.auth_max_skew_ms 1000)");
  f.now -= 2002;
  absl::Status early = f.auth->Verify(kMethod, "body", c);
  EXPECT_EQ(early.message(),
            "clock skew: the credential's timestamp is 1001 ms ahead of this host's clock "
            "(cluster.auth_max_skew_ms 1000)");
  f.now += 1001 + 1000;  // exactly max_skew_ms behind: still accepted
  EXPECT_TRUE(f.auth->Verify(kMethod, "body", c).ok());
}

TEST(ClusterAuthTest, WrongSecretTamperedMessageOrMethodIsBadSignature) {
  Fixture signer(std::string(40, 'x'));
  Fixture verifier;
  const Credential c = signer.auth->Sign(kMethod, "body");
  const std::string bad = "bad signature (another cluster secret, or the message was altered)";
  EXPECT_EQ(verifier.auth->Verify(kMethod, "body", c).message(), bad);
  const Credential good = verifier.auth->Sign(kMethod, "body");
  EXPECT_EQ(verifier.auth->Verify(kMethod, "bodY", good).message(), bad);
  EXPECT_EQ(verifier.auth->Verify("/tandem.v1.PrefillWorker/Prefill", "body", good).message(),
            bad);
  Credential moved = good;
  moved.ts_ms += 1;
  EXPECT_EQ(verifier.auth->Verify(kMethod, "body", moved).message(), bad);
  // None of them used up the nonce: the genuine one still verifies.
  EXPECT_EQ(verifier.auth->remembered_nonces(), 0u);
  EXPECT_TRUE(verifier.auth->Verify(kMethod, "body", good).ok());
}

TEST(ClusterAuthTest, MissingAndMalformedCredentials) {
  Fixture f;
  absl::Status missing = f.auth->VerifyText(kMethod, "body", nullptr);
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(missing.message(),
            "missing x-tandem-auth credential (this cluster requires the cluster secret)");
  const Credential c = f.auth->Sign(kMethod, "body");
  const std::string nonce = " nonce=" + c.nonce, sig = " sig=" + c.sig;
  const std::pair<std::string, std::string> cases[] = {
      {"", "malformed credential: expected 'v1 ts=<ms> nonce=<hex> sig=<hex>'"},
      {"v2 ts=1" + nonce + sig, "malformed credential: unknown version (expected v1)"},
      {"v1 ts=x" + nonce + sig, "malformed credential: ts: expected ts=<milliseconds since the epoch>"},
      {"v1 ts=1 nonce=ABC" + sig, "malformed credential: nonce: expected nonce=<32 hex digits>"},
      {"v1 ts=1" + nonce + " sig=" + c.sig.substr(1),
       "malformed credential: sig: expected sig=<64 hex digits>"},
  };
  for (const auto& [text, message] : cases) {
    absl::Status s = f.auth->VerifyText(kMethod, "body", &text);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << text;
    EXPECT_EQ(s.message(), message) << text;
  }
}

TEST(ClusterAuthTest, ReplayCacheIsPrunedAndBounded) {
  Fixture f(kSecret, /*skew=*/1000, /*max_nonces=*/2);
  ASSERT_TRUE(f.auth->Verify(kMethod, "a", f.auth->Sign(kMethod, "a")).ok());
  ASSERT_TRUE(f.auth->Verify(kMethod, "b", f.auth->Sign(kMethod, "b")).ok());
  absl::Status full = f.auth->Verify(kMethod, "c", f.auth->Sign(kMethod, "c"));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(f.auth->remembered_nonces(), 2u);
  // Once their timestamps leave the window the two are forgotten.
  f.now += 1001;
  EXPECT_TRUE(f.auth->Verify(kMethod, "d", f.auth->Sign(kMethod, "d")).ok());
  EXPECT_EQ(f.auth->remembered_nonces(), 1u);
}

TEST(ClusterAuthTest, OpenClusterSignsNothingAndAcceptsAnything) {
  Fixture f("");
  EXPECT_TRUE(f.auth->open());
  EXPECT_EQ(f.auth->mode(), "open");
  const Credential c = f.auth->Sign(kMethod, "body");
  EXPECT_TRUE(c.nonce.empty());
  EXPECT_TRUE(f.auth->VerifyText(kMethod, "body", nullptr).ok());
  EXPECT_EQ(f.auth->Answer("kv/ACCEPT", "n"), "");
}

TEST(ClusterAuthTest, AnswerProvesTheSecret) {
  Fixture a, b(std::string(40, 'x'));
  const std::string nonce = RandomHex(16);
  EXPECT_EQ(a.auth->Answer("kv/ACCEPT", nonce),
            Hex(HmacSha256(kSecret, "tandem-auth-v1\nkv/ACCEPT\n" + nonce)));
  EXPECT_TRUE(a.auth->CheckAnswer("kv/ACCEPT", nonce, a.auth->Answer("kv/ACCEPT", nonce)));
  EXPECT_FALSE(a.auth->CheckAnswer("kv/ACCEPT", nonce, b.auth->Answer("kv/ACCEPT", nonce)));
  EXPECT_FALSE(a.auth->CheckAnswer("kv/ACCEPT", nonce, ""));
}

class SecretFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& bytes) {
    std::ofstream(path_, std::ios::binary) << bytes;
    return path_;
  }
  void TearDown() override { std::filesystem::remove(path_); }
  const std::string path_ =
      (std::filesystem::temp_directory_path() / ("tandem_secret_" + std::to_string(getpid())))
          .string();
};

TEST_F(SecretFileTest, TrailingNewlineIsTrimmed) {
  absl::StatusOr<std::string> s = LoadSecretFile(Write(std::string(32, 'k') + "\r\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, std::string(32, 'k'));
}

TEST_F(SecretFileTest, ShortSecretIsRefusedNamingTheKey) {
  absl::StatusOr<std::string> s = LoadSecretFile(Write(std::string(31, 'k') + "\n"));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "cluster.secret_file: '" + path_ + "' holds a secret of 31 bytes; at least 32 are "
            "required (generate one with: openssl rand -hex 32 > " + path_ + ")");
}

TEST_F(SecretFileTest, MissingFileIsRefusedNamingTheKey) {
  absl::StatusOr<std::string> s = LoadSecretFile("/nonexistent/secret");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "cluster.secret_file: cannot read '/nonexistent/secret': No such file or directory");
  absl::StatusOr<std::unique_ptr<ClusterAuth>> auth = ClusterAuth::Load("/nonexistent/secret", 100);
  EXPECT_EQ(auth.status().message(), s.status().message());
  s = LoadSecretFile("/tmp");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(), "cluster.secret_file: '/tmp' is a directory, not a file");
}

TEST_F(SecretFileTest, LoadWithoutFileIsOpen) {
  absl::StatusOr<std::unique_ptr<ClusterAuth>> open = ClusterAuth::Load("", 100);
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE((*open)->open());
  absl::StatusOr<std::unique_ptr<ClusterAuth>> secured =
      ClusterAuth::Load(Write(std::string(64, 'a') + "\n"), 1234);
  ASSERT_TRUE(secured.ok());
  EXPECT_FALSE((*secured)->open());
  EXPECT_EQ((*secured)->max_skew_ms(), 1234);
}

}  // namespace
}  // namespace tandem::auth
