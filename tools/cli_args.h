// Command-line parsing for the tandem CLI's subcommands.
//
// Each subcommand has its own small flag set, so the CLI parses by hand
// instead of through absl flags (whose flags are process-global). Accepted
// forms: "--name value", "--name=value", boolean "--name"; "--" ends the
// flags; every other argument is positional. A flag may be given once
// unless its spec says it is repeatable. Errors are INVALID_ARGUMENT naming
// the flag; the CLI prints them and exits 2.
#ifndef TANDEM_TOOLS_CLI_ARGS_H_
#define TANDEM_TOOLS_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cli {

// One accepted flag: "--<name>"; `takes_value` false for booleans;
// `repeatable` true for a flag that may be given several times (its values
// are kept in order, see ParsedArgs::GetAll).
struct FlagSpec {
  std::string name;
  bool takes_value = true;
  bool repeatable = false;
};

// The result of parsing one subcommand's arguments.
class ParsedArgs {
 public:
  // True when the flag appeared (a boolean flag or one with a value).
  bool Has(const std::string& name) const { return flags_.count(name) > 0; }
  // The flag's value (the last one of a repeatable flag), or `fallback`
  // when absent.
  std::string GetString(const std::string& name, const std::string& fallback) const;
  // Every value of the flag in command-line order; empty when absent.
  std::vector<std::string> GetAll(const std::string& name) const;
  // Typed values (of the last occurrence); INVALID_ARGUMENT "--<name>:
  // expected ..." on a bad value.
  [[nodiscard]] absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  [[nodiscard]] absl::StatusOr<uint64_t> GetUint(const std::string& name, uint64_t fallback) const;
  [[nodiscard]] absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;

  const std::vector<std::string>& positional() const { return positional_; }

 private:
  friend absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>&,
                                              const std::vector<FlagSpec>&);
  // name -> values in order ("" for booleans); one value unless repeatable.
  std::map<std::string, std::vector<std::string>> flags_;
  std::vector<std::string> positional_;
};

// One flag value as a number, for values the getters do not reach (each
// value of a repeatable flag, part of a value): INVALID_ARGUMENT
// "--<name>: expected an integer, got '<text>'" (resp. "a finite number").
// --router H:P (CheckRouterAddress; default *router as given) and
// --api-key KEY (not empty; else $TANDEM_API_KEY, ResolveApiKey) of a
// command that calls the router, into *router and *api_key. Errors:
// INVALID_ARGUMENT naming the flag (or the variable).
[[nodiscard]] absl::Status ReadRouterFlags(const ParsedArgs& parsed, std::string* router,
                                           std::string* api_key);
// --timeout-ms MS, > 0 (default `fallback`). INVALID_ARGUMENT naming it.
[[nodiscard]] absl::StatusOr<int64_t> ReadTimeoutMs(const ParsedArgs& parsed, int64_t fallback);

[[nodiscard]] absl::StatusOr<int64_t> ParseIntValue(const std::string& name,
                                                    const std::string& text);
[[nodiscard]] absl::StatusOr<double> ParseDoubleValue(const std::string& name,
                                                      const std::string& text);

// Parses `args` (the arguments after the subcommand name) against `spec`.
// Errors: unknown flag, missing value, value given to a boolean, a flag
// that is not repeatable given twice.
[[nodiscard]] absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                                   const std::vector<FlagSpec>& spec);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_CLI_ARGS_H_
