// Inner loops of the attention kernels. Short vector loops (Widen, ExpApprox, Dot, Axpy, Scale,
// ...) inline: `#pragma omp simd` (compiled with -fopenmp-simd) lets GCC vectorise the reductions
// without relaxing floating-point rules anywhere else; they are templated on the stored element
// type (float, or bf16 bits as uint16_t) so bf16 KV rows are widened in registers instead of
// through a scratch copy. The block loops below have an AVX2/FMA implementation (and AVX-512F for
// OnlineSoftmaxRow) chosen at run time
// (__builtin_cpu_supports; the AVX2 code is compiled with target attributes, so one portable
// build serves every x86-64 CPU) and a portable fallback with the same semantics. The x86 loads
// and horizontal sums those loops share (namespaces avx2, avx512) close this file.
//
//   OnlineSoftmaxRow  one query row's online-softmax update over a block of scores: scale, the
//                     variation's logits transform, mask to [lo, hi), running max/sum, rescale of
//                     the accumulator,
//                     scores -> weights (zero outside [lo, hi)), vectorised exp.
//   GroupScores       S[g][s] = q_g . k_s for all query rows of a KV group and a run of key rows
//                     (float or bf16 bits, widened in registers), q laid out once per call by
//                     GroupScoresQuery: register tiles of 1 row x 8
//                     keys for one row, 2 rows x 4 keys for a group (each key chunk loaded once
//                     per row pair).
//   GroupAccumulate   acc[g] += sum_s P[g][s] v_s, the accumulator held in registers over the run:
//                     2 rows x 32 columns for a group (each value chunk loaded once per row pair),
//                     1 row x 64 columns otherwise.
//   Both take AVX-512 tiles instead (simd_kernels.cc: 8 rows x 2 keys and 8 rows x 48 columns
//   for groups of 8 or more rows, then 4 rows x 4 keys and 4 rows x 64 columns) when
//   SimdKernelsUseAvx512() and the dimension is a multiple of 16.
#ifndef ATTNSERVE_KERNELS_CPU_SIMD_KERNELS_H_
#define ATTNSERVE_KERNELS_CPU_SIMD_KERNELS_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "kernels/spec/attention_variation.h"

namespace attnserve {

inline float Widen(float x) { return x; }
inline float Widen(uint16_t bf16_bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bf16_bits) << 16);
}

// e^x for softmax weights, vectorisable (no library call): Cody-Waite range reduction
// x = n ln2 + r and Cephes' degree-6 polynomial for e^r; relative error below 2e-7 for
// x in [-87, 88]. Inputs below -87.3 return ~1e-38 instead of 0, which is harmless for softmax
// weights (callers subtract the running max, so x <= 0 and the true weight is at most that small).
inline float ExpApprox(float x) {
  x = std::clamp(x, -87.33f, 88.37f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e_r = p * r * r + r + 1.0f;
  return e_r * std::bit_cast<float>(static_cast<int32_t>(n + 127.0f) << 23);
}

template <typename Element>
inline float Dot(const float* q, const Element* k, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += q[i] * Widen(k[i]);
  return sum;
}

// out[j] = q . k_j for four keys: q is loaded once, and the four reductions share one pass.
template <typename Element>
inline void Dot4(const float* q, const Element* k0, const Element* k1, const Element* k2,
                 const Element* k3, int64_t n, float* out) {
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < n; ++i) {
    const float qi = q[i];
    s0 += qi * Widen(k0[i]);
    s1 += qi * Widen(k1[i]);
    s2 += qi * Widen(k2[i]);
    s3 += qi * Widen(k3[i]);
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

// y += alpha * x
template <typename Element>
inline void Axpy(float alpha, const Element* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * Widen(x[i]);
}

// y += w[0] x0 + w[1] x1 + w[2] x2 + w[3] x3: one load and store of y for four rows.
template <typename Element>
inline void Axpy4(const float* w, const Element* x0, const Element* x1, const Element* x2,
                  const Element* x3, float* y, int64_t n) {
  const float w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    y[i] += w0 * Widen(x0[i]) + w1 * Widen(x1[i]) + w2 * Widen(x2[i]) + w3 * Widen(x3[i]);
  }
}

inline void Scale(float alpha, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] *= alpha;
}

