// A worker's settings: its command-line flags resolved against the cluster
// config, flag over config. Pure (no I/O, no logging), so every rule is
// unit-tested (tests/worker/worker_settings_test.cc).
//
// Owns: which value wins and the messages that name a bad or missing key.
// Threads: pure functions.
#ifndef TANDEM_WORKER_WORKER_SETTINGS_H_
#define TANDEM_WORKER_WORKER_SETTINGS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cluster_config.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

// The flags every worker accepts, whatever its role (each role's tests-only
// flags are added by it: WorkerRoleSpec::extra_flags).
std::vector<std::string> WorkerFlagNames();

// What RunWorkerMain runs with.
struct WorkerSettings {
  v1::WorkerRole role = v1::ROLE_UNSPECIFIED;
  std::string config_path;  // --config, default kDefaultConfigPath
  // The config with --gpu-memory-fraction applied to engine.gpu_memory_fraction.
  ClusterConfig config;
  std::string name;        // --name: registered with the router and logged
  std::string entry_name;  // --config-entry, default --name
  // The entry's settings with --advertise, --kv-advertise and
  // --metrics-listen applied (a decode worker's kv_advertise takes the
  // advertise host when it has none of its own).
  WorkerConfig worker;
  std::string key_prefix;                    // "decode_workers[ENTRY]." for messages
  std::string router;                        // --router, default router.listen
  std::string model_flag;                    // --model, "" for the config's model
  std::map<std::string, std::string> flags;  // every flag given
};

// The list of `role`'s entries in a config: "prefill_workers" or
// "decode_workers".
const char* WorkerListName(v1::WorkerRole role);

// Resolves `flags` (parsed) against `config` (read from `config_path`).
// Errors name the flag or key: "--name is required", "--config-entry X: no
// such entry in decode_workers of PATH" (or "--name X: ..."), "--router:
// port 0 cannot be dialled ...", a bad --advertise / --kv-advertise /
// --metrics-listen / --gpu-memory-fraction value, and a wildcard listen
// without its advertise ("decode_workers[d].advertise ...").
[[nodiscard]] absl::StatusOr<WorkerSettings> ResolveWorkerSettings(
    v1::WorkerRole role, std::map<std::string, std::string> flags, ClusterConfig config,
    const std::string& config_path);

}  // namespace tandem

#endif  // TANDEM_WORKER_WORKER_SETTINGS_H_
