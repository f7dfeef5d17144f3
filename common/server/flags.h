// The command line of the server binaries (router, workers): "--key value"
// or "--key=value" pairs, and --help.
#ifndef TANDEM_COMMON_SERVER_FLAGS_H_
#define TANDEM_COMMON_SERVER_FLAGS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

// Parsed command line: "--key value" or "--key=value" pairs. Keys not in
// `allowed` are INVALID_ARGUMENT naming the flag.
[[nodiscard]] absl::StatusOr<std::map<std::string, std::string>> ParseFlags(
    int argc, char** argv, const std::vector<std::string>& allowed);

// True when an argument is --help, -help or -h: the caller then prints its
// usage to stdout and exits 0 (nothing else on the line is parsed).
bool HelpRequested(int argc, char** argv);

// The value of --`key` in `flags`, or `fallback` when it is absent.
std::string FlagOr(const std::map<std::string, std::string>& flags, const std::string& key,
                   const std::string& fallback);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVER_FLAGS_H_
