// Attention over f32 KV pages, head dims 64, 128 and 256: CUDA-core prefill and split-KV decode.
#include "kernels/cuda/attention/paged_attention.cuh"

namespace attnserve::cuda {
ATTNSERVE_INSTANTIATE_PREFILL(KvType::kF32)
ATTNSERVE_INSTANTIATE_PREFILL_HD256(KvType::kF32)
ATTNSERVE_INSTANTIATE_DECODE(KvType::kF32)
}  // namespace attnserve::cuda
