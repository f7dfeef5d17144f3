#include "tools/up_nccl.h"

#include "absl/strings/str_cat.h"

namespace tandem::cli {

UpNcclSettings UpNcclSettingsFor(const ClusterConfig& config, bool one_gpu_test) {
  UpNcclSettings s;
  s.one_gpu_test = one_gpu_test;
  s.kv_transport = config.kv.transport.automatic
                       ? std::string("auto")
                       : std::string(kvtransfer::KvTransportName(config.kv.transport.fixed));
  s.socket_ifname = config.kv.nccl_socket_ifname;
  return s;
}

absl::Status CheckNcclOneGpuTest(const ClusterConfig& config, const UpNcclSettings& settings) {
  if (!settings.one_gpu_test) return absl::OkStatus();
  bool cuda = false;
  for (const auto* list : {&config.prefill_workers, &config.decode_workers}) {
    for (const WorkerConfig& w : *list) cuda = cuda || config.WorkerDevice(w).is_cuda();
  }
  if (!cuda) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--", kNcclOneGpuTestFlag, ": needs a worker on a CUDA device (every worker runs on cpu)"));
  }
  if (settings.kv_transport != "nccl" && settings.kv_transport != "auto") {
    return absl::FailedPreconditionError(absl::StrCat("--", kNcclOneGpuTestFlag,
                                                      ": needs kv.transport nccl or auto, got ",
                                                      settings.kv_transport));
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::string>> WorkerNcclEnv(const UpNcclSettings& settings,
                                                               const std::string& worker_name) {
  if (settings.one_gpu_test) {
    return {{"NCCL_HOSTID", absl::StrCat("tandem-", worker_name)},
            {"NCCL_NET", "Socket"},
            {"NCCL_IB_DISABLE", "1"},
            {"NCCL_SOCKET_IFNAME", "lo"}};
  }
  if (!settings.socket_ifname.empty()) return {{"NCCL_SOCKET_IFNAME", settings.socket_ifname}};
  return {};
}

}  // namespace tandem::cli
