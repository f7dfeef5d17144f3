// The YAML reading helpers of the cluster config's parsers
// (common/cluster_config.cc, common/planner_config.cc): key checks and
// typed reads whose errors name the full key path and the line ("engine.
// block_size: must be in [1, 2147483647], got 0 (line 3, column 16)").
//
// Owns: nothing (pure functions). Internal to common/: callers are the
// config parsers, which run every call inside ParseClusterConfig's
// try-block (yaml-cpp throws on bad conversions).
#ifndef TANDEM_COMMON_CONFIG_YAML_H_
#define TANDEM_COMMON_CONFIG_YAML_H_

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/host_port.h"
#include "engine/backend/device.h"

namespace tandem::config_yaml {

// "path.key" ("key" at the top level).
inline std::string KeyPath(const std::string& path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

// 1-based position of a node, for messages.
inline std::string Where(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return "";
  return absl::StrCat(" (line ", mark.line + 1, ", column ", mark.column + 1, ")");
}

[[nodiscard]] inline absl::Status Invalid(const std::string& path, absl::string_view what,
                                          const YAML::Node& node) {
  return absl::InvalidArgumentError(
      absl::StrCat(path.empty() ? "cluster config" : path, ": ", what, Where(node)));
}

// Checks that `node` is a mapping whose keys are unique and all in `known`.
[[nodiscard]] inline absl::Status CheckKeys(const YAML::Node& node, const std::string& path,
                                            std::initializer_list<absl::string_view> known) {
  if (!node.IsMap()) return Invalid(path, "expected a mapping", node);
  std::set<std::string> seen;
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) return Invalid(path, "keys must be plain strings", entry.first);
    const std::string& key = entry.first.Scalar();
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown key '", KeyPath(path, key), "'",
                                                     Where(entry.first),
                                                     "; known keys: ", absl::StrJoin(known, ", ")));
    }
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate key '", KeyPath(path, key), "'", Where(entry.first)));
    }
  }
  return absl::OkStatus();
}

// Reads map[key] as a string into *out when present; null leaves *out as is.
// A key written with nothing after it ("key:"): refused rather than
// silently taking the default.
constexpr char kNoValue[] = "has no value (remove the key to use the default)";

[[nodiscard]] inline absl::Status ReadString(const YAML::Node& map, absl::string_view key,
                                             const std::string& path, std::string* out) {
  const YAML::Node node = map[std::string(key)];
  if (!node.IsDefined()) return absl::OkStatus();
  if (node.IsNull()) return Invalid(KeyPath(path, key), kNoValue, node);
  if (!node.IsScalar()) return Invalid(KeyPath(path, key), "expected a string", node);
  *out = node.Scalar();
  return absl::OkStatus();
}

// Reads map[key], when present, into *out: true or false.
[[nodiscard]] inline absl::Status ReadBool(const YAML::Node& map, absl::string_view key,
                                           const std::string& path, bool* out) {
  std::string text = *out ? "true" : "false";
  if (absl::Status s = ReadString(map, key, path, &text); !s.ok()) return s;
  if (text != "true" && text != "false") {
    return Invalid(KeyPath(path, key), "expected true or false", map[std::string(key)]);
  }
  *out = text == "true";
  return absl::OkStatus();
}

// Reads map[key] ("cpu" or "cuda:N"), when present, into *out.
[[nodiscard]] inline absl::Status ReadDevice(const YAML::Node& map, absl::string_view key,
                                             const std::string& path,
                                             std::optional<backend::DeviceSpec>* out) {
  const YAML::Node node = map[std::string(key)];
  if (!node.IsDefined()) return absl::OkStatus();
  std::string text;
  if (absl::Status s = ReadString(map, key, path, &text); !s.ok()) return s;
  const std::string field = KeyPath(path, key);
  absl::StatusOr<backend::DeviceSpec> device = backend::ParseDevice(text, field);
  if (!device.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(device.status().message(), Where(node)));
  }
  *out = *device;
  return absl::OkStatus();
}

// An int32 field with its inclusive bounds.
struct IntField {
  absl::string_view key;
  int32_t* out;
  int32_t min;
  int32_t max = INT32_MAX;
};

