// Device helpers of attention_kernel_bench (bench_device_kernels.cu): filling inputs with random
// finite values and a read-only bandwidth ceiling. Plain C++17 declarations, no absl, so the .cu
// side (nvcc, C++17) and the bench (C++20, absl) share them.
#ifndef ATTNSERVE_TESTS_GPU_BENCH_DEVICE_KERNELS_H_
#define ATTNSERVE_TESTS_GPU_BENCH_DEVICE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/attention/params.h"

namespace attnserve::bench {

// dst[i] = a value uniform in [-amplitude, amplitude) from a hash of (seed, i), stored as `type`
// (f32, or f16/bf16 rounded to nearest even): finite, so no kernel sees NaN or Inf.
cudaError_t LaunchFillUniform(void* dst, cuda::KvType type, int64_t count, uint64_t seed,
                              float amplitude, cudaStream_t stream);

// Reads `bytes` (a multiple of 16, 16-byte aligned) at `src` once with 16-byte loads and XORs the
// words into *sink (so the loads cannot be dropped). `blocks` x 512 threads, grid-stride.
cudaError_t LaunchReadSweep(const void* src, int64_t bytes, unsigned* sink, int blocks,
                            cudaStream_t stream);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_TESTS_GPU_BENCH_DEVICE_KERNELS_H_
