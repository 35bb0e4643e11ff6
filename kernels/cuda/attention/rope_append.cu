// Launchers of the RoPE + KV append kernel (attention/rope_append.cuh): grid (rows), one block per
// row; for 8-bit pages then the quantized append (attention/kv_append.cuh): grid (batch,
// num_kv_heads, 2), one warp per block.
#include <cuda_runtime.h>

#include "kernels/cuda/attention/kv_append.cuh"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/rope_append.cuh"

namespace attnserve::cuda {

namespace {

template <KvType kKv>
__global__ void __launch_bounds__(kRopeAppendThreads) RopeAppendKernel(const RopeAppendParams p) {
  __shared__ RopeAppendStorage sm;
  RopeAppendBlock<kKv>(p, blockIdx.x, sm);
}

template <bool kFp8>
__global__ void __launch_bounds__(kQuantizedAppendThreads)
    QuantizedAppendKernel(const RopeAppendParams p) {
  QuantizedAppendBlock<kFp8>(p, blockIdx.x, blockIdx.y, blockIdx.z);
}

}  // namespace

cudaError_t LaunchRopeAppend(const RopeAppendParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.rope.pairs() > kMaxHalfRotary) return cudaErrorInvalidValue;
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
    case KvType::kFp8:
    case KvType::kInt8: {
      // RoPE only (the kernel returns before its append), then the append per sequence.
      RopeAppendKernel<KvType::kF32><<<p.rows, kRopeAppendThreads, 0, stream>>>(p);
      if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
      if (p.batch == 0) break;
      const dim3 grid(p.batch, p.kv.num_kv_heads, 2);
      if (p.kv_type == KvType::kFp8) {
        QuantizedAppendKernel<true><<<grid, kQuantizedAppendThreads, 0, stream>>>(p);
      } else {
        QuantizedAppendKernel<false><<<grid, kQuantizedAppendThreads, 0, stream>>>(p);
      }
      break;
    }
  }
  return cudaGetLastError();
}

}  // namespace attnserve::cuda
