// The per-(KV type, head dim) entry points of FlashInfer's prefill, each explicitly instantiated
// in its own paged_prefill_{f16,bf16}_hd{64,128,256}.cu (from paged_prefill_launch.cuh) so ninja
// compiles them in parallel. Declared apart from the FlashInfer headers so the dispatch
// (paged_prefill.cc) compiles as plain host C++.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_PREFILL_INSTANCES_H_
#define ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_PREFILL_INSTANCES_H_

#include <cuda_runtime_api.h>

#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/flashinfer/paged_prefill.h"

namespace attnserve::cuda {

// Launches the instance for the schedule's CTA tile and the mask and variant `args` ask for;
// cudaErrorInvalidValue for a tile with no instance. The caller has checked the shapes.
template <KvType kKvType, int kHeadDim>
cudaError_t LaunchFlashInferPrefillInstance(const FlashInferPrefillArgs& args, cudaStream_t stream);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_PREFILL_INSTANCES_H_
