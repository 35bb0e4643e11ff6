// Split-KV combine (flash-decoding's second step; its block function is in combine.cuh) and a row
// broadcast for GEMM biases.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/attention/combine.cuh"
#include "kernels/cuda/attention/params.h"

namespace attnserve::cuda {

namespace {

// grid (batch, num_heads), block head_dim threads.
__global__ void CombineSplitsKernel(const AttentionParams p) {
  CombineSplitsBlock(p, blockIdx.x, blockIdx.y);
}

__global__ void BroadcastRowsKernel(float* dst, const float* bias, int rows, int cols) {
  const int64_t total = int64_t{rows} * cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    dst[e] = bias[e % cols];
  }
}

}  // namespace

cudaError_t LaunchCombineSplits(const AttentionParams& params, cudaStream_t stream) {
  if (params.batch == 0) return cudaSuccess;
  CombineSplitsKernel<<<dim3(params.batch, params.num_heads), params.kv.head_dim, 0, stream>>>(
      params);
  return cudaGetLastError();
}

cudaError_t LaunchBroadcastRows(float* dst, const float* bias, int rows, int cols,
                                cudaStream_t stream) {
  const int64_t total = int64_t{rows} * cols;
  if (total == 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
  BroadcastRowsKernel<<<blocks, 256, 0, stream>>>(dst, bias, rows, cols);
  return cudaGetLastError();
}

}  // namespace attnserve::cuda
