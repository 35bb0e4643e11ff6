// Element conversions between float and the KV page types, and warp reductions.
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_KV_ELEMENT_CUH_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_KV_ELEMENT_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/attention/params.h"

namespace attnserve::cuda {

template <KvType kKv>
struct KvElement;
template <>
struct KvElement<KvType::kF32> {
  using T = float;
  static __device__ float Load(const T* p) { return *p; }
  static __device__ void Store(T* p, float x) { *p = x; }
};
template <>
struct KvElement<KvType::kF16> {
  using T = __half;
  static __device__ float Load(const T* p) { return __half2float(*p); }
  // Round to nearest even, as the CPU's FloatToHalf.
  static __device__ void Store(T* p, float x) { *p = __float2half_rn(x); }
};
template <>
struct KvElement<KvType::kBF16> {
  using T = __nv_bfloat16;
  static __device__ float Load(const T* p) { return __bfloat162float(*p); }
  static __device__ void Store(T* p, float x) { *p = __float2bfloat16_rn(x); }
};

__device__ __forceinline__ float WarpMax(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

__device__ __forceinline__ float WarpSum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_KV_ELEMENT_CUH_
