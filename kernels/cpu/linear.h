// Dense projections: OpenBLAS sgemm for many rows, our own GEMV (small_batch_gemv.h) for the few
// rows of a decode step, split across the backend's threads.
#ifndef ATTNSERVE_KERNELS_CPU_LINEAR_H_
#define ATTNSERVE_KERNELS_CPU_LINEAR_H_

#include <cstdint>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/cpu/thread_pool.h"

namespace attnserve {

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
// (elements). Up to kGemvMaxRows rows: a GEMV over blocks of output features. More: rows or output
// columns are split across the pool's threads, each running a single-threaded sgemm (the backend
// owns parallelism, OpenBLAS runs with one thread); bf16 weights are widened block by block first.
// Work too small to repay waking a thread runs on the caller's thread alone.
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
