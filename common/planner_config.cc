#include "common/planner_config.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config_yaml.h"

namespace tandem {

const char* PlannerModeName(PlannerMode mode) {
  switch (mode) {
    case PlannerMode::kOff:
      return "off";
    case PlannerMode::kLoad:
      return "load";
    case PlannerMode::kSlo:
      return "slo";
  }
  return "off";
}

absl::Status ParsePlanner(const YAML::Node& n, PlannerConfig* out) {
  using config_yaml::Invalid;
  constexpr char kPath[] = "planner";
  absl::Status s =
      config_yaml::CheckKeys(n, kPath,
                             {"mode", "interval_s", "cooldown_s", "min_prefill_workers",
                              "min_decode_workers", "flip_roles"});
  if (!s.ok()) return s;
  if (n["mode"].IsDefined()) {
    std::string mode;
    if (s = config_yaml::ReadString(n, "mode", kPath, &mode); !s.ok()) return s;
    bool known = false;
    for (PlannerMode m : {PlannerMode::kOff, PlannerMode::kLoad, PlannerMode::kSlo}) {
      if (mode == PlannerModeName(m)) {
        out->mode = m;
        known = true;
      }
    }
    if (!known) {
      return Invalid("planner.mode", absl::StrCat("expected off, load or slo, got '", mode, "'"),
                     n["mode"]);
    }
  }
  for (const auto& [key, field] :
       {std::pair<const char*, double*>{"interval_s", &out->interval_s},
        std::pair<const char*, double*>{"cooldown_s", &out->cooldown_s}}) {
    std::optional<double> value;
    if (s = config_yaml::ReadFiniteNumber(n, kPath, key, "a number > 0 (seconds)", &value);
        !s.ok()) {
      return s;
    }
    if (!value.has_value()) continue;
    if (*value <= 0) {
      return Invalid(config_yaml::KeyPath(kPath, key),
                     absl::StrCat("expected a number > 0 (seconds), got '", n[key].Scalar(), "'"),
                     n[key]);
    }
    *field = *value;
  }
  s = config_yaml::ReadInts(n, kPath,
                            {{"min_prefill_workers", &out->min_prefill_workers, 0, 64},
                             {"min_decode_workers", &out->min_decode_workers, 1, 64}});
  if (!s.ok()) return s;
  return config_yaml::ReadBool(n, "flip_roles", kPath, &out->flip_roles);
}

}  // namespace tandem
