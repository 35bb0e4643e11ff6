// The handful of SIMT primitives the attention kernels use, behind one interface so the same
// kernel source runs on the GPU (nvcc: CUDA intrinsics and mma.sync PTX) and on the CPU under the
// block emulator (g++ with ATTNSERVE_SIMT_EMULATION: each CUDA thread a fiber, see
// simt_emulator.h). The emulator is how CI, which has no GPU, executes the kernels' index,
// fragment and masking logic against a float64 reference.
//
// Rules for code written against this header: every lane of a warp calls ShflXor and the Mma
// functions together (uniform control flow inside a warp), every thread of the block calls
// SyncBlock, and shared 16-bit tiles hold raw patterns (uint16_t) so both compilers agree on them.
// Math beyond these primitives must resolve under both compilers: fmaxf/expf/fmaf (<cmath> on the
// host), ternaries rather than CUDA's min/max, cuda_fp16/cuda_bf16 conversions (host-callable).
#ifndef ATTNSERVE_KERNELS_CUDA_SIMT_SIMT_H_
#define ATTNSERVE_KERNELS_CUDA_SIMT_SIMT_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ATTNSERVE_SIMT inline __device__
// Fragment arrays must live in registers: every loop indexing them is unrolled.
#define ATTNSERVE_UNROLL _Pragma("unroll")
// A partial unroll (#pragma unroll n): a hint only, the loop is correct without it.
#define ATTNSERVE_PRAGMA(text) _Pragma(#text)
#define ATTNSERVE_UNROLL_BY(n) ATTNSERVE_PRAGMA(unroll n)
#elif defined(ATTNSERVE_SIMT_EMULATION)
#include "kernels/cuda/simt/simt_emulator.h"
#define ATTNSERVE_SIMT inline
#define ATTNSERVE_UNROLL
#define ATTNSERVE_UNROLL_BY(n)
#else
#error "simt.h is for nvcc, or for g++ with ATTNSERVE_SIMT_EMULATION (the CPU block emulator)"
#endif

namespace attnserve::cuda::simt {

// Which 16-bit float an mma consumes.
enum class Half16 { kF16, kBF16 };

#if defined(__CUDACC__)

ATTNSERVE_SIMT int ThreadIndex() { return static_cast<int>(threadIdx.x); }
ATTNSERVE_SIMT void SyncBlock() { __syncthreads(); }
ATTNSERVE_SIMT float ShflXor(float value, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, value, lane_mask);
}

// D = A . B + C for one 16x8x16 tile (PTX mma.sync.aligned.m16n8k16.row.col, fp32 accumulate).
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A 16x16: a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]
//            a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]
//   B 16x8:  b[0] = B[2t..2t+1][g]    b[1] = B[2t+8..2t+9][g]
//   C 16x8:  c[0..1] = C[g][2t..2t+1] c[2..3] = C[g+8][2t..2t+1]
// The lower-indexed element of a pair sits in the low 16 bits of its register.
template <Half16 kType>
ATTNSERVE_SIMT void Mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kType == Half16::kF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // Built for sm_80 and sm_90 only; the backend refuses older devices.
#endif
}

// 16 bytes at a 16-byte aligned address.
ATTNSERVE_SIMT uint4 Load16(const void* src) { return *static_cast<const uint4*>(src); }
ATTNSERVE_SIMT void Store16(void* dst, uint4 value) { *static_cast<uint4*>(dst) = value; }
// Two adjacent 16-bit elements as one register (4-byte aligned).
ATTNSERVE_SIMT uint32_t LoadPair(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
// The register of a 2-element 16-bit vector.
template <typename Pair>
ATTNSERVE_SIMT uint32_t PairBits(const Pair& pair) {
  return *reinterpret_cast<const uint32_t*>(&pair);
}

#else  // ATTNSERVE_SIMT_EMULATION

ATTNSERVE_SIMT int ThreadIndex() { return emulator::ThreadIndex(); }
ATTNSERVE_SIMT void SyncBlock() { emulator::SyncBlock(); }
ATTNSERVE_SIMT float ShflXor(float value, int lane_mask) {
  return emulator::ShflXor(value, lane_mask);
}
template <Half16 kType>
ATTNSERVE_SIMT void Mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  emulator::Mma16816(kType == Half16::kBF16, c, a, b);
}
ATTNSERVE_SIMT uint4 Load16(const void* src) {
  uint4 value;
  std::memcpy(&value, src, sizeof(value));
  return value;
}
ATTNSERVE_SIMT void Store16(void* dst, uint4 value) { std::memcpy(dst, &value, sizeof(value)); }
ATTNSERVE_SIMT uint32_t LoadPair(const uint16_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return bits;
}
template <typename Pair>
ATTNSERVE_SIMT uint32_t PairBits(const Pair& pair) {
  static_assert(sizeof(Pair) == sizeof(uint32_t));
  uint32_t bits;
  std::memcpy(&bits, &pair, sizeof(bits));
  return bits;
}

#endif

// (lo, hi) rounded to nearest even into one register, lo in the low 16 bits.
template <Half16 kType>
ATTNSERVE_SIMT uint32_t PackPair(float lo, float hi) {
  if constexpr (kType == Half16::kF16) {
    return PairBits(__floats2half2_rn(lo, hi));
  } else {
    return PairBits(__floats2bfloat162_rn(lo, hi));
  }
}

}  // namespace attnserve::cuda::simt

#endif  // ATTNSERVE_KERNELS_CUDA_SIMT_SIMT_H_
