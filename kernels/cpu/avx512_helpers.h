// AVX-512F helpers for the CPU kernels' register-tile loops (linear.cc). Internal:
// include only from kernels/cpu .cc files.
//
// Compiled with target("avx512f,avx2,fma") rather than -mavx512f, so one portable build serves
// every x86-64 CPU; callers run them only after a run-time check (SimdKernelsUseAvx512()), and
// must themselves carry ATTNSERVE_AVX512 to inline them.
#ifndef ATTNSERVE_KERNELS_CPU_AVX512_HELPERS_H_
#define ATTNSERVE_KERNELS_CPU_AVX512_HELPERS_H_

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#define ATTNSERVE_X86_AVX512 1
#define ATTNSERVE_AVX512 __attribute__((target("avx512f,avx2,fma")))

namespace attnserve::avx512 {

// 16 floats from p[0, 16).
ATTNSERVE_AVX512 inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
// 16 bf16 values from p[0, 16), widened to float (a bf16 is a float's high 16 bits).
ATTNSERVE_AVX512 inline __m512 Load16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// v[0] + ... + v[15].
ATTNSERVE_AVX512 inline float HorizontalSum(__m512 v) { return _mm512_reduce_add_ps(v); }

}  // namespace attnserve::avx512

#endif  // x86-64

#endif  // ATTNSERVE_KERNELS_CPU_AVX512_HELPERS_H_
