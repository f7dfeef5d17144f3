// Listen and advertise addresses of the cluster config and the servers'
// flags: "host:port" (HostPort), what peers dial (Advertise), and the
// address a listener is reached at (AdvertisedAddress).
//
// Owns: these parsers. Does not touch: sockets (nothing binds here).
// Threads: pure functions.
#ifndef TANDEM_COMMON_HOST_PORT_H_
#define TANDEM_COMMON_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"

namespace tandem {

struct HostPort {
  std::string host = "127.0.0.1";
  int port = 0;                  // 0 = ephemeral
  std::string ToString() const;  // "host:port"
};
// Parses "host:port" (port 0..65535). INVALID_ARGUMENT naming `field`.
[[nodiscard]] absl::StatusOr<HostPort> ParseHostPort(const std::string& text,
                                                     const std::string& field);

// True for the hosts that bind every interface and that no peer can dial:
// "0.0.0.0", "::" and "" (gRPC's "[::]:port" parses to "::").
bool IsWildcardHost(const std::string& host);

// The address peers dial for one listener (config key `advertise` /
// `kv_advertise`, flag --advertise / --kv-advertise; Kubernetes passes the
// pod IP): a host, or host:port. port 0 (or none) means the port the
// listener bound. Empty host: not set.
struct Advertise {
  std::string host;
  int port = 0;
  bool empty() const { return host.empty(); }
};
// Parses "host", "host:port", "[v6]" or "[v6]:port" (port 0..65535).
// INVALID_ARGUMENT naming `field` for a malformed value or a wildcard host
// (which no peer can dial).
[[nodiscard]] absl::StatusOr<Advertise> ParseAdvertise(const std::string& text,
                                                       const std::string& field);

// Where peers reach a listener bound to `listen` whose actual port is
// `bound_port`: advertise's host (and its port, when not 0) if set, else
// listen.host with bound_port. INVALID_ARGUMENT when listen.host is a
// wildcard and advertise is not set: "<listen_key>: binds the wildcard
// address 0.0.0.0, which other hosts cannot dial; set <advertise_key> (or
// --advertise) to the address they should use".
[[nodiscard]] absl::StatusOr<HostPort> AdvertisedAddress(const HostPort& listen, int bound_port,
                                                         const Advertise& advertise,
                                                         const std::string& listen_key,
                                                         const std::string& advertise_key);

}  // namespace tandem

#endif  // TANDEM_COMMON_HOST_PORT_H_
