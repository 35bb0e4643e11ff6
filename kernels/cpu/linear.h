// Dense projections: OpenBLAS sgemm for many rows, our own GEMV (SmallBatchGemv below) for the few
// rows of a decode step, split across the backend's threads.
//
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
#ifndef ATTNSERVE_KERNELS_CPU_LINEAR_H_
#define ATTNSERVE_KERNELS_CPU_LINEAR_H_

#include <cstdint>
#include <vector>

#include "kernels/core/tensor.h"
#include "kernels/cpu/thread_pool.h"

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

// One projection's weight [out, in] (nn.Linear's layout) as a layer keeps it: f32, or bf16
// rounded once (round to nearest even) from the f32 values it is built from.
class ProjectionWeight {
 public:
  ProjectionWeight() = default;
  // `values` [out_features * in_features]; dtype kF32 or kBF16.
  ProjectionWeight(std::vector<float> values, int64_t out_features, int64_t in_features,
                   DType dtype);

  DType dtype() const { return dtype_; }
  int64_t out_features() const { return out_features_; }
  int64_t in_features() const { return in_features_; }
  const float* f32() const { return f32_.data(); }       // Null unless dtype() is kF32.
  const uint16_t* bf16() const { return bf16_.data(); }  // Null unless dtype() is kBF16.
  int64_t bytes() const {
    return out_features_ * in_features_ * static_cast<int64_t>(DTypeSize(dtype_));
  }

 private:
  DType dtype_ = DType::kF32;
  int64_t out_features_ = 0;
  int64_t in_features_ = 0;
  std::vector<float> f32_;
  std::vector<uint16_t> bf16_;
};

// y[rows, out] = x[rows, in] · w[out, in]^T (+ bias[out]), with row strides ldx and ldy
// (elements). Up to kGemvMaxRows rows: a GEMV over chunks of output features, each a share of the
// features left (long chunks first, short ones last), taken by whichever thread is free; each
// register tile prefetches the next tile's weight rows, so a weight read from memory streams ahead
// of the multiply-adds. More: rows or output columns are split across the pool's threads, each
// running a single-threaded sgemm (the backend owns parallelism, OpenBLAS runs with one thread);
// bf16 weights are widened block by block first. Work too small to repay waking a thread runs on
// the caller's thread alone.
void LinearForward(const float* x, int64_t ldx, int64_t rows, const ProjectionWeight& w,
                   const float* bias, float* y, int64_t ldy, ThreadPool& pool);
// The same for an f32 weight held elsewhere.
void LinearForward(const float* x, int64_t ldx, int64_t rows, const float* w, const float* bias,
                   int64_t in_features, int64_t out_features, float* y, int64_t ldy,
                   ThreadPool& pool);

// Makes OpenBLAS single-threaded (process-wide; see LinearForward). Returns its version string.
const char* ConfigureBlasForBackend();

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_LINEAR_H_