// Reads map[key], when present, into *out: an integer in [min, max].
template <typename T>
[[nodiscard]] absl::Status ReadInt(const YAML::Node& map, const std::string& path,
                                   absl::string_view key, T* out, int64_t min, int64_t max) {
  const YAML::Node node = map[std::string(key)];
  if (!node.IsDefined()) return absl::OkStatus();
  const std::string field = KeyPath(path, key);
  if (node.IsNull()) return Invalid(field, kNoValue, node);
  int64_t value = 0;
  if (!node.IsScalar() || !absl::SimpleAtoi(node.Scalar(), &value)) {
    return Invalid(field,
                   absl::StrCat("expected an integer, got '",
                                node.IsScalar() ? node.Scalar() : "<non-scalar>", "'"),
                   node);
  }
  if (value < min || value > max) {
    return Invalid(field, absl::StrCat("must be in [", min, ", ", max, "], got ", value), node);
  }
  *out = static_cast<T>(value);
  return absl::OkStatus();
}

// Reads each present field of `fields` from map, checking type and range.
[[nodiscard]] inline absl::Status ReadInts(const YAML::Node& map, const std::string& path,
                                           std::initializer_list<IntField> fields) {
  for (const IntField& f : fields) {
    if (absl::Status s = ReadInt(map, path, f.key, f.out, f.min, f.max); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Reads map[key] ("host" or "host:port") into *out when present.
[[nodiscard]] inline absl::Status ReadAdvertise(const YAML::Node& map, absl::string_view key,
                                                const std::string& path, Advertise* out) {
  std::string text;
  const YAML::Node node = map[std::string(key)];
  if (!node.IsDefined()) return absl::OkStatus();
  if (absl::Status s = ReadString(map, key, path, &text); !s.ok()) return s;
  absl::StatusOr<Advertise> parsed = ParseAdvertise(text, KeyPath(path, key));
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(parsed.status().message(), Where(node)));
  }
  *out = *parsed;
  return absl::OkStatus();
}

// Reads map[key] ("host:port") into *out when present.
[[nodiscard]] inline absl::Status ReadHostPort(const YAML::Node& map, absl::string_view key,
                                               const std::string& path, HostPort* out) {
  std::string text;
  const YAML::Node node = map[std::string(key)];
  if (!node.IsDefined()) return absl::OkStatus();
  if (absl::Status s = ReadString(map, key, path, &text); !s.ok()) return s;
  absl::StatusOr<HostPort> parsed = ParseHostPort(text, KeyPath(path, key));
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(parsed.status().message(), Where(node)));
  }
  *out = *parsed;
  return absl::OkStatus();
}

// Reads map[key] ("host:port") into *out when present; absent: *out
// untouched (nullopt for a listener that is off by default).
[[nodiscard]] inline absl::Status ReadOptionalHostPort(const YAML::Node& map, absl::string_view key,
                                                       const std::string& path,
                                                       std::optional<HostPort>* out) {
  if (!map[std::string(key)].IsDefined()) return absl::OkStatus();
  HostPort value;
  if (absl::Status s = ReadHostPort(map, key, path, &value); !s.ok()) return s;
  *out = value;
  return absl::OkStatus();
}

// Reads map[key], when present, into *out: a finite number (integer or
// decimal; nan and inf are refused). Absent: *out untouched. Not a number:
// "<path.key>: expected <expected>, got '<text>'".
[[nodiscard]] inline absl::Status ReadFiniteNumber(const YAML::Node& map, const std::string& path,
                                                   absl::string_view key,
                                                   absl::string_view expected,
                                                   std::optional<double>* out) {
  const YAML::Node node = map[std::string(key)];
  if (!node.IsDefined()) return absl::OkStatus();
  const std::string field = KeyPath(path, key);
  if (node.IsNull()) return Invalid(field, kNoValue, node);
  double value = 0;
  if (!node.IsScalar() || !absl::SimpleAtod(node.Scalar(), &value) || !std::isfinite(value)) {
    return Invalid(field,
                   absl::StrCat("expected ", expected, ", got '",
                                node.IsScalar() ? node.Scalar() : "<non-scalar>", "'"),
                   node);
  }
  *out = value;
  return absl::OkStatus();
}

// Reads map[key], when present, into *out: a finite number >= 0.
[[nodiscard]] inline absl::Status ReadWeight(const YAML::Node& map, const std::string& path,
                                             absl::string_view key, double* out) {
  std::optional<double> value;
  if (absl::Status s = ReadFiniteNumber(map, path, key, "a number", &value); !s.ok()) return s;
  if (!value.has_value()) return absl::OkStatus();
  if (*value < 0) {
    const YAML::Node node = map[std::string(key)];
    return Invalid(KeyPath(path, key), absl::StrCat("must be >= 0, got ", node.Scalar()), node);
  }
  *out = *value;
  return absl::OkStatus();
}

}  // namespace tandem::config_yaml

#endif  // TANDEM_COMMON_CONFIG_YAML_H_
