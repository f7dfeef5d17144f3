// auth: HMAC-SHA256 against RFC 4231, the credential format, the
// verifier (skew, replay, wrong secret, tampered message, missing and
// malformed credentials, the replay cache bound), rotation with accepted
// secrets (each rolling step's pairs, a third secret, replay across
// secrets, ACCEPT answers) and secret-file loading.
#include "auth/cluster_auth.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "auth/crypto.h"

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
  explicit Fixture(std::string secret = kSecret, int32_t skew = 1000, size_t max_nonces = 1000,
                   std::vector<std::string> accepted = {}) {
    ClusterAuth::Options o;
    o.secret = std::move(secret);
    o.accepted_secrets = std::move(accepted);
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

// ---- Rotation: cluster.accepted_secret_files --------------------------------

const std::string kOld(40, 'o'), kNew(40, 'n'), kThird(40, 't');
const std::string kBadSignature =
    "bad signature (another cluster secret, or the message was altered)";

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The documented credential (cluster_auth.h) made by hand with `secret`.
Credential HandSigned(const std::string& secret, int64_t ts_ms, const std::string& nonce) {
  Credential c;
  c.ts_ms = ts_ms;
  c.nonce = nonce;
  c.sig = Hex(HmacSha256(secret, "tandem-auth-v1\n" + kMethod + "\n" + Hex(Sha256("body")) +
                                     "\n" + std::to_string(ts_ms) + "\n" + nonce));
  return c;
}

TEST(ClusterAuthRotationTest, OldAndNewVerifyAcrossTheMiddleStep) {
  Fixture at_new(kNew, 1000, 1000, {kOld});  // step 2 rolled
  Fixture at_old(kOld, 1000, 1000, {kNew});  // step 1 rolled
  EXPECT_EQ(at_new.auth->accepted_secrets(), 1u);
  // Each signs with its own secret only...
  const Credential from_old = at_old.auth->Sign(kMethod, "body");
  EXPECT_EQ(from_old.sig, HandSigned(kOld, from_old.ts_ms, from_old.nonce).sig);
  const Credential from_new = at_new.auth->Sign(kMethod, "body");
  EXPECT_EQ(from_new.sig, HandSigned(kNew, from_new.ts_ms, from_new.nonce).sig);
  // ...and accepts the other's.
  EXPECT_TRUE(at_new.auth->Verify(kMethod, "body", from_old).ok());
  EXPECT_TRUE(at_old.auth->Verify(kMethod, "body", from_new).ok());
  // Its own too.
  EXPECT_TRUE(at_new.auth->Verify(kMethod, "body", at_new.auth->Sign(kMethod, "body")).ok());
  EXPECT_TRUE(at_old.auth->Verify(kMethod, "body", at_old.auth->Sign(kMethod, "body")).ok());
}

TEST(ClusterAuthRotationTest, AThirdSecretIsRefused) {
  Fixture verifier(kNew, 1000, 1000, {kOld});
  Fixture intruder(kThird, 1000, 1000, {kNew, kOld});  // accepting ours opens nothing
  absl::Status s = verifier.auth->Verify(kMethod, "body", intruder.auth->Sign(kMethod, "body"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(s.message(), kBadSignature);
  // An accepted secret covers exactly what the signing one does: a
  // tampered message signed with OLD is still refused.
  EXPECT_EQ(verifier.auth->Verify(kMethod, "bodY", HandSigned(kOld, verifier.now, RandomHex(16)))
                .message(),
            kBadSignature);
  EXPECT_EQ(verifier.auth->remembered_nonces(), 0u);
}

// Every pair of processes that can meet during a rolling step (one not yet
// rolled, one rolled) accepts each other's calls both ways; processes two
// steps apart do not (hence: finish each step before starting the next).
TEST(ClusterAuthRotationTest, EveryRollingStepKeepsPairsTalking) {
  struct Step {
    std::string secret;
    std::vector<std::string> accepted;
  };
  const Step steps[] = {{kOld, {}}, {kOld, {kNew}}, {kNew, {kOld}}, {kNew, {}}};
  auto accepts = [](const Step& verifier, const Step& signer) {
    Fixture v(verifier.secret, 1000, 1000, verifier.accepted);
    Fixture s(signer.secret, 1000, 1000, signer.accepted);
    return v.auth->Verify(kMethod, "body", s.auth->Sign(kMethod, "body")).ok();
  };
  for (int i = 0; i + 1 < 4; ++i) {
    EXPECT_TRUE(accepts(steps[i], steps[i + 1])) << "step " << i << " verifying " << i + 1;
    EXPECT_TRUE(accepts(steps[i + 1], steps[i])) << "step " << i + 1 << " verifying " << i;
  }
  EXPECT_FALSE(accepts(steps[0], steps[2]));  // OLD-only refuses NEW
  EXPECT_FALSE(accepts(steps[3], steps[1]));  // NEW-only refuses OLD
}

TEST(ClusterAuthRotationTest, ReplayIsRefusedWhicheverSecretSigned) {
  Fixture f(kNew, 1000, 1000, {kOld});
  const std::string nonce = RandomHex(16);
  const Credential old_signed = HandSigned(kOld, f.now, nonce);
  const Credential new_signed = HandSigned(kNew, f.now, nonce);
  ASSERT_TRUE(f.auth->Verify(kMethod, "body", old_signed).ok());
  EXPECT_EQ(f.auth->remembered_nonces(), 1u);
  for (const Credential& c : {old_signed, new_signed}) {
    absl::Status again = f.auth->Verify(kMethod, "body", c);
    EXPECT_EQ(again.code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(again.message(), "replayed nonce: this credential was already used");
  }
  // The same the other way round: NEW first, then OLD with its nonce.
  const std::string nonce2 = RandomHex(16);
  ASSERT_TRUE(f.auth->Verify(kMethod, "body", HandSigned(kNew, f.now, nonce2)).ok());
  EXPECT_EQ(f.auth->Verify(kMethod, "body", HandSigned(kOld, f.now, nonce2)).message(),
            "replayed nonce: this credential was already used");
  EXPECT_EQ(f.auth->remembered_nonces(), 2u);
}

TEST(ClusterAuthRotationTest, AcceptAnswersOfAnAcceptedSecretProveIt) {
  Fixture sender(kOld, 1000, 1000, {kNew}), receiver(kNew, 1000, 1000, {kOld});
  Fixture third(kThird);
  const std::string nonce = RandomHex(16);
  // The receiver answers with its signing secret only.
  const std::string answer = receiver.auth->Answer("kv/ACCEPT", nonce);
  EXPECT_EQ(answer, Hex(HmacSha256(kNew, "tandem-auth-v1\nkv/ACCEPT\n" + nonce)));
  EXPECT_TRUE(sender.auth->CheckAnswer("kv/ACCEPT", nonce, answer));
  EXPECT_TRUE(receiver.auth->CheckAnswer("kv/ACCEPT", nonce, sender.auth->Answer("kv/ACCEPT", nonce)));
  EXPECT_FALSE(sender.auth->CheckAnswer("kv/ACCEPT", nonce, third.auth->Answer("kv/ACCEPT", nonce)));
  EXPECT_FALSE(sender.auth->CheckAnswer("kv/HELLO", nonce, answer));  // another purpose
}

TEST(ClusterAuthRotationTest, EmptySecretIsOpenWhateverIsAccepted) {
  // An empty signing secret is an open cluster: Load refuses accepted
  // secrets without one (SecretFileTest below), the constructor drops them.
  Fixture f("", 1000, 1000, {kOld});
  EXPECT_TRUE(f.auth->open());
  EXPECT_EQ(f.auth->accepted_secrets(), 0u);
}

class SecretFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& bytes) {
    std::ofstream(path_, std::ios::binary) << bytes;
    return path_;
  }
  // A second file beside path_ ("<path_>.<suffix>"), removed in TearDown.
  std::string WriteBeside(const std::string& suffix, const std::string& bytes) {
    const std::string path = path_ + "." + suffix;
    std::ofstream(path, std::ios::binary) << bytes;
    extra_.push_back(path);
    return path;
  }
  void TearDown() override {
    std::filesystem::remove(path_);
    for (const std::string& p : extra_) std::filesystem::remove(p);
  }
  std::vector<std::string> extra_;
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

TEST_F(SecretFileTest, AcceptedSecretFilesAreLoadedLikeTheSecret) {
  const std::string secret = Write(kNew + "\n");
  const std::string old_file = WriteBeside("old", kOld + "\n");
  absl::StatusOr<std::unique_ptr<ClusterAuth>> auth = ClusterAuth::Load(secret, 1000, {old_file});
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->accepted_secrets(), 1u);
  // Loaded bytes (newline trimmed): a credential made by hand with OLD verifies.
  EXPECT_TRUE(
      (*auth)->Verify(kMethod, "body", HandSigned(kOld, SystemNowMs(), RandomHex(16))).ok());

  const std::string short_file = WriteBeside("short", std::string(31, 'k') + "\n");
  absl::StatusOr<std::unique_ptr<ClusterAuth>> bad =
      ClusterAuth::Load(secret, 1000, {old_file, short_file});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "cluster.accepted_secret_files[1]: '" + short_file + "' holds a secret of 31 bytes; "
            "at least 32 are required (generate one with: openssl rand -hex 32 > " + short_file +
            ")");
  bad = ClusterAuth::Load(secret, 1000, {"/nonexistent/old"});
  EXPECT_EQ(bad.status().message(),
            "cluster.accepted_secret_files[0]: cannot read '/nonexistent/old': No such file or "
            "directory");
  bad = ClusterAuth::Load(secret, 1000, {"/tmp"});
  EXPECT_EQ(bad.status().message(),
            "cluster.accepted_secret_files[0]: '/tmp' is a directory, not a file");
  bad = ClusterAuth::Load("", 1000, {old_file});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "cluster.accepted_secret_files: needs cluster.secret_file (an open cluster has no "
            "secret to rotate)");
}

}  // namespace
}  // namespace tandem::auth
