// The CUDA backend: MHA/MQA/GQA layers on one GPU. Projections through cuBLAS (fp32, loaded at
// run time), our own kernels for RoPE + KV append, prefill and split-KV paged decode. KV pages
// live in one device pool allocated when the backend is created. MLA has no CUDA kernels yet and
// is refused with UNIMPLEMENTED.
#ifndef ATTNSERVE_KERNELS_CUDA_RUNTIME_CUDA_BACKEND_H_
#define ATTNSERVE_KERNELS_CUDA_RUNTIME_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace attnserve {

struct CudaBackendOptions {
  int device = 0;  // CUDA device ordinal.
  // Device KV page pool in bytes, allocated once; 0 = kv_pool_fraction of the free device memory.
  int64_t kv_pool_bytes = 0;
  double kv_pool_fraction = 0.5;
  // Pool granularity: a layer takes whole slabs as its pages are first used. A layer's page must
  // fit in one slab.
  int64_t slab_bytes = int64_t{4} << 20;
  // Tests: fill the pool and every newly reserved page with NaN (0xFF bytes) and every workspace
  // output with NaN before each call, so reads of unwritten memory and unwritten outputs show.
  bool poison_for_testing = false;
};

// UNAVAILABLE when there is no usable device or cuBLAS cannot be loaded (with the reason);
// RESOURCE_EXHAUSTED when the pool cannot be allocated.
absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateCudaBackend(
    const CudaBackendOptions& options = {});

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CUDA_RUNTIME_CUDA_BACKEND_H_
