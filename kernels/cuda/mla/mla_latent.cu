// Kernels and launchers of the MLA latent append (f32, f16, bf16, fp8 e4m3 and int8 pages),
// absorbed query and output up-projection (block functions in mla_latent.cuh).
#include <cuda_runtime.h>

#include "kernels/cuda/mla/mla_latent.cuh"
#include "kernels/cuda/mla/mla_params.h"

namespace attnserve::cuda {

namespace {

template <KvType kKv>
__global__ void __launch_bounds__(kMlaLatentThreads) MlaAppendKernel(const MlaAppendParams p) {
  __shared__ MlaAppendStorage sm;
  MlaAppendBlock<kKv>(p, blockIdx.x, sm);
}

template <bool kFp8>
__global__ void __launch_bounds__(kMlaQuantizedAppendThreads)
    MlaQuantizedAppendKernel(const MlaAppendParams p) {
  MlaQuantizedAppendBlock<kFp8>(p, blockIdx.x, blockIdx.y);
}

__global__ void __launch_bounds__(kMlaLatentThreads) MlaQueryKernel(const MlaQueryParams p) {
  extern __shared__ float smem[];
  MlaQueryBlock(p, blockIdx.x, blockIdx.y, smem);
}

__global__ void __launch_bounds__(kMlaLatentThreads) MlaOutputKernel(const MlaOutputParams p) {
  extern __shared__ float smem[];
  MlaOutputBlock(p, blockIdx.x, blockIdx.y, smem);
}

int Chunks(int rows) { return (rows + kMlaProjectionRows - 1) / kMlaProjectionRows; }

}  // namespace

cudaError_t LaunchMlaAppend(const MlaAppendParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  switch (p.kv_type) {
    case KvType::kF32:
      MlaAppendKernel<KvType::kF32><<<p.rows, kMlaLatentThreads, 0, stream>>>(p);
      break;
    case KvType::kF16:
      MlaAppendKernel<KvType::kF16><<<p.rows, kMlaLatentThreads, 0, stream>>>(p);
      break;
    case KvType::kBF16:
      MlaAppendKernel<KvType::kBF16><<<p.rows, kMlaLatentThreads, 0, stream>>>(p);
      break;
    // 8-bit pages: norms and RoPE per row, then the sequential quantizing append (latent, RoPE
    // key) per sequence.
    case KvType::kFp8:
      MlaAppendKernel<KvType::kFp8><<<p.rows, kMlaLatentThreads, 0, stream>>>(p);
      MlaQuantizedAppendKernel<true>
          <<<dim3(p.batch, MlaPageScaleCount()), kMlaQuantizedAppendThreads, 0, stream>>>(p);
      break;
    case KvType::kInt8:
      MlaAppendKernel<KvType::kInt8><<<p.rows, kMlaLatentThreads, 0, stream>>>(p);
      MlaQuantizedAppendKernel<false>
          <<<dim3(p.batch, MlaPageScaleCount()), kMlaQuantizedAppendThreads, 0, stream>>>(p);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchMlaQuery(const MlaQueryParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  const size_t bytes = sizeof(float) * kMlaProjectionRows * p.nope;  // 8 KB at nope 128.
  MlaQueryKernel<<<dim3(p.num_heads, Chunks(p.rows)), kMlaLatentThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchMlaOutput(const MlaOutputParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  const size_t bytes = sizeof(float) * kMlaProjectionRows * p.latent;  // 32 KB at latent 512.
  if (bytes > 48 * 1024) {
    if (cudaError_t e = cudaFuncSetAttribute(
            MlaOutputKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
        e != cudaSuccess) {
      return e;
    }
  }
  MlaOutputKernel<<<dim3(p.num_heads, Chunks(p.rows)), kMlaLatentThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace attnserve::cuda
