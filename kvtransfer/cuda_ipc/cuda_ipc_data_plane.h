// The cuda_ipc data path of a worker (issue #16, "CUDA IPC"): D copies the
// K/V rows straight out of P's exported KV blocks on GPUs of one host (the
// same GPU included). One CudaIpcDataPlane per process serves both roles: a
// prefill worker uses sender(), a decode worker receiver(). The KV
// connection carries HELLO (with P's handles), the frame descriptors, FINAL
// and ACK (data_plane.h); ipc_sender.h and ipc_receiver.h describe each
// side, ipc_codec.h the bytes.
//
// Owns: the IpcApi, the sender and the receiver (and the receiver's poller
// thread). Does not touch: the KV connection, block allocation, the engine.
// Threads: as the sender and receiver say; Create on any thread.
#ifndef TANDEM_KVTRANSFER_CUDA_IPC_CUDA_IPC_DATA_PLANE_H_
#define TANDEM_KVTRANSFER_CUDA_IPC_CUDA_IPC_DATA_PLANE_H_

#include <functional>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/kv/device_kv.h"
#include "kvtransfer/cuda_ipc/ipc_api.h"
#include "kvtransfer/data_plane.h"

namespace tandem::kvtransfer::cuda_ipc {

struct CudaIpcDataPlaneOptions {
  // This process's KV (P exports it, D copies into it). Required; must
  // outlive the plane.
  kv::DeviceKvAccess* kv = nullptr;
  // P: how long after a failure D may still copy (P keeps its blocks that
  // long). D: the deadline of each copy, from its descriptor's arrival.
  int transfer_timeout_ms = 5000;
  // One line per mapping opened or closed and per copy that missed its
  // deadline; may be empty. Called from the receiver's threads.
  std::function<void(std::string_view)> log;
};

class CudaIpcDataPlane {
 public:
  // With the CUDA runtime on options.kv's device. Errors: INVALID_ARGUMENT
  // for a null kv or a timeout < 1 ms; UNAVAILABLE when there is no CUDA
  // device; UNIMPLEMENTED "built without CUDA" in a build without
  // TANDEM_ENABLE_CUDA.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CudaIpcDataPlane>> Create(
      const CudaIpcDataPlaneOptions& options);
  // The same plane over a given IpcApi (tests' host stand-in; Create passes
  // the CUDA one). Errors: INVALID_ARGUMENT for a null kv or api, or a
  // timeout < 1 ms.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CudaIpcDataPlane>> CreateForTesting(
      const CudaIpcDataPlaneOptions& options, std::shared_ptr<IpcApi> api);

  KvDataSender* sender();
  KvDataReceiver* receiver();
  // Ends the receiver's copies in flight (CANCELLED) and closes every
  // mapping. The KV connection must be done with the plane.
  ~CudaIpcDataPlane();

 private:
  CudaIpcDataPlane(const CudaIpcDataPlaneOptions& options, std::shared_ptr<IpcApi> api);

  std::shared_ptr<IpcApi> api_;
  std::unique_ptr<KvDataSender> sender_;
  std::unique_ptr<KvDataReceiver> receiver_;
};

// True when this build has CUDA and the process sees a CUDA device (so
// Create can succeed); false in a build without TANDEM_ENABLE_CUDA.
bool CudaIpcDataPlaneAvailable();

}  // namespace tandem::kvtransfer::cuda_ipc

#endif  // TANDEM_KVTRANSFER_CUDA_IPC_CUDA_IPC_DATA_PLANE_H_
