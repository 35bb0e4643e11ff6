// Split-KV combine (flash-decoding's second step) and a row broadcast for GEMM biases.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention/params.h"

namespace attnserve::cuda {

namespace {

// grid (batch, num_heads), block head_dim threads: thread d merges element d of one head's splits.
//   out = sum_i exp(m_i - M) acc_i / sum_i exp(m_i - M) l_i,  M = max_i m_i.
__global__ void CombineSplitsKernel(const AttentionParams p) {
  const int b = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  const int head_dim = blockDim.x;
  const int begin = p.item_begin[b], end = p.item_begin[b + 1];
  float global_max = -INFINITY;
  for (int i = begin; i < end; ++i) {
    global_max = fmaxf(global_max, p.partial_max[int64_t{i} * p.num_heads + h]);
  }
  float total = 0.0f, acc = 0.0f;
  for (int i = begin; i < end; ++i) {
    const int64_t row = int64_t{i} * p.num_heads + h;
    const float sum = p.partial_sum[row];
    if (sum == 0.0f) continue;  // A split that saw no key (cannot happen with a correct plan).
    const float weight = expf(p.partial_max[row] - global_max);
    total += weight * sum;
    acc += weight * p.partial_acc[row * head_dim + d];
  }
  const int64_t out_row = p.sequences[b].first_row;
  p.out[(out_row * p.num_heads + h) * head_dim + d] = total > 0.0f ? acc / total : 0.0f;
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
