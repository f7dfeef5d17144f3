// The KV HELLO's authentication with the cluster secret
// (auth/cluster_auth.h; docs/architecture.md, "Trust: the cluster
// secret (HMAC)"). With a secret:
//   P -> D  HELLO + credential: ts, nonce and
//           HMAC("kv/HELLO", SHA-256 of the HELLO's other fields, ts, nonce)
//   D       verifies it (clock skew, HMAC, replay) before the HELLO may
//           touch any transfer; a failure is REJECT UNAUTHENTICATED naming
//           the reason
//   D -> P  ACCEPT + answer: HMAC("kv/ACCEPT", P's nonce)
//   P       sends no KV unless the answer is right (UNAUTHENTICATED: the
//           receiver does not hold the secret)
// Open cluster (auth nullptr or open): no credential, empty ACCEPT; an open
// D accepts (and ignores) a credential, an open P an answer. KV payload
// frames are authenticated by their connection only, never encrypted.
//
// Owns: nothing (pure functions over the auth object). Threads: any.
#ifndef TANDEM_KVTRANSFER_HELLO_AUTH_H_
#define TANDEM_KVTRANSFER_HELLO_AUTH_H_

#include <string>

#include "absl/status/status.h"
#include "auth/cluster_auth.h"
#include "kvtransfer/wire.h"

namespace tandem::kvtransfer {

inline constexpr char kHelloPurpose[] = "kv/HELLO";
inline constexpr char kAcceptPurpose[] = "kv/ACCEPT";

// P: adds the credential to `hello` (all its other fields final). No-op
// when `auth` is nullptr or open.
void SignHello(const auth::ClusterAuth* auth, wire::Hello* hello);

// D: checks `hello`'s credential. OK when `auth` is nullptr or open.
// UNAUTHENTICATED "missing credential ..." / "clock skew ..." / "bad
// signature ..." / "replayed nonce ..." (ClusterAuth::Verify).
[[nodiscard]] absl::Status VerifyHello(const auth::ClusterAuth* auth, const wire::Hello& hello);

// D: the ACCEPT answer for an accepted `hello` ("" when open).
std::string AcceptAnswer(const auth::ClusterAuth* auth, const wire::Hello& hello);

// P: checks D's ACCEPT `answer` to the `hello` it sent. OK when `auth` is
// nullptr or open. UNAUTHENTICATED "the KV receiver did not prove the
// cluster secret ..." otherwise.
[[nodiscard]] absl::Status CheckAcceptAnswer(const auth::ClusterAuth* auth,
                                             const wire::Hello& hello, const std::string& answer);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_HELLO_AUTH_H_
