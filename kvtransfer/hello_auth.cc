#include "kvtransfer/hello_auth.h"

namespace tandem::kvtransfer {

void SignHello(const auth::ClusterAuth* auth, wire::Hello* hello) {
  if (auth == nullptr || auth->open()) return;
  const auth::Credential c = auth->Sign(kHelloPurpose, wire::HelloSignedBytes(*hello));
  hello->auth = wire::HelloAuth{static_cast<uint64_t>(c.ts_ms), c.nonce, c.sig};
}

absl::Status VerifyHello(const auth::ClusterAuth* auth, const wire::Hello& hello) {
  if (auth == nullptr || auth->open()) return absl::OkStatus();
  if (!hello.auth.has_value()) {
    return absl::UnauthenticatedError(
        "missing credential (this KV receiver requires the cluster secret)");
  }
  auth::Credential c;
  c.ts_ms = static_cast<int64_t>(hello.auth->ts_ms);
  c.nonce = hello.auth->nonce;
  c.sig = hello.auth->sig;
  return auth->Verify(kHelloPurpose, wire::HelloSignedBytes(hello), c);
}

std::string AcceptAnswer(const auth::ClusterAuth* auth, const wire::Hello& hello) {
  if (auth == nullptr || auth->open() || !hello.auth.has_value()) return "";
  return auth->Answer(kAcceptPurpose, hello.auth->nonce);
}

absl::Status CheckAcceptAnswer(const auth::ClusterAuth* auth, const wire::Hello& hello,
                               const std::string& answer) {
  if (auth == nullptr || auth->open()) return absl::OkStatus();
  if (hello.auth.has_value() && auth->CheckAnswer(kAcceptPurpose, hello.auth->nonce, answer)) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      answer.empty()
          ? "the KV receiver did not prove the cluster secret (its ACCEPT has no answer: it "
            "runs without cluster.secret_file); no KV sent"
          : "the KV receiver did not prove the cluster secret (wrong ACCEPT answer: another "
            "cluster secret); no KV sent");
}

}  // namespace tandem::kvtransfer
