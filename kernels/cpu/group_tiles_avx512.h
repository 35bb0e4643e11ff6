// AVX-512F register tiles of the decode attention's two group loops (GroupScores and
// GroupAccumulate, simd_kernels.h), which serve every query row of a KV head (a GQA/MQA group, or
// all heads of absorbed MLA) from each K/V row. Internal: simd_kernels.cc dispatches here when
// SimdKernelsUseAvx512() and the dimension is a multiple of 16.
//
//   GroupScores      8 query rows x 2 keys (16 zmm accumulators) while 8 rows are left (MQA,
//                    absorbed MLA: a whole group), each loaded key chunk widened once for all 8
//                    rows and the 16 sums reduced by one transposing tree; then 4 query rows x 4
//                    keys (each key chunk serving 4 rows, each query chunk 4 keys); one row: 1 x 8.
//   GroupAccumulate  8 rows x 48 columns (24 zmm) while 8 rows are left, then 4 rows x 64
//                    columns (16 zmm), the accumulator tile in registers over the whole run of
//                    value rows: each value chunk is loaded once per tile, the weights broadcast
//                    from memory. Column chunks outside, rows inside, so a chunk of the run's
//                    value rows stays in L1 across row tiles.
//   bf16 in the 8-row tiles: 32 values per load, split into even and odd floats (a shift and a
//   mask, no zero-extension), q and the accumulator columns taken in that even/odd order.
//
// Why: grouped decode (GQA-4, MQA, absorbed MLA: 4-16 query rows per K/V row) was compute-bound
// on AVX2's 16 registers of 8 lanes at 0.25-0.66 of the read ceiling (docs/benchmarks.md); with
// 4-row tiles an 8-row group still widened every bf16 K/V chunk twice and re-read each P·V chunk
// from L2 (a 128-key run of 64 f32 columns is 32 KiB, L1's size).
#ifndef ATTNSERVE_KERNELS_CPU_GROUP_TILES_AVX512_H_
#define ATTNSERVE_KERNELS_CPU_GROUP_TILES_AVX512_H_

#include <cstdint>

namespace attnserve::avx512 {

// Both take rows of keys/values stored as float or as bf16 bits (Element = float or uint16_t,
// the two instantiated in group_tiles_avx512.cc). Declared with the AVX-512 target (as
// ATTNSERVE_AVX512 in simd_kernels.h): GCC takes a function template's target from its first
// declaration, and without it a portable build (ATTNSERVE_NATIVE=OFF) compiled the
// instantiations without AVX-512 and could not inline their always-inline tiles.

// scores[g * ld + s] = q[g * dim, +dim) . key_rows[s][0, dim) for g < rows, s < count.
// dim % 16 == 0; only on CPUs with AVX-512F.
template <typename Element>
__attribute__((target("avx512f,avx2,fma"))) void GroupScores(const float* q, int rows, int64_t dim, const Element* const* key_rows, int count,
                 float* scores, int64_t ld);

// acc[g * dim, +dim) += sum_s weights[g * ld + s] * value_rows[s][0, dim) for g < rows.
// dim % 16 == 0; only on CPUs with AVX-512F.
template <typename Element>
__attribute__((target("avx512f,avx2,fma"))) void GroupAccumulate(const float* weights, int64_t ld, int rows, const Element* const* value_rows,
                     int count, int64_t dim, float* acc);

}  // namespace attnserve::avx512

#endif  // ATTNSERVE_KERNELS_CPU_GROUP_TILES_AVX512_H_
