// Inner loops of the attention kernels with an AVX2/FMA implementation (and AVX-512F for
// OnlineSoftmaxRow) chosen at run time
// (__builtin_cpu_supports; the AVX2 code is compiled with target attributes, so one portable
// build serves every x86-64 CPU) and a portable fallback with the same semantics.
//
//   OnlineSoftmaxRow  one query row's online-softmax update over a block of scores: scale, the
//                     variation's logits transform, mask to [lo, hi), running max/sum, rescale of
//                     the accumulator,
//                     scores -> weights (zero outside [lo, hi)), vectorised exp.
//   GroupScores       S[g][s] = q_g . k_s for all query rows of a KV group and a run of key rows
//                     (float or bf16 bits, widened in registers): register tiles of 1 row x 8
//                     keys for one row, 2 rows x 4 keys for a group (each key chunk loaded once
//                     per row pair).
//   GroupAccumulate   acc[g] += sum_s P[g][s] v_s, the accumulator held in registers over the run:
//                     2 rows x 32 columns for a group (each value chunk loaded once per row pair),
//                     1 row x 64 columns otherwise.
#ifndef ATTNSERVE_KERNELS_CPU_SIMD_KERNELS_H_
#define ATTNSERVE_KERNELS_CPU_SIMD_KERNELS_H_

#include <cstdint>

#include "kernels/spec/attention_variation.h"

namespace attnserve {

// True when the AVX2/FMA paths run (CPU support, checked once).
bool SimdKernelsUseAvx2();
// True when the AVX-512F paths run (the small-batch projections, OnlineSoftmaxRow and the
// prefill tiles have one): CPU support,
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

// scores[g * ld + s] = q[g * dim, +dim) . key_rows[s][0, dim) for g < rows, s < count.
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

#endif  // ATTNSERVE_KERNELS_CPU_SIMD_KERNELS_H_
