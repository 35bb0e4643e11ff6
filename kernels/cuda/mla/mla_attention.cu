// Kernels and launchers of the absorbed MLA attention (block functions in mla_attention.cuh), for
// f32, f16, bf16, fp8 e4m3 and int8 latent pages: 10 instantiations.
#include <cuda_runtime.h>

#include "kernels/cuda/mla/mla_attention.cuh"
#include "kernels/cuda/mla/mla_params.h"

namespace attnserve::cuda {

namespace {

template <KvType kKv>
__global__ void __launch_bounds__(kMlaThreads) MlaPrefillKernel(const MlaAttentionParams p) {
  extern __shared__ float smem[];
  MlaPrefillBlock<kKv>(p, blockIdx.x, smem);
}

template <KvType kKv>
__global__ void __launch_bounds__(kMlaThreads) MlaDecodeKernel(const MlaAttentionParams p) {
  extern __shared__ float smem[];
  MlaDecodeBlock<kKv>(p, blockIdx.x, blockIdx.y, smem);
}

// The tile is over the 48 KB default at DeepSeek's widths: opt in to the bytes it needs.
template <typename Kernel>
cudaError_t AllowSharedBytes(Kernel kernel, int64_t bytes) {
  if (bytes > kMlaMaxSharedBytes) return cudaErrorInvalidValue;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

}  // namespace

template <KvType kKv>
cudaError_t LaunchMlaPrefill(const MlaAttentionParams& params, cudaStream_t stream) {
  if (params.num_items == 0) return cudaSuccess;
  const int64_t bytes = MlaTileLayout(params.kv.latent_dim, params.kv.rope_dim).bytes();
  if (cudaError_t e = AllowSharedBytes(MlaPrefillKernel<kKv>, bytes); e != cudaSuccess) return e;
  MlaPrefillKernel<kKv><<<params.num_items, kMlaThreads, bytes, stream>>>(params);
  return cudaGetLastError();
}

template <KvType kKv>
cudaError_t LaunchMlaDecode(const MlaAttentionParams& params, cudaStream_t stream) {
  if (params.num_items == 0) return cudaSuccess;
  const int64_t bytes = MlaTileLayout(params.kv.latent_dim, params.kv.rope_dim).bytes();
  if (cudaError_t e = AllowSharedBytes(MlaDecodeKernel<kKv>, bytes); e != cudaSuccess) return e;
  const dim3 grid(params.num_items, (params.num_heads + kMlaRowsPerBlock - 1) / kMlaRowsPerBlock);
  MlaDecodeKernel<kKv><<<grid, kMlaThreads, bytes, stream>>>(params);
  return cudaGetLastError();
}

#define ATTNSERVE_INSTANTIATE_MLA(KV)                                                   \
  template cudaError_t LaunchMlaPrefill<KV>(const MlaAttentionParams&, cudaStream_t); \
  template cudaError_t LaunchMlaDecode<KV>(const MlaAttentionParams&, cudaStream_t);
ATTNSERVE_INSTANTIATE_MLA(KvType::kF32)
ATTNSERVE_INSTANTIATE_MLA(KvType::kF16)
ATTNSERVE_INSTANTIATE_MLA(KvType::kBF16)
ATTNSERVE_INSTANTIATE_MLA(KvType::kFp8)
ATTNSERVE_INSTANTIATE_MLA(KvType::kInt8)
#undef ATTNSERVE_INSTANTIATE_MLA

}  // namespace attnserve::cuda
