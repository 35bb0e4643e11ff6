// Attention over f16 KV pages: tensor-core prefill at head dims 64 and 128, CUDA-core prefill at
// 256, split-KV decode at all three.
#include "kernels/cuda/attention/paged_attention.cuh"
#include "kernels/cuda/attention/prefill_mma.cuh"

namespace attnserve::cuda {
ATTNSERVE_INSTANTIATE_MMA_PREFILL(KvType::kF16)
ATTNSERVE_INSTANTIATE_PREFILL_HD256(KvType::kF16)
ATTNSERVE_INSTANTIATE_DECODE(KvType::kF16)
}  // namespace attnserve::cuda
