// CUDA runtime and cuBLAS error codes as absl::Status, and which of them
// are sticky (DESIGN.md, GPU workers: errors): a sticky error (an illegal
// address, a launch failure, a hardware error) corrupts the context, so
// every later call fails and the process must exit; any other error fails
// only the step it happened in.
//
// Owns: that classification. Threads: pure functions.
#ifndef TANDEM_ENGINE_BACKEND_CUDA_CUDA_STATUS_H_
#define TANDEM_ENGINE_BACKEND_CUDA_CUDA_STATUS_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string_view>

#include "absl/status/status.h"

namespace tandem::backend::cuda {

// True for the errors after which the CUDA context is unusable
// (cudaErrorIllegalAddress, cudaErrorLaunchFailure,
// cudaErrorHardwareStackError, cudaErrorIllegalInstruction,
// cudaErrorMisalignedAddress, cudaErrorInvalidAddressSpace,
// cudaErrorInvalidPc, cudaErrorAssert, cudaErrorECCUncorrectable, ...).
bool IsStickyCudaError(cudaError_t error);

// OK for cudaSuccess; RESOURCE_EXHAUSTED for cudaErrorMemoryAllocation;
// INTERNAL otherwise. The message is "<what>: <cudaGetErrorName>
// (<cudaGetErrorString>)", with " [sticky]" appended for sticky errors.
[[nodiscard]] absl::Status CudaStatus(cudaError_t error, std::string_view what);

// The same for cuBLAS(Lt): CUBLAS_STATUS_ALLOC_FAILED is
// RESOURCE_EXHAUSTED, everything else INTERNAL.
[[nodiscard]] absl::Status CublasStatus(cublasStatus_t status, std::string_view what);

}  // namespace tandem::backend::cuda

#endif  // TANDEM_ENGINE_BACKEND_CUDA_CUDA_STATUS_H_
