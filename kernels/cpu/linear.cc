#include "kernels/cpu/linear.h"

#include <cblas.h>

#include <algorithm>

namespace attnserve {

namespace {
// Below this many rows a row split would give each thread a sliver of a GEMM; split the weight's
// output features instead, which also splits the (dominant) weight traffic of decode.
constexpr int64_t kMinRowsPerThread = 32;
}  // namespace

void LinearForward(const float* x, int64_t ldx, int64_t rows, const float* w, const float* bias,
                   int64_t in_features, int64_t out_features, float* y, int64_t ldy,
                   ThreadPool& pool) {
  if (rows == 0 || out_features == 0) return;
  const int threads = pool.num_threads();
  const bool split_rows = rows >= kMinRowsPerThread * threads;
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(threads, split_rows ? rows / kMinRowsPerThread : out_features / 16));
  pool.ParallelFor(parts, [&](int64_t part) {
    int64_t row_begin = 0, row_end = rows, col_begin = 0, col_end = out_features;
    if (split_rows) {
      row_begin = rows * part / parts;
      row_end = rows * (part + 1) / parts;
    } else {
      // Keep column blocks multiples of 16 floats (a cache line pair) where possible.
      col_begin = out_features * part / parts / 16 * 16;
      col_end = part + 1 == parts ? out_features : out_features * (part + 1) / parts / 16 * 16;
    }
    const int64_t m = row_end - row_begin;
    const int64_t n = col_end - col_begin;
    if (m <= 0 || n <= 0) return;
    float* y_block = y + row_begin * ldy + col_begin;
    if (bias != nullptr) {
      for (int64_t r = 0; r < m; ++r)
        std::copy(bias + col_begin, bias + col_end, y_block + r * ldy);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(in_features), 1.0f, x + row_begin * ldx, static_cast<int>(ldx),
                w + col_begin * in_features, static_cast<int>(in_features),
                bias != nullptr ? 1.0f : 0.0f, y_block, static_cast<int>(ldy));
  });
}

const char* ConfigureBlasForBackend() {
  openblas_set_num_threads(1);
  return openblas_get_config();
}

}  // namespace attnserve
