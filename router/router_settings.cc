#include "router/router_settings.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/server/flags.h"

namespace tandem::router {
namespace {

// --`flag` as a HOST:PORT over `*value` (from `config_key`); *key says
// which one was used.
[[nodiscard]] absl::Status OverrideHostPort(const std::map<std::string, std::string>& flags,
                                            const std::string& flag, const std::string& config_key,
                                            std::optional<HostPort>* value, std::string* key) {
  *key = config_key;
  auto it = flags.find(flag);
  if (it == flags.end()) return absl::OkStatus();
  *key = "--" + flag;
  auto parsed = ParseHostPort(it->second, *key);
  if (!parsed.ok()) return parsed.status();
  *value = *parsed;
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> RouterFlagNames() {
  return {"config", "name", "model", "listen", "advertise", "http-listen", "metrics-listen"};
}

absl::StatusOr<RouterSettings> ResolveRouterSettings(
    const std::map<std::string, std::string>& flags, ClusterConfig config) {
  RouterSettings s;
  s.config = std::move(config);
  std::optional<HostPort> listen = s.config.router.listen;
  if (absl::Status st = OverrideHostPort(flags, "listen", "router.listen", &listen, &s.listen_key);
      !st.ok()) {
    return st;
  }
  s.listen = *listen;
  s.advertise = s.config.router.advertise;
  s.advertise_key = "router.advertise";
  if (auto it = flags.find("advertise"); it != flags.end()) {
    auto parsed = ParseAdvertise(it->second, "--advertise");
    if (!parsed.ok()) return parsed.status();
    s.advertise = *parsed;
    s.advertise_key = "--advertise";
  }
  if (auto a = AdvertisedAddress(s.listen, 0, s.advertise, s.listen_key, s.advertise_key);
      !a.ok()) {
    return a.status();
  }
  s.http_listen = s.config.router.http_listen;
  if (absl::Status st = OverrideHostPort(flags, "http-listen", "router.http_listen", &s.http_listen,
                                         &s.http_listen_key);
      !st.ok()) {
    return st;
  }
  s.metrics_listen = s.config.router.metrics_listen;
  if (absl::Status st = OverrideHostPort(flags, "metrics-listen", "router.metrics_listen",
                                         &s.metrics_listen, &s.metrics_listen_key);
      !st.ok()) {
    return st;
  }
  s.name = FlagOr(flags, "name", s.config.router.name);
  s.model_flag = FlagOr(flags, "model", "");
  return s;
}

}  // namespace tandem::router
