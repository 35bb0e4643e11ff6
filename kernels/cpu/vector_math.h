// Short vector loops the attention kernels share. `#pragma omp simd` (compiled with -fopenmp-simd)
// lets GCC vectorise the reductions without relaxing floating-point rules anywhere else.
#ifndef ATTNSERVE_KERNELS_CPU_VECTOR_MATH_H_
#define ATTNSERVE_KERNELS_CPU_VECTOR_MATH_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace attnserve {

inline float Dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y += alpha * x
inline void Axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

inline void Scale(float alpha, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] *= alpha;
}

// Widens a row of stored KV elements to float32. For float storage no copy is needed, so callers
// use RowAsFloat, which returns the source itself or the widened scratch copy.
inline const float* RowAsFloat(const float* src, int64_t /*n*/, float* /*scratch*/) { return src; }
inline const float* RowAsFloat(const uint16_t* bf16_src, int64_t n, float* scratch) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) scratch[i] = BF16ToFloat(bf16_src[i]);
  return scratch;
}

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_VECTOR_MATH_H_
