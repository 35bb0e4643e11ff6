// FlashInfer prefill instances for f16 pages, head dim 64 (see paged_prefill_launch.cuh).
#include "kernels/cuda/flashinfer/paged_prefill_launch.cuh"

namespace attnserve::cuda {

template cudaError_t LaunchFlashInferPrefillInstance<KvType::kF16, 64>(
    const FlashInferPrefillArgs& args, cudaStream_t stream);

}  // namespace attnserve::cuda
