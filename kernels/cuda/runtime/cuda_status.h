// CUDA runtime and cuBLAS return codes -> absl::Status, at the boundary of every host call.
#ifndef ATTNSERVE_KERNELS_CUDA_RUNTIME_CUDA_STATUS_H_
#define ATTNSERVE_KERNELS_CUDA_RUNTIME_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace attnserve::cuda {

// OK for cudaSuccess. Out of memory -> RESOURCE_EXHAUSTED; a missing/unusable device or driver ->
// UNAVAILABLE; bad arguments -> INVALID_ARGUMENT; anything else (a kernel fault, which leaves the
// context unusable) -> INTERNAL. `what` names the operation.
inline absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": CUDA error ", static_cast<int>(error), " (", cudaGetErrorName(error),
                   "): ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
      return absl::UnavailableError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace attnserve::cuda

#define ATTNSERVE_CUDA_RETURN_IF_ERROR(expr, what)                                            \
  do {                                                                                        \
    if (absl::Status _s = ::attnserve::cuda::CudaStatus((expr), (what)); !_s.ok()) return _s; \
  } while (0)

#endif  // ATTNSERVE_KERNELS_CUDA_RUNTIME_CUDA_STATUS_H_
