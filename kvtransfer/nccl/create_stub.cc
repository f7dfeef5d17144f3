// NcclDataPlane::Create for a build without CUDA (TANDEM_ENABLE_CUDA off):
// compiled into tandem_kvtransfer_nccl_core only then, so exactly one
// definition links (nccl_cuda.cc has the real one).
#include "absl/status/status.h"
#include "kvtransfer/nccl/nccl_data_plane.h"

namespace tandem::kvtransfer::nccl {

absl::StatusOr<std::unique_ptr<NcclDataPlane>> NcclDataPlane::Create(
    const NcclDataPlaneOptions& options) {
  return absl::UnimplementedError("kv.transport nccl: this binary was built without NCCL");
}

bool NcclDataPlaneAvailable() { return false; }

}  // namespace tandem::kvtransfer::nccl
