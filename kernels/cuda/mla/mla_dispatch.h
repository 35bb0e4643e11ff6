// The one page-dtype dispatch of the MLA kernels, and the decode's two steps (split-KV partials,
// then the GQA path's combine with head_dim = kv_lora_rank).
#ifndef ATTNSERVE_KERNELS_CUDA_MLA_MLA_DISPATCH_H_
#define ATTNSERVE_KERNELS_CUDA_MLA_MLA_DISPATCH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/core/tensor.h"
#include "kernels/cuda/mla/mla_params.h"
#include "kernels/kv/storage_format.h"

namespace attnserve::cuda {

// OK when the native MLA kernels serve these widths: one attention tile within
// kMlaMaxSharedBytes, the latent a multiple of 32 and at most 1024 (the combine runs a thread per
// latent element), the query block's nope rows within 48 KB. INVALID_ARGUMENT naming the field
// otherwise.
absl::Status CheckMlaKernelDims(int kv_lora_rank, int qk_rope_head_dim, int qk_nope_head_dim);

// `kv_format`: the latent pages' (f32, f16, bf16, fp8 e4m3, int8; a DType reads as its format).
absl::Status RunMlaPrefillAttention(const KvStorageFormat& kv_format,
                                    const MlaAttentionParams& params, cudaStream_t stream);
// Split-KV partials (MlaDecodeBlock), then the combine into params.out.
absl::Status RunMlaDecodeAttention(const KvStorageFormat& kv_format,
                                   const MlaAttentionParams& params, cudaStream_t stream);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_MLA_MLA_DISPATCH_H_
