// Attention over fp8 e4m3 KV pages, head dims 64, 128 and 256: CUDA-core prefill and split-KV
// decode, codes dequantized with their page's scale as each tile is gathered.
#include "kernels/cuda/attention/paged_attention.cuh"

namespace attnserve::cuda {
ATTNSERVE_INSTANTIATE_PREFILL(KvType::kFp8)
ATTNSERVE_INSTANTIATE_PREFILL_HD256(KvType::kFp8)
ATTNSERVE_INSTANTIATE_DECODE(KvType::kFp8)
}  // namespace attnserve::cuda
