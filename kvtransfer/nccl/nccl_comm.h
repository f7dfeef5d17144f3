// The two small seams under the NCCL data path (kvtransfer/nccl/README.md):
// `NcclComm` (one 2-rank communicator) with its `NcclCommFactory`, and
// `DeviceOps` (streams, staging buffers, events). The core library
// (ordering, watchdog, sender, receiver) is written against them only, so
// it builds and is tested without CUDA: the tests use an in-process fake
// communicator pair over host memory; nccl_cuda.cc has the real ones
// (ncclCommInitRankConfig with config.blocking = 0, cudaMallocAsync, ...).
//
// Streams, events and buffers are opaque `void*` (cudaStream_t, cudaEvent_t,
// device pointers on CUDA).
//
// Threads: every NcclComm / NcclCommFactory call is made on the process's
// one NCCL thread (NcclThread). DeviceOps may be called from the NCCL
// thread and the engine loop thread at once (the real one is CUDA, which
// is thread-safe; a fake must lock).
#ifndef TANDEM_KVTRANSFER_NCCL_NCCL_COMM_H_
#define TANDEM_KVTRANSFER_NCCL_NCCL_COMM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer::nccl {

// Bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES in nccl.h).
inline constexpr size_t kNcclUniqueIdBytes = 128;

// A communicator's state after a non-blocking call (NCCL:
// ncclCommGetAsyncError: ncclSuccess, ncclInProgress, anything else).
enum class CommState { kReady, kInProgress, kError };

// One 2-rank communicator of a P-D pair (rank 0: P, sends; rank 1: D,
// receives). Every call is non-blocking: after it the caller polls
// `State()` until it leaves kInProgress before the next call (NCCL's
// non-blocking communicator contract). Destroying the object without
// Abort() is only allowed after a clean shutdown (never done for a
// communicator whose peer may be dead).
class NcclComm {
 public:
  virtual ~NcclComm() = default;
  // Bracket sends/receives posted together (ncclGroupStart/ncclGroupEnd).
  // Errors: INTERNAL / UNAVAILABLE naming the NCCL call and its message.
  [[nodiscard]] virtual absl::Status GroupStart() = 0;
  [[nodiscard]] virtual absl::Status GroupEnd() = 0;
  // `bytes` bytes (ncclUint8) from / into device memory `buffer` to / from
  // rank `peer`, enqueued on `stream`.
  [[nodiscard]] virtual absl::Status Send(const void* buffer, uint64_t bytes, int peer,
                                          void* stream) = 0;
  [[nodiscard]] virtual absl::Status Recv(void* buffer, uint64_t bytes, int peer, void* stream) = 0;
  // Non-blocking poll of the communicator (init included). On kError,
  // `*error` (if not null) gets UNAVAILABLE naming the NCCL error.
  virtual CommState State(absl::Status* error) = 0;
  // ncclCommAbort: ends the communicator and its pending operations
  // without talking to the peer. May take a while; never call it with a
  // lock held. The object is dead afterwards (only the destructor).
  virtual void Abort() = 0;
};

// Makes communicators. NCCL thread only.
class NcclCommFactory {
 public:
  virtual ~NcclCommFactory() = default;
  // A fresh ncclUniqueId (kNcclUniqueIdBytes bytes), made by rank 0.
  [[nodiscard]] virtual absl::StatusOr<std::string> GetUniqueId() = 0;
  // Starts joining the communicator `unique_id` as `rank` of `nranks`
  // without blocking: the result's State() is kInProgress until both ranks
  // joined. `deadline` is advisory (the caller's watchdog enforces it).
  // Errors: INVALID_ARGUMENT (an id of the wrong size), UNAVAILABLE.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<NcclComm>> InitRank(
      const std::string& unique_id, int nranks, int rank, absl::Time deadline) = 0;
};

// An event's state (cudaEventQuery: cudaSuccess, cudaErrorNotReady, else).
enum class EventState { kDone, kPending, kError };

// Device memory, streams and events of the data path's device.
class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  // Binds the calling thread to the device (cudaSetDevice); the NCCL
  // thread calls it first.
  [[nodiscard]] virtual absl::Status BindThread() = 0;
  // A non-blocking stream (cudaStreamCreateWithFlags) / its release.
  [[nodiscard]] virtual absl::StatusOr<void*> CreateStream() = 0;
  virtual void DestroyStream(void* stream) = 0;
  // `bytes` of device memory, usable in `stream` order (cudaMallocAsync) /
  // released in `stream` order (cudaFreeAsync). Errors:
  // RESOURCE_EXHAUSTED naming the size.
  [[nodiscard]] virtual absl::StatusOr<void*> Allocate(uint64_t bytes, void* stream) = 0;
  virtual void Free(void* buffer, void* stream) = 0;
  // A new event recorded on `stream` (cudaEventCreateWithFlags with
  // cudaEventDisableTiming, cudaEventRecord) / its state / its release.
  [[nodiscard]] virtual absl::StatusOr<void*> RecordEvent(void* stream) = 0;
  virtual EventState QueryEvent(void* event, absl::Status* error) = 0;
  virtual void DestroyEvent(void* event) = 0;
  // Makes `stream` wait for `event` (cudaStreamWaitEvent), e.g. for a
  // consumer of received rows on another stream.
  [[nodiscard]] virtual absl::Status StreamWaitEvent(void* stream, void* event) = 0;
};

}  // namespace tandem::kvtransfer::nccl

#endif  // TANDEM_KVTRANSFER_NCCL_NCCL_COMM_H_
