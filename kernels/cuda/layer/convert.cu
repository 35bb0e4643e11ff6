// fp32 -> f16/bf16 for the activations a 16-bit projection reads (round to nearest even, as the
// CPU's ConvertFromFloat).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/attention/params.h"

namespace attnserve::cuda {

namespace {

template <typename T>
__device__ T FromFloat(float x);
template <>
__device__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T>
__global__ void ConvertFloatsKernel(const float* src, T* dst, int64_t count) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < count;
       e += int64_t{gridDim.x} * blockDim.x) {
    dst[e] = FromFloat<T>(src[e]);
  }
}

__global__ void FindNonFiniteKernel(const float* data, int64_t count, float limit,
                                    unsigned long long* first_bad) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < count;
       e += int64_t{gridDim.x} * blockDim.x) {
    const float x = data[e];
    if (!isfinite(x) || fabsf(x) >= limit) atomicMin(first_bad, static_cast<unsigned long long>(e));
  }
}

}  // namespace

cudaError_t LaunchFindNonFinite(const float* data, int64_t count, float limit,
                                unsigned long long* first_bad, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min<int64_t>((count + 255) / 256, 1024));
  FindNonFiniteKernel<<<blocks, 256, 0, stream>>>(data, count, limit, first_bad);
  return cudaGetLastError();
}

cudaError_t LaunchConvertFloats(const float* src, KvType dst_type, void* dst, int64_t count,
                                cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min<int64_t>((count + 255) / 256, 4096));
  switch (dst_type) {
    case KvType::kF16:
      ConvertFloatsKernel<<<blocks, 256, 0, stream>>>(src, static_cast<__half*>(dst), count);
      break;
    case KvType::kBF16:
      ConvertFloatsKernel<<<blocks, 256, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), count);
      break;
    case KvType::kF32:
    case KvType::kFp8:  // Activations are never 8-bit.
    case KvType::kInt8:
      return cudaErrorInvalidValue;  // Nothing to convert; callers use the fp32 buffer.
  }
  return cudaGetLastError();
}

}  // namespace attnserve::cuda
