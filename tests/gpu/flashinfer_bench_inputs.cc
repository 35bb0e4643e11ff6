#include "tests/gpu/flashinfer_bench_inputs.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/runtime/cuda_status.h"

namespace attnserve::bench {

absl::StatusOr<DevicePtr> Allocate(size_t bytes, const char* what) {
  void* p = nullptr;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(bytes, 16)),
                                 absl::StrCat("cudaMalloc ", bytes, " bytes for ", what));
  return DevicePtr(p);
}

absl::StatusOr<DevicePtr> Upload(const std::vector<int32_t>& host, const char* what) {
  absl::StatusOr<DevicePtr> d = Allocate(host.size() * sizeof(int32_t), what);
  if (!d.ok()) return d.status();
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(d->get(), host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
      absl::StrCat("uploading ", what));
  return d;
}

}  // namespace attnserve::bench
