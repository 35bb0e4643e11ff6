// A CPU emulator of one CUDA thread block, for tests: runs a kernel's block function once per CUDA
// thread, each thread a fiber of the calling OS thread, with __syncthreads, warp shuffles and the
// m16n8k16 tensor-core mma emulated through barriers and per-warp exchange slots. It exists so that
// CI, which has no GPU, executes the exact source of the tensor-core kernels (see simt.h) and
// checks it against a float64 reference. It is slow (a barrier per shuffle and per mma), meant for
// test shapes.
//
// The mma is emulated from the PTX ISA's description of the fragment layouts, written here
// independently of the kernels' own indexing, so a layout mistake in a kernel shows up as a wrong
// result rather than being mirrored.
#ifndef ATTNSERVE_KERNELS_CUDA_SIMT_SIMT_EMULATOR_H_
#define ATTNSERVE_KERNELS_CUDA_SIMT_SIMT_EMULATOR_H_

#include <cstdint>
#include <functional>

namespace attnserve::cuda::simt::emulator {

// Runs `block` once per thread of a `threads`-thread block (a multiple of 32), interleaved at
// barriers, on the calling OS thread, and returns when every thread has returned. A deadlock (a
// barrier some live thread never reaches) aborts with a message.
void RunBlock(int threads, const std::function<void()>& block);

// The calling emulated thread's threadIdx.x. Only valid inside RunBlock.
int ThreadIndex();
void SyncBlock();
float ShflXor(float value, int lane_mask);
// c += A . B for the warp's fragments (bf16: true for bfloat16 inputs, false for f16).
void Mma16816(bool bf16, float c[4], const uint32_t a[4], const uint32_t b[2]);

}  // namespace attnserve::cuda::simt::emulator

#endif  // ATTNSERVE_KERNELS_CUDA_SIMT_SIMT_EMULATOR_H_
