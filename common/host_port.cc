#include "common/host_port.h"

#include <algorithm>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tandem {

std::string HostPort::ToString() const {
  // IPv6 literals are bracketed so the result parses back (and gRPC reads it).
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& text, const std::string& field) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected host:port, got '", text, "' (", why, ")"));
  };
  HostPort out;
  absl::string_view port_text;
  if (!text.empty() && text[0] == '[') {  // "[v6-literal]:port"
    size_t close = text.find(']');
    if (close == std::string::npos) return bad("missing ']'");
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("missing ':port'");
    out.host = text.substr(1, close - 1);
    port_text = absl::string_view(text).substr(close + 2);
  } else {
    if (absl::StrContains(text, "://")) return bad("no scheme such as http://");
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) return bad("missing ':port'");
    out.host = text.substr(0, colon);
    if (out.host.find(':') != std::string::npos) return bad("IPv6 hosts need [brackets]");
    port_text = absl::string_view(text).substr(colon + 1);
    // A DNS name (RFC 1123 letters, digits, '-', '.'; '_' tolerated) or an
    // IPv4 literal. "$(POD_IP)" is what Kubernetes passes when the pod
    // does not define the variable.
    const bool name_chars = std::all_of(out.host.begin(), out.host.end(), [](char c) {
      return absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_';
    });
    if (!name_chars) {
      return bad(absl::StrContains(out.host, "$(")
                     ? "an unexpanded $(VAR): the pod must define that environment variable"
                     : "the host is no DNS name or IP address");
    }
  }
  if (out.host.empty()) return bad("empty host");
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(), absl::ascii_isdigit)) {
    return bad("port must be a number in 0..65535");
  }
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return bad("port must be a number in 0..65535");
  }
  out.port = port;
  return out;
}

bool IsWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::";
}

absl::StatusOr<Advertise> ParseAdvertise(const std::string& text, const std::string& field) {
  Advertise out;
  // A bare host (no port, or an IPv6 literal without brackets is refused by
  // ParseHostPort below) gets ":0" so one parser reads both forms.
  const bool bracketed = !text.empty() && text[0] == '[';
  const bool has_port =
      bracketed ? text.find("]:") != std::string::npos : text.find(':') != std::string::npos;
  absl::StatusOr<HostPort> parsed = ParseHostPort(has_port ? text : text + ":0", field);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected host or host:port, got '", text, "'",
                     absl::StrContains(text, "$(")
                         ? " (an unexpanded $(VAR): the pod must define that environment variable)"
                         : ""));
  }
  if (IsWildcardHost(parsed->host)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", text, "' is a wildcard address; give one other hosts can dial"));
  }
  out.host = parsed->host;
  out.port = parsed->port;
  return out;
}

absl::StatusOr<HostPort> AdvertisedAddress(const HostPort& listen, int bound_port,
                                           const Advertise& advertise,
                                           const std::string& listen_key,
                                           const std::string& advertise_key) {
  if (advertise.empty()) {
    if (IsWildcardHost(listen.host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          listen_key, ": binds the wildcard address ", listen.host.empty() ? "''" : listen.host,
          ", which other hosts cannot dial; set ", advertise_key,
          " (or --advertise) to the address they should use"));
    }
    return HostPort{listen.host, bound_port};
  }
  return HostPort{advertise.host, advertise.port != 0 ? advertise.port : bound_port};
}

}  // namespace tandem
