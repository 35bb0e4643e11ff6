// RoPE fused with the KV append: rotates each row's q and k heads (both layouts), writes q back
// in place and k, v into the row's page slot in the page dtype (round to nearest even).
#include <cuda_runtime.h>

#include "kernels/cuda/attention/kv_element.cuh"
#include "kernels/cuda/attention/params.h"

namespace attnserve::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxHalfRotary = 128;  // rotary_dim <= 256 (the host checks).

// Rotates the `rotary_dim` leading elements of one head vector `x` in place:
//   (a, b) -> (a cos - b sin, b cos + a sin), pair i = (i, i + half) or (2i, 2i + 1).
__device__ __forceinline__ void RotatePair(float* x, int i, int half, int interleaved,
                                           const float* cos_table, const float* sin_table) {
  const int ia = interleaved ? 2 * i : i;
  const int ib = interleaved ? 2 * i + 1 : i + half;
  const float a = x[ia], b = x[ib];
  x[ia] = a * cos_table[i] - b * sin_table[i];
  x[ib] = b * cos_table[i] + a * sin_table[i];
}

// grid (rows), block kThreads.
template <KvType kKv>
__global__ void __launch_bounds__(kThreads) RopeAppendKernel(const RopeAppendParams p) {
  using Elem = KvElement<kKv>;
  using T = typename Elem::T;
  __shared__ float cos_table[kMaxHalfRotary];
  __shared__ float sin_table[kMaxHalfRotary];
  const int row = blockIdx.x;
  const int half = p.rotary_dim / 2;
  const int head_dim = p.kv.head_dim;
  const int kv_heads = p.kv.num_kv_heads;
  // Angles in fp64, as the CPU backend (float angles lose ~position * 2^-24 radians).
  for (int i = threadIdx.x; i < half; i += kThreads) {
    double s, c;
    sincos(static_cast<double>(p.positions[row]) * p.inv_freq[i], &s, &c);
    cos_table[i] = static_cast<float>(c);
    sin_table[i] = static_cast<float>(s);
  }
  __syncthreads();
  float* qkv = p.qkv + row * p.qkv_stride;
  // q and k heads are consecutive head_dim-wide vectors: num_heads of q, then kv_heads of k.
  const int rotated_heads = p.num_heads + kv_heads;
  for (int e = threadIdx.x; e < rotated_heads * half; e += kThreads) {
    const int head = e / half, i = e % half;
    RotatePair(qkv + int64_t{head} * head_dim, i, half, p.interleaved, cos_table, sin_table);
  }
  __syncthreads();
  // Append k and v to the row's slot.
  const SequenceDesc seq = p.sequences[p.row_sequence[row]];
  const int index = seq.first_index + (row - seq.first_row);
  const int64_t page_offset = p.kv.page_offsets[seq.first_page + index / p.kv.page_size];
  if (page_offset < 0) return;  // Impossible for a correct plan: new tokens' pages are reserved.
  T* page = reinterpret_cast<T*>(static_cast<char*>(p.kv.pool) + page_offset);
  const int slot = index % p.kv.page_size;
  const float* k = qkv + int64_t{p.num_heads} * head_dim;
  const float* v = k + int64_t{kv_heads} * head_dim;
  for (int e = threadIdx.x; e < kv_heads * head_dim; e += kThreads) {
    const int h = e / head_dim, d = e % head_dim;
    const int64_t element = p.kv.KeyElement(h, slot) + d;
    Elem::Store(page + element, k[e]);
    Elem::Store(page + p.kv.ValueOffset() + element, v[e]);
  }
}

}  // namespace

cudaError_t LaunchRopeAppend(const RopeAppendParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.rotary_dim / 2 > kMaxHalfRotary) return cudaErrorInvalidValue;
  switch (p.kv_type) {
    case KvType::kF32:
      RopeAppendKernel<KvType::kF32><<<p.rows, kThreads, 0, stream>>>(p);
      break;
    case KvType::kF16:
      RopeAppendKernel<KvType::kF16><<<p.rows, kThreads, 0, stream>>>(p);
      break;
    case KvType::kBF16:
      RopeAppendKernel<KvType::kBF16><<<p.rows, kThreads, 0, stream>>>(p);
      break;
  }
  return cudaGetLastError();
}

}  // namespace attnserve::cuda
