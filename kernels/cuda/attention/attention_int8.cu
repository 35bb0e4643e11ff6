// Attention over int8 KV pages, head dims 64, 128 and 256: CUDA-core prefill and split-KV
// decode, codes dequantized with their page's scale as each tile is gathered.
#include "kernels/cuda/attention/paged_attention.cuh"

namespace attnserve::cuda {
ATTNSERVE_INSTANTIATE_PREFILL(KvType::kInt8)
ATTNSERVE_INSTANTIATE_PREFILL_HD256(KvType::kInt8)
ATTNSERVE_INSTANTIATE_DECODE(KvType::kInt8)
}  // namespace attnserve::cuda
