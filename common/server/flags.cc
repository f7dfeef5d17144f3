#include "common/server/flags.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::map<std::string, std::string>> ParseFlags(
    int argc, char** argv, const std::vector<std::string>& allowed) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string key = arg.substr(2), value;
    size_t eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag --", key, " needs a value"));
    }
    bool known = false;
    for (const std::string& a : allowed) known |= a == key;
    if (!known) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", key));
    flags[key] = value;
  }
  return flags;
}

bool HelpRequested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-help" || arg == "-h") return true;
  }
  return false;
}

std::string FlagOr(const std::map<std::string, std::string>& flags, const std::string& key,
                   const std::string& fallback) {
  auto it = flags.find(key);
  return it != flags.end() ? it->second : fallback;
}

}  // namespace tandem
