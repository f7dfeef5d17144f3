// The NCCL environment `tandem up` gives its worker children (issue #16):
// the one-GPU test mode (--nccl-one-gpu-test) and kv.nccl_socket_ifname.
//
// NCCL reads its environment once per process, when the first
// communicator is made, so these are set in the child before exec; the
// worker's own code never sets them.
//
// The one-GPU test mode: NCCL refuses two ranks of one communicator on one
// GPU of one host ("Duplicate GPU detected"). Each worker child gets its
// own NCCL_HOSTID ("tandem-<worker name>"), so NCCL takes P and D for two
// hosts, and NCCL_NET=Socket, NCCL_IB_DISABLE=1, NCCL_SOCKET_IFNAME=lo, so
// the bytes go over its socket transport on the loopback interface (slow:
// a functional test, not a performance one). NCCL_HOSTID is set nowhere
// else.
//
// Owns: which variables each child gets, and when the mode is refused.
// Does not touch: processes (ProcessGroup::SpawnOptions::env carries the
// result), the config schema (common/cluster_config). Threads: pure
// functions.
#ifndef TANDEM_TOOLS_UP_NCCL_H_
#define TANDEM_TOOLS_UP_NCCL_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/cluster_config.h"

namespace tandem::cli {

// The flag that turns the mode on.
inline constexpr char kNcclOneGpuTestFlag[] = "nccl-one-gpu-test";

// What decides a worker child's NCCL environment.
struct UpNcclSettings {
  bool one_gpu_test = false;  // --nccl-one-gpu-test
  // kv.transport as written ("auto", "tcp", "nccl", "cuda_ipc").
  std::string kv_transport = "auto";
  // kv.nccl_socket_ifname: the interface NCCL's bootstrap and socket
  // transport use (e.g. "eth0"); "" = unset (NCCL picks).
  std::string socket_ifname;
};

// The settings of `config` with `one_gpu_test`: kv.transport and
// kv.nccl_socket_ifname as the config holds them. (On a branch whose
// config reader lacks those keys, the defaults: "auto" and unset; the
// merge replaces the two lines that say so.)
UpNcclSettings UpNcclSettingsFor(const ClusterConfig& config, bool one_gpu_test);

// OK unless the test mode is on for a cluster where NCCL cannot run: no
// worker on a CUDA device, or kv.transport not nccl or auto. Then
// FAILED_PRECONDITION in one line naming the flag, e.g.
// "--nccl-one-gpu-test: needs a worker on a CUDA device (every worker runs
// on cpu)" or "--nccl-one-gpu-test: needs kv.transport nccl or auto, got
// tcp".
[[nodiscard]] absl::Status CheckNcclOneGpuTest(const ClusterConfig& config,
                                               const UpNcclSettings& settings);

// The variables set in worker child `worker_name`'s environment, in this
// order (the caller adds them to what the child inherits):
//   test mode:  NCCL_HOSTID=tandem-<worker_name>, NCCL_NET=Socket,
//               NCCL_IB_DISABLE=1, NCCL_SOCKET_IFNAME=lo (lo wins over
//               kv.nccl_socket_ifname);
//   otherwise:  NCCL_SOCKET_IFNAME=<kv.nccl_socket_ifname> when it is set;
//               nothing else.
// The router gets none of them (it runs no NCCL).
std::vector<std::pair<std::string, std::string>> WorkerNcclEnv(const UpNcclSettings& settings,
                                                               const std::string& worker_name);

}  // namespace tandem::cli

#endif  // TANDEM_TOOLS_UP_NCCL_H_
