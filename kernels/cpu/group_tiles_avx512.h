// AVX-512F register tiles of the decode attention's two group loops (GroupScores and
// GroupAccumulate, simd_kernels.h), which serve every query row of a KV head (a GQA/MQA group, or
// all heads of absorbed MLA) from each K/V row. Internal: simd_kernels.cc dispatches here when
// SimdKernelsUseAvx512() and the dimension is a multiple of 16.
//
//   GroupScores      4 query rows x 4 keys (16 zmm accumulators): each loaded key chunk serves 4
//                    rows, each query chunk 4 keys (8 loads per 16 FMAs, against 6 per 8 for
//                    AVX2's 2 x 4); one row: 1 x 8. Sums reduced 8 at a time (halves, then hadd).
//   GroupAccumulate  4 rows x 64 columns of the accumulator in registers (16 zmm) over the whole
//                    run of value rows: each value chunk is loaded once per 4 rows, the weights
//                    broadcast from memory. Column chunks outside, row quads inside, so a chunk
//                    of the run's value rows stays in L1 across the quads.
//
// Why: grouped decode (GQA-4, MQA, absorbed MLA: 4-16 query rows per K/V row) was compute-bound
// on AVX2's 16 registers of 8 lanes at 0.25-0.66 of the read ceiling (docs/benchmarks.md).
#ifndef ATTNSERVE_KERNELS_CPU_GROUP_TILES_AVX512_H_
#define ATTNSERVE_KERNELS_CPU_GROUP_TILES_AVX512_H_

#include <cstdint>

namespace attnserve::avx512 {

// Both take rows of keys/values stored as float or as bf16 bits (Element = float or uint16_t,
// the two instantiated in group_tiles_avx512.cc).

// scores[g * ld + s] = q[g * dim, +dim) . key_rows[s][0, dim) for g < rows, s < count.
// dim % 16 == 0; only on CPUs with AVX-512F.
template <typename Element>
void GroupScores(const float* q, int rows, int64_t dim, const Element* const* key_rows, int count,
                 float* scores, int64_t ld);

// acc[g * dim, +dim) += sum_s weights[g * ld + s] * value_rows[s][0, dim) for g < rows.
// dim % 16 == 0; only on CPUs with AVX-512F.
template <typename Element>
void GroupAccumulate(const float* weights, int64_t ld, int rows, const Element* const* value_rows,
                     int count, int64_t dim, float* acc);

}  // namespace attnserve::avx512

#endif  // ATTNSERVE_KERNELS_CPU_GROUP_TILES_AVX512_H_
