// AVX2/FMA helpers shared by the CPU kernels' register-tile loops (simd_kernels.cc,
// linear.cc). Internal: include only from kernels/cpu .cc files.
//
// Every function here is compiled with target("avx2,fma") rather than -mavx2, so one portable
// build serves every x86-64 CPU; callers run them only after a run-time check
// (SimdKernelsUseAvx2()), and must themselves carry ATTNSERVE_AVX2 to inline them.
#ifndef ATTNSERVE_KERNELS_CPU_AVX2_HELPERS_H_
#define ATTNSERVE_KERNELS_CPU_AVX2_HELPERS_H_

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ATTNSERVE_X86 1
#define ATTNSERVE_AVX2 __attribute__((target("avx2,fma")))

namespace attnserve::avx2 {

// 8 floats from p[0, 8).
ATTNSERVE_AVX2 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
// 8 bf16 values from p[0, 8), widened to float (a bf16 is a float's high 16 bits).
ATTNSERVE_AVX2 inline __m256 Load8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// v[0] + ... + v[7].
ATTNSERVE_AVX2 inline float HorizontalSum(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// max(v[0], ..., v[7]).
ATTNSERVE_AVX2 inline float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// [sum(a0), sum(a1), ..., sum(a7)].
ATTNSERVE_AVX2 inline __m256 Reduce8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4,
                                     __m256 a5, __m256 a6, __m256 a7) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

}  // namespace attnserve::avx2

#endif  // x86

#endif  // ATTNSERVE_KERNELS_CPU_AVX2_HELPERS_H_
