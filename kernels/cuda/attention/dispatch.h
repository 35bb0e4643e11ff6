// The one place where KV dtype x head dim picks a kernel instantiation. Supported: f32, f16 and
// bf16 pages, head dims 64, 128 and 256: prefill on CUDA cores for f32 pages and head dim 256 and
// on tensor cores for f16/bf16 pages at 64 and 128, split-KV decode on CUDA cores for all (18
// instantiations in all); anything else
// is refused with INVALID_ARGUMENT when the layer is created, never at run time, by the capability
// table that lists them (kernels/cuda/cuda_capabilities.cc; cuda_backend_test checks they agree).
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_DISPATCH_H_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_DISPATCH_H_

#include "absl/status/status.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/core/dtype.h"

namespace attnserve::cuda {

// OK when the attention kernels are built for this page dtype and head dim. The launchers' own
// guard: CreateLayer has refused anything else through CudaCapabilities() before.
absl::Status CheckAttentionSupported(DType kv_dtype, int head_dim);
KvType ToKvType(DType dtype);

// Query rows per prefill work item of the kernel RunPrefillAttention picks for this page dtype
// and head dim.
int PrefillRowsPerBlock(DType kv_dtype, int head_dim);

absl::Status RunPrefillAttention(DType kv_dtype, int head_dim, const AttentionParams& params,
                                 cudaStream_t stream);
// Split-KV decode then the combine; `row_blocks` = ceil(group / kAttentionRowsPerBlock).
absl::Status RunDecodeAttention(DType kv_dtype, int head_dim, const AttentionParams& params,
                                int row_blocks, cudaStream_t stream);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_DISPATCH_H_
