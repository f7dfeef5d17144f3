// The CUDA calls the cuda_ipc data path makes, behind a small interface so
// the sender and receiver (ipc_sender.h, ipc_receiver.h) build and run their
// tests without CUDA. The real implementation (cuda_ipc_api.cc, library
// tandem_kvtransfer_cuda_ipc, only with TANDEM_ENABLE_CUDA) calls the CUDA
// runtime; tests use a host-memory stand-in (tests/kvtransfer/cuda_ipc/
// host_ipc.h) whose "handles" name host pointers in a process-local registry.
//
// Handles are opaque byte strings (real: a 64-byte cudaIpcMemHandle_t /
// cudaIpcEventHandle_t, the memory one followed by the u64 offset of the
// exported pointer from the start of its allocation). Streams and events are
// cudaStream_t / cudaEvent_t as void*.
//
// Threads: every method may be called from any thread (the real one sets the
// KV's device on the calling thread first).
#ifndef TANDEM_KVTRANSFER_CUDA_IPC_IPC_API_H_
#define TANDEM_KVTRANSFER_CUDA_IPC_IPC_API_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kvtransfer::cuda_ipc {

class IpcApi {
 public:
  virtual ~IpcApi() = default;

  // This process's identity: host (kvtransfer::LocalHostId), a random
  // instance id (kvtransfer::NewInstanceId, fresh per process) and its pid.
  virtual std::string HostId() const = 0;
  virtual std::string InstanceId() const = 0;
  virtual int64_t Pid() const = 0;

  // Exports device memory at `ptr` (cudaIpcGetMemHandle). Errors: INTERNAL
  // naming the call (e.g. memory from cudaMallocAsync cannot be exported).
  [[nodiscard]] virtual absl::StatusOr<std::string> ExportMemory(void* ptr) = 0;
  // Maps another process's export into this one (cudaIpcOpenMemHandle with
  // cudaIpcMemLazyEnablePeerAccess) and returns the exported pointer as
  // seen here. Errors: INVALID_ARGUMENT for a handle of the wrong size,
  // INTERNAL for a CUDA error (naming the call).
  [[nodiscard]] virtual absl::StatusOr<void*> OpenMemory(std::string_view handle) = 0;
  // Unmaps what OpenMemory returned (cudaIpcCloseMemHandle).
  virtual void CloseMemory(void* ptr) = 0;

  // Exports an event created with cudaEventInterprocess
  // (cudaIpcGetEventHandle). Errors: INTERNAL naming the call.
  [[nodiscard]] virtual absl::StatusOr<std::string> ExportEvent(void* event) = 0;
  // Opens another process's event (cudaIpcOpenEventHandle). Errors as
  // OpenMemory.
  [[nodiscard]] virtual absl::StatusOr<void*> OpenEvent(std::string_view handle) = 0;
  // Releases what OpenEvent returned (cudaEventDestroy).
  virtual void CloseEvent(void* event) = 0;

  // A non-blocking stream of this process (cudaStreamCreateWithFlags).
  [[nodiscard]] virtual absl::StatusOr<void*> CreateStream() = 0;
  virtual void DestroyStream(void* stream) = 0;
  // A local event without timing (cudaEventCreateWithFlags).
  [[nodiscard]] virtual absl::StatusOr<void*> CreateEvent() = 0;
  virtual void DestroyEvent(void* event) = 0;

  // Work enqueued on `stream` after this call starts once `event`'s latest
  // record has completed (cudaStreamWaitEvent). Errors: INTERNAL.
  [[nodiscard]] virtual absl::Status StreamWaitEvent(void* stream, void* event) = 0;
  // Records `event` on `stream` (cudaEventRecord). Errors: INTERNAL.
  [[nodiscard]] virtual absl::Status RecordEvent(void* event, void* stream) = 0;
  // True once the event's latest record completed, false while pending
  // (cudaEventQuery). Errors: INTERNAL for a failed stream (naming the
  // CUDA error).
  [[nodiscard]] virtual absl::StatusOr<bool> QueryEvent(void* event) = 0;
};

}  // namespace tandem::kvtransfer::cuda_ipc

#endif  // TANDEM_KVTRANSFER_CUDA_IPC_IPC_API_H_
