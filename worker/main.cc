// tandem-worker --role prefill|decode: one worker binary; it hosts both
// roles (prefill_worker/, decode_worker/) on one engine core and --role is
// the one it serves first (worker_main.h; `tandem role` changes it). --role may stand anywhere on the line, as
// "--role R" or "--role=R"; every other flag is the runtime's.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "worker/all_roles.h"

namespace {

// Removes --role's value from `args` (argv[0] first) into *role. Returns
// an error line when --role has no value or is given more than once, ""
// otherwise (no --role leaves *role empty).
std::string TakeRole(std::vector<char*>* args, std::string* role) {
  bool found = false;
  for (size_t i = 1; i < args->size();) {
    const std::string arg = (*args)[i];
    size_t taken = 0;
    if (arg.rfind("--role=", 0) == 0) {
      *role = arg.substr(7);
      taken = 1;
    } else if (arg == "--role") {
      if (i + 1 >= args->size()) return "flag --role needs a value";
      *role = (*args)[i + 1];
      taken = 2;
    }
    if (taken == 0) {
      ++i;
      continue;
    }
    if (found) return "flag --role given more than once";
    found = true;
    args->erase(args->begin() + i, args->begin() + i + taken);
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  std::string role;
  if (const std::string error = TakeRole(&args, &role); !error.empty()) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  const int n = static_cast<int>(args.size());
  if (role == "prefill") {
    return tandem::RunWorkerBinary(n, args.data(), tandem::v1::ROLE_PREFILL,
                                   "tandem-worker --role prefill");
  }
  if (role == "decode") {
    return tandem::RunWorkerBinary(n, args.data(), tandem::v1::ROLE_DECODE,
                                   "tandem-worker --role decode");
  }
  if (role.empty() && tandem::HelpRequested(n, args.data())) {
    std::printf(
        "usage: tandem-worker --role prefill|decode --name NAME [flags]\n"
        "Serves one worker of a Tandem cluster in the given role; see\n"
        "`tandem-worker --role prefill --help` and `--role decode --help` for the flags.\n");
    return 0;
  }
  if (role.empty()) {
    std::fprintf(stderr, "--role is required: prefill or decode\n");
  } else {
    std::fprintf(stderr, "--role: expected prefill or decode, got '%s'\n", role.c_str());
  }
  return 1;
}
