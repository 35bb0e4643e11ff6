// Element-wise conversions on the device: fp32 -> f16/bf16 for the activations a 16-bit projection
// reads and for a 16-bit output; the wire dtype of an uploaded input -> the activation dtype; and
// the output's finiteness check. Narrowing rounds to nearest even, as the CPU's ConvertFromFloat;
// widening is exact, so a 16 -> 16-bit conversion through fp32 equals the host's Tensor::CastTo.
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
__device__ float ToFloat(T x);
template <>
__device__ float ToFloat<float>(float x) {
  return x;
}
template <>
__device__ float ToFloat<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ float FromFloat<float>(float x) {
  return x;
}

template <typename Src, typename Dst>
__global__ void ConvertKernel(const Src* src, Dst* dst, int64_t count) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < count;
       e += int64_t{gridDim.x} * blockDim.x) {
    dst[e] = FromFloat<Dst>(ToFloat<Src>(src[e]));
  }
}

template <typename Src>
cudaError_t LaunchConvertFrom(const Src* src, KvType dst_type, void* dst, int64_t count, int blocks,
                              cudaStream_t stream) {
  switch (dst_type) {
    case KvType::kF32:
      ConvertKernel<<<blocks, 256, 0, stream>>>(src, static_cast<float*>(dst), count);
      break;
    case KvType::kF16:
      ConvertKernel<<<blocks, 256, 0, stream>>>(src, static_cast<__half*>(dst), count);
      break;
    case KvType::kBF16:
      ConvertKernel<<<blocks, 256, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), count);
      break;
    case KvType::kFp8:  // Activations are never 8-bit.
    case KvType::kInt8:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
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

cudaError_t LaunchConvertActivations(const void* src, KvType src_type, void* dst, KvType dst_type,
                                     int64_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min<int64_t>((count + 255) / 256, 4096));
  switch (src_type) {
    case KvType::kF32:
      return LaunchConvertFrom(static_cast<const float*>(src), dst_type, dst, count, blocks,
                               stream);
    case KvType::kF16:
      return LaunchConvertFrom(static_cast<const __half*>(src), dst_type, dst, count, blocks,
                               stream);
    case KvType::kBF16:
      return LaunchConvertFrom(static_cast<const __nv_bfloat16*>(src), dst_type, dst, count, blocks,
                               stream);
    case KvType::kFp8:
    case KvType::kInt8:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace attnserve::cuda
