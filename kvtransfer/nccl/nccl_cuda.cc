// The real NcclComm (NCCL 2.x non-blocking communicators), DeviceOps
// (CUDA runtime) and NcclDataPlane::Create. Compiled only with
// TANDEM_ENABLE_CUDA (library tandem_kvtransfer_nccl); no kernels: the
// gather/scatter kernels are the KV storage's (kv::DeviceKvAccess).
//
// NCCL's non-blocking contract (nccl.h, "ncclConfig_t.blocking = 0"): a
// call may return ncclInProgress; the communicator must then be polled
// with ncclCommGetAsyncError until it leaves ncclInProgress before the
// next call, and operations are enqueued on the stream only after that
// (Channel polls State() before recording its event). A failed or
// stalled communicator is ended with ncclCommAbort, never
// ncclCommDestroy (which would wait for a peer that may be dead).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtransfer/nccl/nccl_comm.h"
#include "kvtransfer/nccl/nccl_data_plane.h"

namespace tandem::kvtransfer::nccl {
namespace {

static_assert(kNcclUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);

[[nodiscard]] absl::Status NcclError(const char* call, ncclResult_t result, ncclComm_t comm) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  return absl::UnavailableError(
      absl::StrCat(call, ": ", ncclGetErrorString(result), last != nullptr && *last ? " (" : "",
                   last != nullptr ? last : "", last != nullptr && *last ? ")" : ""));
}

// ncclSuccess and (non-blocking) ncclInProgress are fine; State() follows.
[[nodiscard]] absl::Status Check(const char* call, ncclResult_t result, ncclComm_t comm) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  return NcclError(call, result, comm);
}

[[nodiscard]] absl::Status CudaError(const char* call, cudaError_t error) {
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorString(error)));
}

class RealNcclComm final : public NcclComm {
 public:
  explicit RealNcclComm(ncclComm_t comm) : comm_(comm) {}
  ~RealNcclComm() override {
    // Only reached without Abort at shutdown of a healthy communicator:
    // abort anyway (destroy would wait for the peer).
    if (comm_ != nullptr) ncclCommAbort(comm_);
  }

  [[nodiscard]] absl::Status GroupStart() override {
    return Check("ncclGroupStart", ncclGroupStart(), comm_);
  }
  [[nodiscard]] absl::Status GroupEnd() override {
    return Check("ncclGroupEnd", ncclGroupEnd(), comm_);
  }
  [[nodiscard]] absl::Status Send(const void* buffer, uint64_t bytes, int peer,
                                  void* stream) override {
    return Check("ncclSend",
                 ncclSend(buffer, bytes, ncclUint8, peer, comm_, static_cast<cudaStream_t>(stream)),
                 comm_);
  }
  [[nodiscard]] absl::Status Recv(void* buffer, uint64_t bytes, int peer, void* stream) override {
    return Check("ncclRecv",
                 ncclRecv(buffer, bytes, ncclUint8, peer, comm_, static_cast<cudaStream_t>(stream)),
                 comm_);
  }
  CommState State(absl::Status* error) override {
    ncclResult_t async = ncclSuccess;
    ncclResult_t result = ncclCommGetAsyncError(comm_, &async);
    if (result != ncclSuccess) async = result;
    if (async == ncclSuccess) return CommState::kReady;
    if (async == ncclInProgress) return CommState::kInProgress;
    if (error != nullptr) *error = NcclError("ncclCommGetAsyncError", async, comm_);
    return CommState::kError;
  }
  void Abort() override {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  ncclComm_t comm_;
};

class RealNcclCommFactory final : public NcclCommFactory {
 public:
  [[nodiscard]] absl::StatusOr<std::string> GetUniqueId() override {
    ncclUniqueId id;
    ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) return NcclError("ncclGetUniqueId", result, nullptr);
    return std::string(id.internal, sizeof(id.internal));
  }
  [[nodiscard]] absl::StatusOr<std::unique_ptr<NcclComm>> InitRank(const std::string& unique_id,
                                                                   int nranks, int rank,
                                                                   absl::Time deadline) override {
    if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ncclUniqueId of ", unique_id.size(), " bytes (expected ", NCCL_UNIQUE_ID_BYTES, ")"));
    }
    ncclUniqueId id;
    std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      if (comm != nullptr) ncclCommAbort(comm);
      return NcclError("ncclCommInitRankConfig", result, nullptr);
    }
    return std::make_unique<RealNcclComm>(comm);
  }
};

