// Projections of a few rows (a decode step's batch) without a GEMM: y = x . W^T computed as dot
// products over W's rows, with W in f32 or bf16 (widened in registers, f32 accumulate).
//
// Why not sgemm: for 1-8 rows OpenBLAS packs x and W into panels before computing, which at
// SmolLM2's shape (576 x 576) costs as much as the multiply-adds; a GEMV reads each weight once
// straight from its row and is bound by that read, which is the floor of a decode step.
//
// Three implementations chosen at run time from one portable build: AVX-512F register tiles
// (16 lanes, up to 16 accumulators) where the CPU has it, else AVX2/FMA (8 lanes, 8 accumulators),
// else portable loops (simd_kernels.h's SimdKernelsUseAvx512/SimdKernelsUseAvx2 decide).
#ifndef ATTNSERVE_KERNELS_CPU_SMALL_BATCH_GEMV_H_
#define ATTNSERVE_KERNELS_CPU_SMALL_BATCH_GEMV_H_

#include <cstdint>

namespace attnserve {

// Rows beyond which LinearForward uses sgemm instead (W would be read once per 4-row tile).
inline constexpr int64_t kGemvMaxRows = 8;

// y[r * ldy + o] = sum_i x[r * ldx + i] * w[o * in + i] (+ bias[o] when bias is not null) for
// r < rows and o in [o_begin, o_end). w is [out, in] (nn.Linear's layout) in f32 or bf16 bits.
// Any rows >= 1 works; x and y must not overlap.
void SmallBatchGemv(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t in,
                    const float* bias, int64_t o_begin, int64_t o_end, float* y, int64_t ldy);
void SmallBatchGemv(const float* x, int64_t ldx, int64_t rows, const uint16_t* w, int64_t in,
                    const float* bias, int64_t o_begin, int64_t o_end, float* y, int64_t ldy);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_SMALL_BATCH_GEMV_H_
