// Dense projections through OpenBLAS, split across the backend's threads.
#ifndef ATTNSERVE_KERNELS_CPU_LINEAR_H_
#define ATTNSERVE_KERNELS_CPU_LINEAR_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace attnserve {

// y[rows, out] = x[rows, in] · w[out, in]^T (+ bias[out]), with row strides ldx and ldy
// (elements). Rows or output columns are split across the pool's threads, each running a
// single-threaded sgemm: the backend owns parallelism, OpenBLAS runs with one thread.
void LinearForward(const float* x, int64_t ldx, int64_t rows, const float* w, const float* bias,
                   int64_t in_features, int64_t out_features, float* y, int64_t ldy,
                   ThreadPool& pool);

// Makes OpenBLAS single-threaded (process-wide; see LinearForward). Returns its version string.
const char* ConfigureBlasForBackend();

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_LINEAR_H_
