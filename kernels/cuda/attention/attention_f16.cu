// Prefill and split-KV decode attention over f16 KV pages, head dims 64 and 128.
#include "kernels/cuda/attention/paged_attention.cuh"

namespace attnserve::cuda {
ATTNSERVE_INSTANTIATE_ATTENTION(KvType::kF16)
}  // namespace attnserve::cuda
