// SHA-256, HMAC-SHA256, constant-time comparison and random nonces
// (OpenSSL 3 EVP/HMAC). gRPC-free: the KV transfer links it.
//
// Owns: nothing but these pure functions. Threads: all thread-safe
// (OpenSSL 3 needs no locking set-up).
#ifndef TANDEM_AUTH_CRYPTO_H_
#define TANDEM_AUTH_CRYPTO_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tandem::auth {

// SHA-256 of `data`: 32 raw bytes.
std::string Sha256(absl::string_view data);

// HMAC-SHA256 of `data` under `key` (any length): 32 raw bytes.
std::string HmacSha256(absl::string_view key, absl::string_view data);

// Lower-case hex of `bytes` (2 characters a byte).
std::string Hex(absl::string_view bytes);

// a == b without an early exit on the first differing byte
// (CRYPTO_memcmp); different lengths compare unequal.
bool ConstantTimeEqual(absl::string_view a, absl::string_view b);

// `bytes` random bytes from OpenSSL's CSPRNG, as lower-case hex (2 *
// bytes characters). Aborts if the CSPRNG fails (it never does on a
// seeded Linux system).
std::string RandomHex(int bytes);

}  // namespace tandem::auth

#endif  // TANDEM_AUTH_CRYPTO_H_
