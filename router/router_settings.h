// The router's settings: its command-line flags resolved against the
// cluster config, flag over config. Pure (no I/O, no logging), unit-tested
// (tests/router/router_settings_test.cc).
//
// Owns: which value wins and the key each value is reported under.
// Threads: pure functions.
#ifndef TANDEM_ROUTER_ROUTER_SETTINGS_H_
#define TANDEM_ROUTER_ROUTER_SETTINGS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cluster_config.h"

namespace tandem::router {

// The flags tandem-router accepts.
std::vector<std::string> RouterFlagNames();

// What the router's main runs with. Each *_key is where the value came
// from ("--listen" or "router.listen"), for start-up errors.
struct RouterSettings {
  ClusterConfig config;
  std::string name;  // --name, default router.name
  HostPort listen;   // --listen, default router.listen
  std::string listen_key;
  Advertise advertise;  // --advertise, default router.advertise
  std::string advertise_key;
  std::optional<HostPort> http_listen;  // --http-listen, default router.http_listen
  std::string http_listen_key;
  std::optional<HostPort> metrics_listen;  // --metrics-listen, default router.metrics_listen
  std::string metrics_listen_key;
  std::string model_flag;  // --model, "" for the config's model
};

// Resolves parsed `flags` against `config`. Errors name the flag or key: a
// bad --listen / --advertise / --http-listen / --metrics-listen value, or a
// wildcard listen without its advertise ("router.advertise ..." or
// "--advertise ...").
[[nodiscard]] absl::StatusOr<RouterSettings> ResolveRouterSettings(
    const std::map<std::string, std::string>& flags, ClusterConfig config);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROUTER_SETTINGS_H_
