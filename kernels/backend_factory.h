// Picks and creates a backend by name: "cpu", "cuda", or "auto" (CUDA when this binary was built
// with it and a usable device is present, else CPU). The choice comes with a one-line reason for
// the caller to log.
#ifndef ATTNSERVE_KERNELS_BACKEND_FACTORY_H_
#define ATTNSERVE_KERNELS_BACKEND_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/runtime/cuda_backend.h"

namespace attnserve {

struct BackendOptions {
  std::string name = "auto";  // "auto", "cpu" or "cuda".
  CpuBackendOptions cpu;
  CudaBackendOptions cuda;
};

struct BackendChoice {
  std::unique_ptr<AttentionBackend> backend;
  std::string reason;  // e.g. "auto: CUDA device 0 is usable (NVIDIA H100 ...)".
};

// True when this binary contains the CUDA backend.
bool CudaBackendBuilt();

// INVALID_ARGUMENT for an unknown name; FAILED_PRECONDITION for "cuda" when the binary has no
// CUDA backend or no usable device (the message says which, and why).
absl::StatusOr<BackendChoice> CreateBackend(const BackendOptions& options);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_BACKEND_FACTORY_H_
