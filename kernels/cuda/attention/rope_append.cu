// Launcher of the RoPE + KV append kernel (attention/rope_append.cuh): grid (rows), one block per
// row.
#include <cuda_runtime.h>

#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/rope_append.cuh"

namespace attnserve::cuda {

namespace {

template <KvType kKv>
__global__ void __launch_bounds__(kRopeAppendThreads) RopeAppendKernel(const RopeAppendParams p) {
  __shared__ RopeAppendStorage sm;
  RopeAppendBlock<kKv>(p, blockIdx.x, sm);
}

}  // namespace

cudaError_t LaunchRopeAppend(const RopeAppendParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.rotary_dim / 2 > kMaxHalfRotary) return cudaErrorInvalidValue;
  switch (p.kv_type) {
    case KvType::kF32:
      RopeAppendKernel<KvType::kF32><<<p.rows, kRopeAppendThreads, 0, stream>>>(p);
      break;
    case KvType::kF16:
      RopeAppendKernel<KvType::kF16><<<p.rows, kRopeAppendThreads, 0, stream>>>(p);
      break;
    case KvType::kBF16:
      RopeAppendKernel<KvType::kBF16><<<p.rows, kRopeAppendThreads, 0, stream>>>(p);
      break;
  }
  return cudaGetLastError();
}

}  // namespace attnserve::cuda
