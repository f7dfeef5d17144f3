// Which data path a KV transfer takes (issue #16; DESIGN.md, KV transfer
// and GPU workers): `tcp` (K/V bytes in FRAME messages on the KV
// connection; a CUDA end stages them through pinned host memory), `nccl`
// (ncclSend/ncclRecv on a cached 2-rank communicator per P-D pair) or
// `cuda_ipc` (D copies straight out of P's exported KV blocks; GPUs of one
// host). The control messages (HELLO, descriptors, FINAL, ACK) always stay
// on the KV connection.
//
// Negotiation: each worker has a setting (`kv.transport`: auto | tcp |
// nccl | cuda_ipc) and from it and its backend a list of transports it
// supports, in preference order (SupportedTransports). D offers its list
// with its KV endpoint (NeedRemotePrefill.kv_target: kv_transports,
// kv_host_id, kv_instance_id); P picks with ChooseTransport and names its
// pick in HELLO (protocol v3); D refuses a pick outside its own list with
// REJECT FAILED_PRECONDITION naming both (CheckTransportAccepted).
//
// Owns: the names, the preference rule, the host id. Does not touch:
// sockets, NCCL, CUDA. Threads: pure functions, thread-safe.
#ifndef TANDEM_KVTRANSFER_TRANSPORT_H_
#define TANDEM_KVTRANSFER_TRANSPORT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kvtransfer {

// Wire numbers (HELLO v3 carries the name, not the number; the number is
// for metrics labels and arrays).
enum class KvTransport : uint32_t {
  kTcp = 0,
  kNccl = 1,
  kCudaIpc = 2,
};
inline constexpr int kNumKvTransports = 3;

// "tcp", "nccl", "cuda_ipc".
std::string_view KvTransportName(KvTransport transport);
// The inverse of KvTransportName. Errors: INVALID_ARGUMENT "unknown KV
// transport 'x' (expected tcp, nccl or cuda_ipc)".
[[nodiscard]] absl::StatusOr<KvTransport> ParseKvTransport(std::string_view name);
// "tcp,nccl" for a list (empty string for an empty list).
std::string KvTransportListName(const std::vector<KvTransport>& transports);

// A worker's `kv.transport` setting.
struct KvTransportSetting {
  bool automatic = true;                  // "auto"
  KvTransport fixed = KvTransport::kTcp;  // when !automatic
};
// "auto" or a transport name. Errors: INVALID_ARGUMENT "kv.transport:
// unknown value 'x' (expected auto, tcp, nccl or cuda_ipc)".
[[nodiscard]] absl::StatusOr<KvTransportSetting> ParseKvTransportSetting(std::string_view value);

// What this process can run, besides TCP (always).
struct TransportCapabilities {
  bool cuda_kv = false;   // the KV cache is in GPU memory (CUDA backend)
  bool nccl = false;      // built with NCCL and a CUDA KV cache
  bool cuda_ipc = false;  // a CUDA KV cache whose pools can be exported
};

// The transports a worker supports, most preferred first. auto: cuda_ipc
// (if capable), nccl (if capable), tcp. A fixed setting: just it. Errors:
// FAILED_PRECONDITION when a fixed setting needs what the worker lacks,
// e.g. "kv.transport nccl needs a CUDA worker built with NCCL (this
// worker: cpu)" (`what` names the worker's backend for the message).
[[nodiscard]] absl::StatusOr<std::vector<KvTransport>> SupportedTransports(
    const KvTransportSetting& setting, const TransportCapabilities& capabilities,
    std::string_view what);

// D's offer, sent with its KV endpoint.
struct TransportOffer {
  std::vector<KvTransport> transports;  // D's SupportedTransports, in order
  std::string host_id;                  // LocalHostId() of D
  std::string instance_id;              // random per D process (a restarted D is a new peer)
};

// P's pick for one transfer: the first transport of P's list (`local`, in
// P's preference order) that D offers, skipping cuda_ipc unless
// local_host_id == offer.host_id (and both non-empty). An empty offer
// (a D from before issue #16 that offered nothing) is read as {tcp}.
// Errors: FAILED_PRECONDITION "no common KV transport: this prefill worker
// supports nccl, the decode worker offers tcp" (and a note when cuda_ipc
// was dropped for another host).
[[nodiscard]] absl::StatusOr<KvTransport> ChooseTransport(const std::vector<KvTransport>& local,
                                                          const TransportOffer& offer,
                                                          std::string_view local_host_id);

// D's check of P's pick at HELLO. Errors: FAILED_PRECONDITION "KV transport
// mismatch: the prefill worker chose nccl, this decode worker offers tcp".
[[nodiscard]] absl::Status CheckTransportAccepted(KvTransport chosen,
                                                  const std::vector<KvTransport>& offered);

// This machine's identity for "same host": the kernel's boot id
// (/proc/sys/kernel/random/boot_id, so containers of one node agree),
// falling back to the host name. Never empty.
std::string LocalHostId();
// A fresh random id for this process (32 hex digits), for
// TransportOffer::instance_id and NCCL's peer keys.
std::string NewInstanceId();

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_TRANSPORT_H_
