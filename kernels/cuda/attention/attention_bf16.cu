// Attention over bf16 KV pages, head dims 64 and 128: tensor-core prefill and split-KV decode.
#include "kernels/cuda/attention/paged_attention.cuh"
#include "kernels/cuda/attention/prefill_mma.cuh"

namespace attnserve::cuda {
ATTNSERVE_INSTANTIATE_MMA_PREFILL(KvType::kBF16)
ATTNSERVE_INSTANTIATE_DECODE(KvType::kBF16)
}  // namespace attnserve::cuda
