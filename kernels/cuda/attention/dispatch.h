// The one place where KV format x head dim picks a kernel instantiation. Supported: f32, f16, bf16,
// fp8 e4m3 and int8 pages, head dims 64, 128 and 256: prefill on tensor cores for f16/bf16 pages at
// 64 and 128 and on CUDA cores otherwise, split-KV decode on CUDA cores for all (30 instantiations
// in all); anything else
// is refused with INVALID_ARGUMENT when the layer is created, never at run time, by the capability
// table that lists them (kernels/cuda/cuda_capabilities.cc; cuda_backend_test checks they agree).
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_DISPATCH_H_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_DISPATCH_H_

#include "absl/status/status.h"
#include "kernels/core/tensor.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/kv/storage_format.h"

namespace attnserve::cuda {

// OK when the attention kernels are built for this page dtype and head dim. The launchers' own
// guard: CreateLayer has refused anything else through CudaCapabilities() before.
absl::Status CheckAttentionSupported(const KvStorageFormat& kv_format, int head_dim);
KvType ToKvType(DType dtype);
KvType ToKvType(const KvStorageFormat& kv_format);  // 8-bit formats: kFp8, kInt8.

// Query rows per prefill work item of the kernel RunPrefillAttention picks for this page dtype
// and head dim.
int PrefillRowsPerBlock(const KvStorageFormat& kv_format, int head_dim);

absl::Status RunPrefillAttention(const KvStorageFormat& kv_format, int head_dim,
                                 const AttentionParams& params, cudaStream_t stream);
// Split-KV decode then the combine; `row_blocks` = ceil(group / kAttentionRowsPerBlock).
absl::Status RunDecodeAttention(const KvStorageFormat& kv_format, int head_dim,
                                const AttentionParams& params, int row_blocks,
                                cudaStream_t stream);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_DISPATCH_H_
