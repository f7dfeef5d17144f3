// The cluster `tandem up --prefill-workers N --decode-workers M` runs: the
// config file's text with its worker lists resized.
//
// Owns: rewriting the two worker lists of a cluster YAML, and its listen
// ports (--ephemeral-ports; one table of every listen key). Does not touch:
// the schema or its validation (common/cluster_config: the caller parses the
// result with ParseClusterConfig), files, processes. Threads: pure functions.
#ifndef TANDEM_TOOLS_UP_CLUSTER_H_
#define TANDEM_TOOLS_UP_CLUSTER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cluster_config.h"

namespace tandem::cli {

// The largest --prefill-workers / --decode-workers `tandem up` accepts:
// every worker is a process that loads the whole model.
inline constexpr int kMaxWorkersPerRole = 64;

// Returns `yaml_text` (a cluster config, e.g. deploy/local/cluster.yaml)
// with `prefill_workers` resized to `prefill` entries and `decode_workers`
// to `decode` entries; a role whose count is nullopt keeps its list as
// written. Every other key is copied as it is (comments are dropped).
//
// Entry i of a resized role is named "<role>-i" (prefill-0, prefill-1, ...;
// decode-0, ...), the name `tandem up` passes as --name. Its other keys:
//   * i < the number of listed entries: those of listed entry i (its
//     listen/kv_listen ports and advertise addresses as written);
//   * beyond the listed entries: those of the last listed entry with every
//     port made 0 (ephemeral; workers register the port they bound), i.e.
//     listen, kv_listen and metrics_listen "host:0" (a worker logs the
//     metrics port it bound), advertise and kv_advertise the bare
//     host (its port follows the bound one). A role with no listed entry
//     takes the hosts of the other role's first entry (decode_workers
//     always has one once valid).
// Errors: INVALID_ARGUMENT for YAML that does not parse or whose worker
// lists are not lists of maps (the caller's ParseClusterConfig of the
// original reports these better: call it first), or a count outside
// [0, kMaxWorkersPerRole] (decode: [1, ...]).
[[nodiscard]] absl::StatusOr<std::string> ResizeWorkerLists(const std::string& yaml_text,
                                                            std::optional<int> prefill,
                                                            std::optional<int> decode);

// Returns `yaml_text` (a cluster config) for `tandem up --ephemeral-ports`:
// every listen address whose port is not 0 binds port 0 instead
// (router.listen, written out as 127.0.0.1:0 when absent since its default
// is 127.0.0.1:50051; router.http_listen; each worker's listen, kv_listen
// and metrics_listen), and the advertise address of such a listener
// (advertise, kv_advertise) loses its port, which then follows the bound
// one. Listeners already on port 0 and their advertise addresses stay as
// written; every other key is copied (comments are dropped). So a second
// cluster from one config binds nothing the first holds. Errors:
// INVALID_ARGUMENT for YAML that does not parse or whose router is not a
// map or worker lists not lists of maps (ParseClusterConfig of the
// original, called first, names these better).
[[nodiscard]] absl::StatusOr<std::string> EphemeralPorts(const std::string& yaml_text);

// A GPU that several workers of a cluster resolve to (their entry's
// `device:`, else engine.device), and the share of its memory each gets.
struct GpuShare {
  std::string device;                // "cuda:0"
  std::vector<std::string> workers;  // prefill workers first, then decode, in config order
  // engine.gpu_memory_fraction / workers.size() (backend::
  // SplitGpuMemoryFraction): what `tandem up` passes each of them as
  // --gpu-memory-fraction.
  double fraction = 0;
};

// Every GPU two or more workers of `config` share, by device index (a GPU
// with one worker keeps engine.gpu_memory_fraction and is not listed).
std::vector<GpuShare> SplitGpuMemory(const ClusterConfig& config);

// The line `tandem up` prints per shared GPU, e.g. "GPU cuda:0: 2 workers
// (prefill-0, decode-0), engine.gpu_memory_fraction 0.9 split as 0.45
// each" (both numbers as GpuShareFlagValue writes them); `configured` is
// engine.gpu_memory_fraction.
std::string FormatGpuShare(const GpuShare& share, double configured);

// The --gpu-memory-fraction value of a share: `fraction` rounded down to
// six significant digits ("0.45", "0.225", "0.166666", "5e-05"), so n
// shares never add up to more than the configured fraction and a tiny
// share is never 0.
std::string GpuShareFlagValue(double fraction);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_UP_CLUSTER_H_