// True when the AVX2/FMA paths run (CPU support, checked once).
bool SimdKernelsUseAvx2();
// True when the AVX-512F paths run (the small-batch projections, OnlineSoftmaxRow, the decode
// group loops and the prefill tiles have one): CPU support,
// checked once, unless ATTNSERVE_CPU_AVX512=0 or ATTNSERVE_CPU_PORTABLE=1 is set.
bool SimdKernelsUseAvx512();

// Online-softmax update of one row of `count` raw scores `s` against its running `max`, `sum` and
// unnormalised accumulator acc[value_dim]. Scores outside [lo, hi) are masked (their weight is 0);
// requires 0 <= lo < hi <= count. Scores are first multiplied by `scale` (skipped when 1), then
// rewritten by variation.TransformLogits (`site`: the row's head and query, s[0]'s key). On return
// s[0, count) holds the weights e^(s - new max).
void OnlineSoftmaxRow(float* s, int64_t count, int64_t lo, int64_t hi, float scale,
                      const AttentionVariation& variation, const LogitSite& site, float* max,
                      float* sum, float* acc, int64_t value_dim);

// OnlineSoftmaxRow for `rows` rows of s (row stride ld) whose `count` scores are all visible and
// already scaled, with no logit transform: max[r], sum[r] and acc[r * value_dim, +value_dim) are
// row r's. One call for a block's rows: the AVX-512 version keeps the exp constants in registers
// and pays no per-row call, and so a whole-block softmax of prefill costs less per row.
void OnlineSoftmaxRows(float* s, int64_t ld, int64_t rows, int64_t count, float* max, float* sum,
                       float* acc, int64_t value_dim);

// Writes q's `rows` rows of `dim` floats into `out` (rows * dim floats, 64-byte aligned) laid out
// as GroupScores reads them for float or bf16 (`bf16_keys`) keys: the same values, with bf16 keys
// on the AVX-512 path each whole 8-row group's columns in the even/odd order its tile loads keys
// in. Aligned because the tiles read q as memory operands of their FMAs, and a row off a 64-byte
// boundary (a std::vector's is at 16) could split every such load over two cache lines (measured,
// one thread: MQA f32/bf16 and MLA f32 kernels 1.10-1.15x; docs/benchmarks.md). A decode call
// lays out its q once for all its blocks of keys.
void GroupScoresQuery(const float* q, int rows, int64_t dim, bool bf16_keys, float* out);

// scores[g * ld + s] = q[g * dim, +dim) . key_rows[s][0, dim) for g < rows, s < count, q laid out
// by GroupScoresQuery for this key type.
void GroupScores(const float* q, int rows, int64_t dim, const float* const* key_rows, int count,
                 float* scores, int64_t ld);
void GroupScores(const float* q, int rows, int64_t dim, const uint16_t* const* key_rows, int count,
                 float* scores, int64_t ld);

// acc[g * dim, +dim) += sum_s weights[g * ld + s] * value_rows[s][0, dim) for g < rows.
void GroupAccumulate(const float* weights, int64_t ld, int rows, const float* const* value_rows,
                     int count, int64_t dim, float* acc);
void GroupAccumulate(const float* weights, int64_t ld, int rows, const uint16_t* const* value_rows,
                     int count, int64_t dim, float* acc);

}  // namespace attnserve

// The x86 vector loads (bf16 widened) and horizontal sums that the register-tile loops of
// simd_kernels.cc, linear.cc and prefill_tiles.cc share. Each function is compiled with a target
// attribute rather than -mavx2 / -mavx512f, so one portable build serves every x86-64 CPU; callers
// run them only after a run-time check (SimdKernelsUseAvx2(), SimdKernelsUseAvx512()), and must
// themselves carry ATTNSERVE_AVX2 / ATTNSERVE_AVX512 to inline them.
#if defined(__x86_64__) || defined(__i386__)
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

#if defined(__x86_64__)
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

#endif  // ATTNSERVE_KERNELS_CPU_SIMD_KERNELS_H_
