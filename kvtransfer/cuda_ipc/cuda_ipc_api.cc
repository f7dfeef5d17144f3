// The CUDA runtime IpcApi, Create and CudaIpcDataPlaneAvailable (library
// tandem_kvtransfer_cuda_ipc, built only with TANDEM_ENABLE_CUDA). Plain C++
// over cuda_runtime_api.h: no kernels here (DeviceKvAccess::CopyFromPeer is
// the engine's). The driver's cuMemGetAddressRange is reached through
// cudaGetDriverEntryPointByVersion, so nothing links libcuda (a CPU-only
// machine can still start a binary that contains this code).
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/cuda_ipc/cuda_ipc_data_plane.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == 64 && sizeof(cudaIpcEventHandle_t) == 64,
              "CUDA IPC handles are 64 bytes");

[[nodiscard]] absl::Status CudaError(const char* call, cudaError_t err) {
  return absl::InternalError(absl::StrCat("cuda_ipc: ", call, ": ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

// Memory handle bytes: cudaIpcMemHandle_t (64) then the u64 offset of the
// exported pointer from the start of its allocation (cudaIpcOpenMemHandle
// maps the whole allocation and returns its start).
constexpr size_t kMemHandleBytes = sizeof(cudaIpcMemHandle_t) + sizeof(uint64_t);

class CudaIpcApi final : public IpcApi {
 public:
  explicit CudaIpcApi(int device)
      : device_(device), host_id_(LocalHostId()), instance_id_(NewInstanceId()) {}

  std::string HostId() const override { return host_id_; }
  std::string InstanceId() const override { return instance_id_; }
  int64_t Pid() const override { return static_cast<int64_t>(getpid()); }

  [[nodiscard]] absl::StatusOr<std::string> ExportMemory(void* ptr) override {
    if (absl::Status s = SetDevice(); !s.ok()) return s;
    absl::StatusOr<uint64_t> offset = AllocationOffset(ptr);
    if (!offset.ok()) return offset.status();
    cudaIpcMemHandle_t handle;
    if (cudaError_t err = cudaIpcGetMemHandle(&handle, ptr); err != cudaSuccess) {
      return CudaError("cudaIpcGetMemHandle", err);
    }
    std::string out(reinterpret_cast<const char*>(&handle), sizeof(handle));
    out.append(reinterpret_cast<const char*>(&*offset), sizeof(uint64_t));
    return out;
  }

  [[nodiscard]] absl::StatusOr<void*> OpenMemory(std::string_view handle) override {
    if (handle.size() != kMemHandleBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda_ipc: a memory handle has ", kMemHandleBytes, " bytes, not ", handle.size()));
    }
    if (absl::Status s = SetDevice(); !s.ok()) return s;
    cudaIpcMemHandle_t h;
    uint64_t offset = 0;
    std::memcpy(&h, handle.data(), sizeof(h));
    std::memcpy(&offset, handle.data() + sizeof(h), sizeof(offset));
    void* base = nullptr;
    if (cudaError_t err = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
        err != cudaSuccess) {
      return CudaError("cudaIpcOpenMemHandle", err);
    }
    void* ptr = static_cast<char*>(base) + offset;
    absl::MutexLock lock(&mu_);
    bases_[ptr] = base;
    return ptr;
  }

  void CloseMemory(void* ptr) override {
    void* base = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = bases_.find(ptr);
      if (it == bases_.end()) return;
      base = it->second;
      bases_.erase(it);
    }
    if (SetDevice().ok()) cudaIpcCloseMemHandle(base);
  }

  [[nodiscard]] absl::StatusOr<std::string> ExportEvent(void* event) override {
    if (absl::Status s = SetDevice(); !s.ok()) return s;
    cudaIpcEventHandle_t handle;
    if (cudaError_t err = cudaIpcGetEventHandle(&handle, static_cast<cudaEvent_t>(event));
        err != cudaSuccess) {
      return CudaError("cudaIpcGetEventHandle", err);
    }
    return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
  }

  [[nodiscard]] absl::StatusOr<void*> OpenEvent(std::string_view handle) override {
    if (handle.size() != sizeof(cudaIpcEventHandle_t)) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: an event handle has ",
                                                     sizeof(cudaIpcEventHandle_t), " bytes, not ",
                                                     handle.size()));
    }
    if (absl::Status s = SetDevice(); !s.ok()) return s;
    cudaIpcEventHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    cudaEvent_t event = nullptr;
    if (cudaError_t err = cudaIpcOpenEventHandle(&event, h); err != cudaSuccess) {
      return CudaError("cudaIpcOpenEventHandle", err);
    }
    return static_cast<void*>(event);
  }

  void CloseEvent(void* event) override { DestroyEvent(event); }

  [[nodiscard]] absl::StatusOr<void*> CreateStream() override {
    if (absl::Status s = SetDevice(); !s.ok()) return s;
    cudaStream_t stream = nullptr;
    if (cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        err != cudaSuccess) {
      return CudaError("cudaStreamCreateWithFlags", err);
    }
    return static_cast<void*>(stream);
  }

  void DestroyStream(void* stream) override {
    if (SetDevice().ok()) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }

  [[nodiscard]] absl::StatusOr<void*> CreateEvent() override {
    if (absl::Status s = SetDevice(); !s.ok()) return s;
    cudaEvent_t event = nullptr;
    if (cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        err != cudaSuccess) {
      return CudaError("cudaEventCreateWithFlags", err);
    }
    return static_cast<void*>(event);
  }

  void DestroyEvent(void* event) override {
    if (SetDevice().ok()) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }

  [[nodiscard]] absl::Status StreamWaitEvent(void* stream, void* event) override {
    if (absl::Status s = SetDevice(); !s.ok()) return s;
    cudaError_t err =
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0);
    return err == cudaSuccess ? absl::OkStatus() : CudaError("cudaStreamWaitEvent", err);
  }

  [[nodiscard]] absl::Status RecordEvent(void* event, void* stream) override {
    if (absl::Status s = SetDevice(); !s.ok()) return s;
    cudaError_t err =
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
    return err == cudaSuccess ? absl::OkStatus() : CudaError("cudaEventRecord", err);
  }

  [[nodiscard]] absl::StatusOr<bool> QueryEvent(void* event) override {
    if (absl::Status s = SetDevice(); !s.ok()) return s;
    cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    return CudaError("cudaEventQuery", err);
  }

 private:
  // The KV's device on the calling thread (the receiver's threads are not
  // the engine's).
  [[nodiscard]] absl::Status SetDevice() const {
    cudaError_t err = cudaSetDevice(device_);
    return err == cudaSuccess ? absl::OkStatus() : CudaError("cudaSetDevice", err);
  }

  // ptr minus the start of its allocation (cuMemGetAddressRange).
  [[nodiscard]] static absl::StatusOr<uint64_t> AllocationOffset(void* ptr) {
    using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                       cudaEnableDefault, &found);
    if (err != cudaSuccess) return CudaError("cudaGetDriverEntryPointByVersion", err);
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
      return absl::InternalError("cuda_ipc: the driver has no cuMemGetAddressRange");
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(ptr);
    if (CUresult r = reinterpret_cast<GetRange>(fn)(&base, &size, p); r != CUDA_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuda_ipc: cuMemGetAddressRange failed (CUresult ",
                                              static_cast<int>(r), ")"));
    }
    return static_cast<uint64_t>(p - base);
  }

  const int device_;
  const std::string host_id_;
  const std::string instance_id_;
  absl::Mutex mu_;
  absl::flat_hash_map<void*, void*> bases_ ABSL_GUARDED_BY(mu_);  // mapped ptr -> base
};

}  // namespace

bool CudaIpcDataPlaneAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

absl::StatusOr<std::unique_ptr<CudaIpcDataPlane>> CudaIpcDataPlane::Create(
    const CudaIpcDataPlaneOptions& options) {
  if (options.kv == nullptr) return absl::InvalidArgumentError("cuda_ipc: 'kv' is null");
  int n = 0;
  if (cudaError_t err = cudaGetDeviceCount(&n); err != cudaSuccess || n == 0) {
    return absl::UnavailableError(
        absl::StrCat("cuda_ipc: no CUDA device (",
                     err == cudaSuccess ? "none found" : cudaGetErrorName(err), ")"));
  }
  const int device = options.kv->device_ordinal();
  if (device < 0 || device >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc: the KV's device ", device, " outside [0, ", n, ")"));
  }
  return CreateForTesting(options, std::make_shared<CudaIpcApi>(device));
}

}  // namespace tandem::kvtransfer::cuda_ipc
