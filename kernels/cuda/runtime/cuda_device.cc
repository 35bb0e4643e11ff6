#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/runtime/cuda_device.h"

namespace attnserve {

absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("no CUDA device: ", cudaGetErrorString(error)));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device: the runtime reports 0 devices");
  std::vector<CudaDeviceInfo> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaError_t e = cudaGetDeviceProperties(&prop, i); e != cudaSuccess) {
      return absl::UnavailableError(absl::StrCat("CUDA device ", i, ": ", cudaGetErrorString(e)));
    }
    devices.push_back({i, prop.name, prop.major * 10 + prop.minor,
                       static_cast<int64_t>(prop.totalGlobalMem), prop.multiProcessorCount});
  }
  return devices;
}

}  // namespace attnserve
