// Register-tiled inner loops of the blocked prefill attention (prefill_attention.cc), with
// AVX-512F and AVX2/FMA versions chosen at run time from one portable build:
//
//   PanelScores     S = Q · Kᵀ for a block of query rows and a run of key panels. A key panel is
//                   16 keys stored transposed ([dim][16]), so 16 scores of a row are one FMA chain
//                   over the head dimension: AVX-512 tiles 4 rows × 4 panels (16 zmm
//                   accumulators), AVX2 4 rows × 1 panel (8 ymm).
//   TileAccumulate  O += P · V for a block of rows over a run of value rows: the accumulator tile
//                   (AVX-512 4 rows × 64 columns, AVX2 4 rows × 16 columns) stays in registers
//                   over the whole run, each value chunk loaded once per 4 rows.
//
// Both need the head dimensions to be multiples of 16 (PrefillTileIsaFor); otherwise, and on CPUs
// without AVX2 (or with ATTNSERVE_CPU_PORTABLE=1), prefill runs its portable sgemm path.
#ifndef ATTNSERVE_KERNELS_CPU_PREFILL_TILES_H_
#define ATTNSERVE_KERNELS_CPU_PREFILL_TILES_H_

#include <cstdint>

namespace attnserve {

// Keys per transposed key panel.
inline constexpr int kKeyPanel = 16;

enum class PrefillTileIsa { kPortable, kAvx2, kAvx512 };

// The instruction set the tiles run with for these head dimensions: AVX-512 where the CPU has it
// (and ATTNSERVE_CPU_AVX512 is not 0), else AVX2, else portable (no tile kernels).
PrefillTileIsa PrefillTileIsaFor(int key_dim, int value_dim);

// Writes key rows keys[count, dim] as ceil(count / 16) panels at panels[p * 16 * dim]: panel p,
// element (d, j) = keys[16 p + j][d], zero beyond `count`.
void PackKeyPanels(const float* keys, int64_t count, int dim, float* panels);

// scores[r * ld + 16 p + j] = q[r * dim, +dim) . key (16 p + j) for r < rows, p < num_panels;
// `isa` is kAvx2 or kAvx512.
void PanelScores(PrefillTileIsa isa, const float* q, int rows, int dim, const float* panels,
                 int num_panels, float* scores, int64_t ld);

// acc[r * dim, +dim) += sum_{k < count} weights[r * ld + k] * values[k * dim, +dim) for r < rows;
// `isa` is kAvx2 or kAvx512.
void TileAccumulate(PrefillTileIsa isa, const float* weights, int64_t ld, int rows,
                    const float* values, int count, int dim, float* acc);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_PREFILL_TILES_H_
