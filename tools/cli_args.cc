#include "tools/cli_args.h"

#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/router_client.h"

namespace tandem::cli {

std::string ParsedArgs::GetString(const std::string& name, const std::string& fallback) const {
  auto it = flags_.find(name);
  return it == flags_.end() ? fallback : it->second.back();
}

std::vector<std::string> ParsedArgs::GetAll(const std::string& name) const {
  auto it = flags_.find(name);
  return it == flags_.end() ? std::vector<std::string>() : it->second;
}

absl::StatusOr<int64_t> ParseIntValue(const std::string& name, const std::string& text) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": expected an integer, got '", text, "'"));
  }
  return value;
}

absl::StatusOr<double> ParseDoubleValue(const std::string& name, const std::string& text) {
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": expected a finite number, got '", text, "'"));
  }
  return value;
}

absl::StatusOr<int64_t> ParsedArgs::GetInt(const std::string& name, int64_t fallback) const {
  auto it = flags_.find(name);
  if (it == flags_.end()) return fallback;
  return ParseIntValue(name, it->second.back());
}

absl::StatusOr<uint64_t> ParsedArgs::GetUint(const std::string& name, uint64_t fallback) const {
  auto it = flags_.find(name);
  if (it == flags_.end()) return fallback;
  const std::string& text = it->second.back();
  uint64_t value = 0;
  // SimpleAtoi accepts a leading '-' for unsigned types on some versions.
  if (text.empty() || text[0] == '-' || !absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": expected an unsigned integer, got '", text, "'"));
  }
  return value;
}

absl::StatusOr<double> ParsedArgs::GetDouble(const std::string& name, double fallback) const {
  auto it = flags_.find(name);
  if (it == flags_.end()) return fallback;
  return ParseDoubleValue(name, it->second.back());
}

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const std::vector<FlagSpec>& spec) {
  ParsedArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      out.positional_.insert(out.positional_.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      out.positional_.push_back(arg);  // includes "-" and negative numbers
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const FlagSpec* flag = nullptr;
    for (const FlagSpec& f : spec) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) {
      std::vector<std::string> known;
      for (const FlagSpec& f : spec) known.push_back("--" + f.name);
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (known: ", absl::StrJoin(known, " "), ")"));
    }
    if (!flag->repeatable && out.flags_.count(name) > 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": given more than once"));
    }
    std::string value;
    if (!flag->takes_value) {
      if (eq != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": takes no value"));
      }
    } else if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
    }
    out.flags_[name].push_back(std::move(value));
  }
  return out;
}

absl::Status ReadRouterFlags(const ParsedArgs& parsed, std::string* router, std::string* api_key) {
  *router = parsed.GetString("router", *router);
  if (absl::Status s = CheckRouterAddress(*router); !s.ok()) return s;
  if (parsed.Has("api-key") && parsed.GetString("api-key", "").empty()) {
    return absl::InvalidArgumentError("--api-key: must not be empty");
  }
  absl::StatusOr<std::string> key = ResolveApiKey(parsed.GetString("api-key", ""));
  if (!key.ok()) return key.status();
  *api_key = *key;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ReadTimeoutMs(const ParsedArgs& parsed, int64_t fallback) {
  absl::StatusOr<int64_t> timeout_ms = parsed.GetInt("timeout-ms", fallback);
  if (!timeout_ms.ok()) return timeout_ms.status();
  if (*timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--timeout-ms: must be > 0, got ", *timeout_ms));
  }
  return timeout_ms;
}

}  // namespace tandem::cli