class CudaDeviceOps final : public DeviceOps {
 public:
  explicit CudaDeviceOps(int device) : device_(device) {}

  [[nodiscard]] absl::Status BindThread() override {
    cudaError_t error = cudaSetDevice(device_);
    return error == cudaSuccess ? absl::OkStatus() : CudaError("cudaSetDevice", error);
  }
  // May run on the caller's thread (OpenTransfer): the stream is made on
  // the KV device and the thread's current device is left as it was.
  [[nodiscard]] absl::StatusOr<void*> CreateStream() override {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaError_t error = cudaSetDevice(device_);
    if (error != cudaSuccess) return CudaError("cudaSetDevice", error);
    cudaStream_t stream = nullptr;
    error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    cudaSetDevice(previous);
    if (error != cudaSuccess) return CudaError("cudaStreamCreateWithFlags", error);
    return static_cast<void*>(stream);
  }
  void DestroyStream(void* stream) override {
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }
  [[nodiscard]] absl::StatusOr<void*> Allocate(uint64_t bytes, void* stream) override {
    void* buffer = nullptr;
    cudaError_t error = cudaMallocAsync(&buffer, bytes, static_cast<cudaStream_t>(stream));
    if (error != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMallocAsync of ", bytes,
                       " bytes for an NCCL staging buffer: ", cudaGetErrorString(error)));
    }
    return buffer;
  }
  void Free(void* buffer, void* stream) override {
    cudaFreeAsync(buffer, static_cast<cudaStream_t>(stream));
  }
  [[nodiscard]] absl::StatusOr<void*> RecordEvent(void* stream) override {
    cudaEvent_t event = nullptr;
    cudaError_t error = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (error != cudaSuccess) return CudaError("cudaEventCreateWithFlags", error);
    error = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
    if (error != cudaSuccess) {
      cudaEventDestroy(event);
      return CudaError("cudaEventRecord", error);
    }
    return static_cast<void*>(event);
  }
  EventState QueryEvent(void* event, absl::Status* error) override {
    cudaError_t result = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (result == cudaSuccess) return EventState::kDone;
    if (result == cudaErrorNotReady) return EventState::kPending;
    if (error != nullptr) *error = CudaError("cudaEventQuery", result);
    return EventState::kError;
  }
  void DestroyEvent(void* event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }
  [[nodiscard]] absl::Status StreamWaitEvent(void* stream, void* event) override {
    cudaError_t error =
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0);
    return error == cudaSuccess ? absl::OkStatus() : CudaError("cudaStreamWaitEvent", error);
  }

 private:
  const int device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclDataPlane>> NcclDataPlane::Create(
    const NcclDataPlaneOptions& options) {
  auto environment = ApplyNcclEnvironment(options);
  if (!environment.ok()) return environment.status();
  if (options.log) options.log(*environment);
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) return CudaError("cudaGetDeviceCount", error);
  if (options.device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("nccl data plane: 'device' ", options.device,
                                                   " but this host has ", count, " CUDA devices"));
  }
  // The injection point the tests use, with the real pieces.
  return CreateForTesting(options, std::make_shared<RealNcclCommFactory>(),
                          std::make_shared<CudaDeviceOps>(options.device));
}

bool NcclDataPlaneAvailable() { return true; }

}  // namespace tandem::kvtransfer::nccl
