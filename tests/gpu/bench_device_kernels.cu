// Device helpers of attention_kernel_bench; see bench_device_kernels.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "tests/gpu/bench_device_kernels.h"

namespace attnserve::bench {

namespace {

constexpr int kThreads = 256;
constexpr int kSweepThreads = 512;

// splitmix64: a counter-based hash, so every element is independent of the launch shape.
__device__ uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void FillUniformKernel(void* dst, int type, int64_t count, uint64_t seed,
                                  float amplitude) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    // 24 random bits -> [0, 1) -> [-amplitude, amplitude).
    const float u =
        static_cast<float>(Mix(seed ^ (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull)) >> 40) *
        (1.0f / 16777216.0f);
    const float x = (2.0f * u - 1.0f) * amplitude;
    if (type == static_cast<int>(cuda::KvType::kF32)) {
      static_cast<float*>(dst)[i] = x;
    } else if (type == static_cast<int>(cuda::KvType::kF16)) {
      static_cast<__half*>(dst)[i] = __float2half_rn(x);
    } else {
      static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(x);
    }
  }
}

// Four independent 16-byte loads in flight per thread per iteration, then the tail.
__global__ void __launch_bounds__(kSweepThreads)
    ReadSweepKernel(const uint4* __restrict__ src, int64_t n, unsigned* sink) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(src + i);
    const uint4 b = __ldcs(src + i + stride);
    const uint4 c = __ldcs(src + i + 2 * stride);
    const uint4 d = __ldcs(src + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldcs(src + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  acc = __reduce_xor_sync(0xFFFFFFFFu, acc);
  if (threadIdx.x % 32 == 0) atomicXor(sink, acc);
}

}  // namespace

cudaError_t LaunchFillUniform(void* dst, cuda::KvType type, int64_t count, uint64_t seed,
                              float amplitude, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  const int64_t wanted = (count + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(wanted < 65536 ? wanted : 65536);
  FillUniformKernel<<<blocks, kThreads, 0, stream>>>(dst, static_cast<int>(type), count, seed,
                                                     amplitude);
  return cudaGetLastError();
}

cudaError_t LaunchReadSweep(const void* src, int64_t bytes, unsigned* sink, int blocks,
                            cudaStream_t stream) {
  if (bytes <= 0 || bytes % 16 != 0 || blocks < 1) return cudaErrorInvalidValue;
  ReadSweepKernel<<<blocks, kSweepThreads, 0, stream>>>(static_cast<const uint4*>(src), bytes / 16,
                                                        sink);
  return cudaGetLastError();
}

}  // namespace attnserve::bench
