// Create and CudaIpcDataPlaneAvailable in a build without TANDEM_ENABLE_CUDA
// (cuda_ipc_api.cc defines them otherwise; CMakeLists.txt compiles exactly
// one of the two).
#include "absl/status/status.h"
#include "kvtransfer/cuda_ipc/cuda_ipc_data_plane.h"

namespace tandem::kvtransfer::cuda_ipc {

absl::StatusOr<std::unique_ptr<CudaIpcDataPlane>> CudaIpcDataPlane::Create(
    const CudaIpcDataPlaneOptions&) {
  return absl::UnimplementedError("cuda_ipc data path: built without CUDA");
}

bool CudaIpcDataPlaneAvailable() { return false; }

}  // namespace tandem::kvtransfer::cuda_ipc
