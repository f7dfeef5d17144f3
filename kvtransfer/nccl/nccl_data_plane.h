// The NCCL data path of issue #16 (kvtransfer/nccl/README.md): a
// KvDataSender for prefill workers and a KvDataReceiver for decode workers
// that move K/V rows with ncclSend/ncclRecv on one cached 2-rank
// communicator per P-D pair, while control (HELLO with the
// transport_setup, FRAME_DESC with comm_seq, FINAL, ACK) stays on the KV
// connection (kvtransfer/data_plane.h).
//
// Build once per process after the CUDA backend, before any transfer:
//   NcclDataPlaneOptions options;  // from kv.transfer_timeout_ms, advertise
//   auto plane = NcclDataPlane::Create(options);
//   KvDataSender* sender = (*plane)->sender();      // prefill worker
//   KvDataReceiver* receiver = (*plane)->receiver(); // decode worker
//
// Threads: one NCCL thread per plane runs every NCCL call; sender() and
// receiver() are thread-compatible as data_plane.h says. Destroy the plane
// after every transfer was closed (open ones fail with CANCELLED and their
// communicators are aborted).
#ifndef TANDEM_KVTRANSFER_NCCL_NCCL_DATA_PLANE_H_
#define TANDEM_KVTRANSFER_NCCL_NCCL_DATA_PLANE_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtransfer/data_plane.h"

namespace tandem::kvtransfer::nccl {

class DeviceOps;
class NcclCommFactory;
class NcclReceiver;
class NcclSender;
class NcclThread;

struct NcclDataPlaneOptions {
  // CUDA device ordinal of the KV cache (the NCCL thread binds to it).
  int device = 0;
  // kv.transfer_timeout_ms: bound on every send/receive group, on posting
  // it, and on waiting for a missing comm_seq. > 0.
  int transfer_timeout_ms = 5000;
  // Bound on a communicator's non-blocking init (both ranks must join).
  // > 0.
  int init_timeout_ms = 10000;
  // NCCL's bootstrap / socket interface (from `advertise`): "" keeps NCCL's
  // default; else NCCL_SOCKET_IFNAME is set to it before the first NCCL
  // call, unless the environment already sets NCCL_SOCKET_IFNAME (an
  // operator's or `tandem up`'s test mode choice wins; logged).
  std::string socket_ifname;
  // One line per communicator failure and at Create (may be empty).
  std::function<void(std::string_view)> log;
};

class NcclDataPlane {
 public:
  // Real NCCL + CUDA. Errors: INVALID_ARGUMENT naming a bad option field;
  // UNIMPLEMENTED "built without NCCL" when built without CUDA; INTERNAL for
  // a CUDA error.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NcclDataPlane>> Create(
      const NcclDataPlaneOptions& options);
  // With injected communicators and device operations (tests: an
  // in-process fake pair over host memory). Errors: INVALID_ARGUMENT.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NcclDataPlane>> CreateForTesting(
      const NcclDataPlaneOptions& options, std::shared_ptr<NcclCommFactory> factory,
      std::shared_ptr<DeviceOps> device);

  KvDataSender* sender();
  KvDataReceiver* receiver();
  ~NcclDataPlane();
  NcclDataPlane(const NcclDataPlane&) = delete;
  NcclDataPlane& operator=(const NcclDataPlane&) = delete;

 private:
  NcclDataPlane();

  std::unique_ptr<NcclSender> sender_;
  std::unique_ptr<NcclReceiver> receiver_;
  std::unique_ptr<NcclThread> thread_;
};

// True when this build has the real NCCL data path (TANDEM_ENABLE_CUDA).
bool NcclDataPlaneAvailable();

// Checks `options` (INVALID_ARGUMENT naming the field) and, when
// socket_ifname is set and the environment has no NCCL_SOCKET_IFNAME,
// sets it (setenv before the first NCCL call: NCCL reads it once).
// Returns the line describing the NCCL environment in effect
// (NCCL_SOCKET_IFNAME, NCCL_HOSTID, NCCL_NET, NCCL_IB_DISABLE).
[[nodiscard]] absl::StatusOr<std::string> ApplyNcclEnvironment(const NcclDataPlaneOptions& options);

}  // namespace tandem::kvtransfer::nccl

#endif  // TANDEM_KVTRANSFER_NCCL_NCCL_DATA_PLANE_H_
