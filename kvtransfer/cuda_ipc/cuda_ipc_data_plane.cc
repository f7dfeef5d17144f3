// CudaIpcDataPlane over any IpcApi. Create and CudaIpcDataPlaneAvailable
// live in cuda_ipc_api.cc (CUDA builds) or cuda_ipc_stub.cc (others).
#include "kvtransfer/cuda_ipc/cuda_ipc_data_plane.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kvtransfer/cuda_ipc/ipc_receiver.h"
#include "kvtransfer/cuda_ipc/ipc_sender.h"

namespace tandem::kvtransfer::cuda_ipc {

absl::StatusOr<std::unique_ptr<CudaIpcDataPlane>> CudaIpcDataPlane::CreateForTesting(
    const CudaIpcDataPlaneOptions& options, std::shared_ptr<IpcApi> api) {
  if (options.kv == nullptr) return absl::InvalidArgumentError("cuda_ipc: 'kv' is null");
  if (api == nullptr) return absl::InvalidArgumentError("cuda_ipc: 'api' is null");
  if (options.transfer_timeout_ms < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc: 'transfer_timeout_ms' ", options.transfer_timeout_ms, " < 1"));
  }
  return std::unique_ptr<CudaIpcDataPlane>(new CudaIpcDataPlane(options, std::move(api)));
}

CudaIpcDataPlane::CudaIpcDataPlane(const CudaIpcDataPlaneOptions& options,
                                   std::shared_ptr<IpcApi> api)
    : api_(std::move(api)) {
  CudaIpcSender::Options s;
  s.kv = options.kv;
  s.api = api_;
  s.transfer_timeout_ms = options.transfer_timeout_ms;
  sender_ = std::make_unique<CudaIpcSender>(std::move(s));
  CudaIpcReceiver::Options r;
  r.api = api_;
  r.transfer_timeout_ms = options.transfer_timeout_ms;
  r.log = options.log;
  receiver_ = std::make_unique<CudaIpcReceiver>(std::move(r));
}

CudaIpcDataPlane::~CudaIpcDataPlane() {
  receiver_.reset();  // joins the poller before the api goes
  sender_.reset();
}

KvDataSender* CudaIpcDataPlane::sender() { return sender_.get(); }
KvDataReceiver* CudaIpcDataPlane::receiver() { return receiver_.get(); }

}  // namespace tandem::kvtransfer::cuda_ipc
