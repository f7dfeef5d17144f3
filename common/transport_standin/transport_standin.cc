// TEMPORARY stand-in for kvtransfer/transport.cc (issue #16), compiled only
// while no kvtransfer/*.cc defines ParseKvTransportSetting
// (common/CMakeLists.txt), so that the wiring branch links before the
// control-plane branch is merged. It follows kvtransfer/transport.h's
// contract; once the real one is in, this file is not built and should be
// deleted (with its CMake lines).
#include <algorithm>
#include <fstream>
#include <random>

#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {
namespace {
// This Abseil's string_view is its own type, not std::string_view.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }
}  // namespace

std::string_view KvTransportName(KvTransport transport) {
  switch (transport) {
    case KvTransport::kTcp:
      return "tcp";
    case KvTransport::kNccl:
      return "nccl";
    case KvTransport::kCudaIpc:
      return "cuda_ipc";
  }
  return "unknown";
}

absl::StatusOr<KvTransport> ParseKvTransport(std::string_view name) {
  for (KvTransport t : {KvTransport::kTcp, KvTransport::kNccl, KvTransport::kCudaIpc}) {
    if (name == KvTransportName(t)) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown KV transport '", Sv(name), "' (expected tcp, nccl or cuda_ipc)"));
}

std::string KvTransportListName(const std::vector<KvTransport>& transports) {
  return absl::StrJoin(transports, ",", [](std::string* out, KvTransport t) {
    absl::StrAppend(out, Sv(KvTransportName(t)));
  });
}

absl::StatusOr<KvTransportSetting> ParseKvTransportSetting(std::string_view value) {
  if (value == "auto") return KvTransportSetting{};
  absl::StatusOr<KvTransport> t = ParseKvTransport(value);
  if (!t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv.transport: unknown value '", Sv(value), "' (expected auto, tcp, nccl or cuda_ipc)"));
  }
  return KvTransportSetting{false, *t};
}

absl::StatusOr<std::vector<KvTransport>> SupportedTransports(
    const KvTransportSetting& setting, const TransportCapabilities& capabilities,
    std::string_view what) {
  if (setting.automatic) {
    std::vector<KvTransport> out;
    if (capabilities.cuda_ipc) out.push_back(KvTransport::kCudaIpc);
    if (capabilities.nccl) out.push_back(KvTransport::kNccl);
    out.push_back(KvTransport::kTcp);
    return out;
  }
  if (setting.fixed == KvTransport::kNccl && !capabilities.nccl) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kv.transport nccl needs a CUDA worker built with NCCL (this worker: ", Sv(what), ")"));
  }
  if (setting.fixed == KvTransport::kCudaIpc && !capabilities.cuda_ipc) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kv.transport cuda_ipc needs a CUDA worker (this worker: ", Sv(what), ")"));
  }
  return std::vector<KvTransport>{setting.fixed};
}

absl::StatusOr<KvTransport> ChooseTransport(const std::vector<KvTransport>& local,
                                            const TransportOffer& offer,
                                            std::string_view local_host_id) {
  std::vector<KvTransport> offered = offer.transports;
  if (offered.empty()) offered.push_back(KvTransport::kTcp);
  const bool same_host = !local_host_id.empty() && local_host_id == offer.host_id;
  bool dropped_ipc = false;
  for (KvTransport t : local) {
    if (std::find(offered.begin(), offered.end(), t) == offered.end()) continue;
    if (t == KvTransport::kCudaIpc && !same_host) {
      dropped_ipc = true;
      continue;
    }
    return t;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no common KV transport: this prefill worker supports ", KvTransportListName(local),
      ", the decode worker offers ", KvTransportListName(offered),
      dropped_ipc ? " (cuda_ipc needs both on one host)" : ""));
}

absl::Status CheckTransportAccepted(KvTransport chosen, const std::vector<KvTransport>& offered) {
  std::vector<KvTransport> list = offered;
  if (list.empty()) list.push_back(KvTransport::kTcp);
  if (std::find(list.begin(), list.end(), chosen) != list.end()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "KV transport mismatch: the prefill worker chose ", Sv(KvTransportName(chosen)),
      ", this decode worker offers ", KvTransportListName(list)));
}

std::string LocalHostId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (in && std::getline(in, id)) {
    id = std::string(absl::StripAsciiWhitespace(id));
    if (!id.empty()) return id;
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') return host;
  return "unknown-host";
}

std::string NewInstanceId() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

}  // namespace tandem::kvtransfer
