// KV transport names, the offer/choice rule and the host id (transport.h).
#include "kvtransfer/transport.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace tandem::kvtransfer {
namespace {

// absl::StrCat takes absl::string_view, which need not be std::string_view.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool Contains(const std::vector<KvTransport>& list, KvTransport t) {
  return std::find(list.begin(), list.end(), t) != list.end();
}

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
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV transport '", Sv(name), "' (expected tcp, nccl or cuda_ipc)"));
}

std::string KvTransportListName(const std::vector<KvTransport>& transports) {
  return absl::StrJoin(transports, ",",
                       [](std::string* out, KvTransport t) { out->append(KvTransportName(t)); });
}

absl::StatusOr<KvTransportSetting> ParseKvTransportSetting(std::string_view value) {
  KvTransportSetting setting;
  if (value == "auto") return setting;
  absl::StatusOr<KvTransport> t = ParseKvTransport(value);
  if (!t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("kv.transport: unknown value '", Sv(value),
                                                   "' (expected auto, tcp, nccl or cuda_ipc)"));
  }
  setting.automatic = false;
  setting.fixed = *t;
  return setting;
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
  switch (setting.fixed) {
    case KvTransport::kTcp:
      break;
    case KvTransport::kNccl:
      if (!capabilities.nccl) {
        return absl::FailedPreconditionError(absl::StrCat(
            "kv.transport nccl needs a CUDA worker built with NCCL (this worker: ", Sv(what), ")"));
      }
      break;
    case KvTransport::kCudaIpc:
      if (!capabilities.cuda_ipc) {
        return absl::FailedPreconditionError(
            absl::StrCat("kv.transport cuda_ipc needs a CUDA worker whose KV pools can be exported "
                         "(this worker: ",
                         Sv(what), ")"));
      }
      break;
  }
  return std::vector<KvTransport>{setting.fixed};
}

absl::StatusOr<KvTransport> ChooseTransport(const std::vector<KvTransport>& local,
                                            const TransportOffer& offer,
                                            std::string_view local_host_id) {
  const std::vector<KvTransport> offered =
      offer.transports.empty() ? std::vector<KvTransport>{KvTransport::kTcp} : offer.transports;
  const bool same_host =
      !local_host_id.empty() && !offer.host_id.empty() && local_host_id == offer.host_id;
  bool dropped_ipc = false;
  for (KvTransport t : local) {
    if (!Contains(offered, t)) continue;
    if (t == KvTransport::kCudaIpc && !same_host) {
      dropped_ipc = true;
      continue;
    }
    return t;
  }
  std::string msg = absl::StrCat("no common KV transport: this prefill worker supports ",
                                 KvTransportListName(local), ", the decode worker offers ",
                                 KvTransportListName(offered));
  if (dropped_ipc) {
    absl::StrAppend(&msg,
                    " (cuda_ipc needs both workers on one host; the decode worker is on "
                    "another host)");
  }
  return absl::FailedPreconditionError(msg);
}

absl::Status CheckTransportAccepted(KvTransport chosen, const std::vector<KvTransport>& offered) {
  if (Contains(offered, chosen)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("KV transport mismatch: the prefill worker chose ", Sv(KvTransportName(chosen)),
                   ", this decode worker offers ", KvTransportListName(offered)));
}

std::string LocalHostId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (in && std::getline(in, id)) {
    id = std::string(absl::StripAsciiWhitespace(id));
    if (!id.empty()) return id;
  }
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') return host;
  return "unknown-host";
}

std::string NewInstanceId() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&out, absl::Hex(rd(), absl::kZeroPad8));
  return out;
}

}  // namespace tandem::kvtransfer
