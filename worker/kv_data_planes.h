// A worker's KV transports (issue #16): which of tcp, nccl and cuda_ipc it
// supports (kv.transport and its backend, kvtransfer::SupportedTransports)
// and the device data paths behind the non-tcp ones
// (kvtransfer/data_plane.h: kvtransfer/nccl's NcclDataPlane,
// kvtransfer/cuda_ipc's CudaIpcDataPlane), built once after the backend.
// The only file that names the data-plane classes: a build without them
// (no kvtransfer/nccl or kvtransfer/cuda_ipc library) supports tcp only.
//
// Owns: the data-plane objects (KvDataPlanes::owners). Does not touch: the
// transfers themselves (the prefill worker's SenderKvExport, the decode
// worker's KvReceiver), NCCL or CUDA calls (the data planes).
// Threads: BuildKvDataPlanes runs once, at start-up; KvTransportBytes is
// thread-safe.
#ifndef TANDEM_WORKER_KV_DATA_PLANES_H_
#define TANDEM_WORKER_KV_DATA_PLANES_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cluster_config.h"
#include "engine/core/kv_target.h"
#include "engine/kv/kv_storage.h"
#include "kvtransfer/data_plane.h"
#include "kvtransfer/transport.h"

namespace tandem {

// What one worker can move KV with.
struct KvDataPlanes {
  // kvtransfer::SupportedTransports of kv.transport and the backend, most
  // preferred first (auto: cuda_ipc, nccl, tcp, each when capable).
  std::vector<kvtransfer::KvTransport> transports;
  // One per non-tcp entry of `transports` (prefill side / decode side);
  // owned by `owners`.
  std::vector<kvtransfer::KvDataSender*> senders;
  std::vector<kvtransfer::KvDataReceiver*> receivers;
  // The data-plane objects, type-erased so this header needs neither
  // NCCL's nor CUDA IPC's. Whoever holds the senders / receivers keeps
  // this struct (or a shared_ptr to it) alive at least as long.
  std::vector<std::shared_ptr<void>> owners;

  // The sender / receiver of `transport` (nullptr for tcp or one not built).
  kvtransfer::KvDataSender* sender(kvtransfer::KvTransport transport) const;
  kvtransfer::KvDataReceiver* receiver(kvtransfer::KvTransport transport) const;
};

// What `storage` allows: cuda_kv when it implements kv::DeviceKvAccess
// (the CUDA backend's KV storage), nccl / cuda_ipc when moreover this build
// has that data plane and it reports itself available
// (NcclDataPlaneAvailable, CudaIpcDataPlaneAvailable).
kvtransfer::TransportCapabilities KvTransportCapabilities(kv::KvStorage& storage);

// The transports of `worker` (its entry in `config`) whose backend holds
// `storage`, and a data plane for each non-tcp one: nccl from
// kv.transfer_timeout_ms, kv.nccl_init_timeout_ms, kv.nccl_socket_ifname
// and the storage's device ordinal; cuda_ipc over the storage's
// kv::DeviceKvAccess. Under kv.transport auto a data plane that cannot be
// created is left out (one rpc::Log line naming the transport and why);
// with a fixed transport it is an error. Errors: FAILED_PRECONDITION
// "<worker>: kv.transport nccl needs a CUDA worker built with NCCL (this
// worker: cpu)" (SupportedTransports'), or "<worker>: kv.transport nccl:
// <the data plane's error>".
[[nodiscard]] absl::StatusOr<KvDataPlanes> BuildKvDataPlanes(const ClusterConfig& config,
                                                             const WorkerConfig& worker,
                                                             kv::KvStorage& storage);

// The decode worker's transport offer inside the KV target it sends, and
// back on the prefill worker: the one place kvtransfer::TransportOffer and
// core::KvTarget (kv_transports, kv_host_id, kv_instance_id) meet (issue
// #33). SetTransportOffer writes `offer`'s transport names (KvTransportName,
// in order), host id and instance id into `target`.
void SetTransportOffer(const kvtransfer::TransportOffer& offer, core::KvTarget* target);
// D's offer from `target`, for a prefill worker supporting `local` (named in
// the error only). Names this build does not know are skipped (a newer D
// may offer more); an offer of only unknown names is FAILED_PRECONDITION
// "no common KV transport: this prefill worker supports <local>, the decode
// worker offers <names>". No names: an empty offer (tcp).
[[nodiscard]] absl::StatusOr<kvtransfer::TransportOffer> TransportOfferFromTarget(
    const core::KvTarget& target, const std::vector<kvtransfer::KvTransport>& local);

// KV payload bytes per transport (monotonic), for the per-transport
// counters (WorkerStatus.kv_bytes_by_transport). Thread-safe.
class KvTransportBytes {
 public:
  void Add(kvtransfer::KvTransport transport, uint64_t bytes) {
    bytes_[static_cast<size_t>(transport)].fetch_add(bytes, std::memory_order_relaxed);
  }
  uint64_t Get(kvtransfer::KvTransport transport) const {
    return bytes_[static_cast<size_t>(transport)].load(std::memory_order_relaxed);
  }

 private:
  std::array<std::atomic<uint64_t>, kvtransfer::kNumKvTransports> bytes_{};
};

}  // namespace tandem

#endif  // TANDEM_WORKER_KV_DATA_PLANES_H_
