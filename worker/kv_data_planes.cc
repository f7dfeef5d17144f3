#include "worker/kv_data_planes.h"

#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/server/log.h"
#include "engine/kv/device_kv.h"

// The data planes exist when their libraries are in the build
// (common/server/CMakeLists.txt defines these from $<TARGET_EXISTS:...>).
#if defined(TANDEM_HAVE_NCCL_DATA_PLANE)
#include "kvtransfer/nccl/nccl_data_plane.h"
#endif
#if defined(TANDEM_HAVE_CUDA_IPC_DATA_PLANE)
#include "kvtransfer/cuda_ipc/cuda_ipc_data_plane.h"
#endif

namespace tandem {
namespace {

using kvtransfer::KvTransport;

// A data plane's lines go to the worker's log.
[[maybe_unused]] void LogLine(std::string_view line) {
  rpc::Log(absl::string_view(line.data(), line.size()));
}

std::string Name(KvTransport t) { return std::string(kvtransfer::KvTransportName(t)); }

// What a data plane hands over: its sender, receiver and owner.
struct BuiltPlane {
  kvtransfer::KvDataSender* sender = nullptr;
  kvtransfer::KvDataReceiver* receiver = nullptr;
  std::shared_ptr<void> owner;
};

// Creates the data plane of `transport` (nccl or cuda_ipc) over `device`.
[[nodiscard]] absl::StatusOr<BuiltPlane> CreatePlane(KvTransport transport, const KvConfig& kv,
                                                     kv::DeviceKvAccess& device) {
#if defined(TANDEM_HAVE_NCCL_DATA_PLANE)
  if (transport == KvTransport::kNccl) {
    kvtransfer::nccl::NcclDataPlaneOptions o;
    o.device = device.device_ordinal();
    o.transfer_timeout_ms = kv.transfer_timeout_ms;
    o.init_timeout_ms = kv.nccl_init_timeout_ms;
    o.socket_ifname = kv.nccl_socket_ifname;
    o.log = LogLine;
    auto plane = kvtransfer::nccl::NcclDataPlane::Create(o);
    if (!plane.ok()) return plane.status();
    std::shared_ptr<kvtransfer::nccl::NcclDataPlane> owner = *std::move(plane);
    return BuiltPlane{owner->sender(), owner->receiver(), owner};
  }
#endif
#if defined(TANDEM_HAVE_CUDA_IPC_DATA_PLANE)
  if (transport == KvTransport::kCudaIpc) {
    kvtransfer::cuda_ipc::CudaIpcDataPlaneOptions o;
    o.kv = &device;
    o.transfer_timeout_ms = kv.transfer_timeout_ms;
    o.log = LogLine;
    auto plane = kvtransfer::cuda_ipc::CudaIpcDataPlane::Create(o);
    if (!plane.ok()) return plane.status();
    std::shared_ptr<kvtransfer::cuda_ipc::CudaIpcDataPlane> owner = *std::move(plane);
    return BuiltPlane{owner->sender(), owner->receiver(), owner};
  }
#endif
  (void)kv, (void)device;
  return absl::UnimplementedError(
      absl::StrCat("this build has no ", Name(transport), " data plane"));
}

}  // namespace

kvtransfer::KvDataSender* KvDataPlanes::sender(KvTransport transport) const {
  for (kvtransfer::KvDataSender* s : senders) {
    if (s != nullptr && s->transport() == transport) return s;
  }
  return nullptr;
}

kvtransfer::KvDataReceiver* KvDataPlanes::receiver(KvTransport transport) const {
  for (kvtransfer::KvDataReceiver* r : receivers) {
    if (r != nullptr && r->transport() == transport) return r;
  }
  return nullptr;
}

kvtransfer::TransportCapabilities KvTransportCapabilities(kv::KvStorage& storage) {
  kvtransfer::TransportCapabilities caps;
  caps.cuda_kv = dynamic_cast<kv::DeviceKvAccess*>(&storage) != nullptr;
#if defined(TANDEM_HAVE_NCCL_DATA_PLANE)
  caps.nccl = caps.cuda_kv && kvtransfer::nccl::NcclDataPlaneAvailable();
#endif
#if defined(TANDEM_HAVE_CUDA_IPC_DATA_PLANE)
  caps.cuda_ipc = caps.cuda_kv && kvtransfer::cuda_ipc::CudaIpcDataPlaneAvailable();
#endif
  return caps;
}

absl::StatusOr<KvDataPlanes> BuildKvDataPlanes(const ClusterConfig& config,
                                               const WorkerConfig& worker, kv::KvStorage& storage) {
  const kvtransfer::KvTransportSetting& setting = config.kv.transport;
  absl::StatusOr<std::vector<KvTransport>> supported = kvtransfer::SupportedTransports(
      setting, KvTransportCapabilities(storage), config.WorkerDevice(worker).ToString());
  if (!supported.ok()) {
    return absl::Status(supported.status().code(),
                        absl::StrCat(worker.name, ": ", supported.status().message()));
  }
  KvDataPlanes planes;
  for (KvTransport t : *supported) {
    if (t == KvTransport::kTcp) {
      planes.transports.push_back(t);
      continue;
    }
    // SupportedTransports offers nccl / cuda_ipc only over device KV.
    auto* device = dynamic_cast<kv::DeviceKvAccess*>(&storage);
    absl::StatusOr<BuiltPlane> built =
        device != nullptr ? CreatePlane(t, config.kv, *device)
                          : absl::FailedPreconditionError("the KV cache is not on a GPU");
    if (!built.ok()) {
      if (!setting.automatic) {
        return absl::Status(
            built.status().code(),
            absl::StrCat(worker.name, ": kv.transport ", Name(t), ": ", built.status().message()));
      }
      rpc::Log(
          absl::StrCat("kv.transport auto: no ", Name(t), " (", built.status().message(), ")"));
      continue;
    }
    planes.transports.push_back(t);
    planes.senders.push_back(built->sender);
    planes.receivers.push_back(built->receiver);
    planes.owners.push_back(std::move(built->owner));
  }
  rpc::Log(absl::StrCat("KV transports: ", kvtransfer::KvTransportListName(planes.transports)));
  return planes;
}

void SetTransportOffer(const kvtransfer::TransportOffer& offer, core::KvTarget* target) {
  target->kv_transports.clear();
  for (kvtransfer::KvTransport t : offer.transports) {
    target->kv_transports.emplace_back(kvtransfer::KvTransportName(t));
  }
  target->kv_host_id = offer.host_id;
  target->kv_instance_id = offer.instance_id;
}

absl::StatusOr<kvtransfer::TransportOffer> TransportOfferFromTarget(
    const core::KvTarget& target, const std::vector<kvtransfer::KvTransport>& local) {
  kvtransfer::TransportOffer offer;
  offer.host_id = target.kv_host_id;
  offer.instance_id = target.kv_instance_id;
  for (const std::string& name : target.kv_transports) {
    absl::StatusOr<kvtransfer::KvTransport> t = kvtransfer::ParseKvTransport(name);
    if (t.ok()) offer.transports.push_back(*t);
  }
  if (offer.transports.empty() && !target.kv_transports.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no common KV transport: this prefill worker supports ",
                     kvtransfer::KvTransportListName(local), ", the decode worker offers ",
                     absl::StrJoin(target.kv_transports, ",")));
  }
  return offer;
}

}  // namespace tandem
