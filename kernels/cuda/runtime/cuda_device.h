// Finds CUDA devices without requiring one: on a machine with no GPU or no driver the probe
// returns an explanation instead of failing, and callers fall back to the CPU backend.
#ifndef ATTNSERVE_KERNELS_CUDA_RUNTIME_CUDA_DEVICE_H_
#define ATTNSERVE_KERNELS_CUDA_RUNTIME_CUDA_DEVICE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace attnserve {

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;            // e.g. "NVIDIA H100 80GB HBM3"
  int compute_capability = 0;  // major * 10 + minor, e.g. 90
  int64_t total_memory_bytes = 0;
  int multiprocessors = 0;
};

// The visible devices. UNAVAILABLE (with the CUDA runtime's reason) when there are none, e.g.
// "no CUDA-capable device is detected" or "CUDA driver version is insufficient".
absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices();

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CUDA_RUNTIME_CUDA_DEVICE_H_
