#include "kernels/cpu/linear.h"

#include <cblas.h>

#include <algorithm>

#include "kernels/cpu/small_batch_gemv.h"

namespace attnserve {

namespace {
// Below this many rows a row split would give each thread a sliver of a GEMM; split the weight's
// output features instead, which also splits the (dominant) weight traffic of decode.
constexpr int64_t kMinRowsPerThread = 32;
// GEMV work is split into blocks of this many output features (a multiple of the kernel's
// tiles), taken one at a time by whichever thread is free: on a loaded machine a late worker
// then costs one block, not half the projection.
constexpr int64_t kGemvBlockFeatures = 64;
// Multiply-adds below which a projection runs on the calling thread alone: waking a worker costs
// tens of microseconds, about what a core does with this many in that time.
constexpr int64_t kMinParallelMacs = int64_t{1} << 17;

// A weight as the kernels read it: exactly one of f32 / bf16 is set.
struct WeightView {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  int64_t in = 0;
  int64_t out = 0;
};

void Gemv(const float* x, int64_t ldx, int64_t rows, const WeightView& w, const float* bias,
          float* y, int64_t ldy, ThreadPool& pool) {
  auto block = [&](int64_t begin, int64_t end) {
    if (w.f32 != nullptr) {
      SmallBatchGemv(x, ldx, rows, w.f32, w.in, bias, begin, end, y, ldy);
    } else {
      SmallBatchGemv(x, ldx, rows, w.bf16, w.in, bias, begin, end, y, ldy);
    }
  };
  const int64_t blocks = (w.out + kGemvBlockFeatures - 1) / kGemvBlockFeatures;
  if (pool.num_threads() == 1 || blocks == 1 || rows * w.in * w.out < kMinParallelMacs) {
    block(0, w.out);
    return;
  }
  pool.ParallelFor(blocks, [&](int64_t b) {
    block(b * kGemvBlockFeatures, std::min(w.out, (b + 1) * kGemvBlockFeatures));
  });
}

void Sgemm(const float* x, int64_t ldx, int64_t rows, const WeightView& w, const float* bias,
           float* y, int64_t ldy, ThreadPool& pool) {
  const int64_t in_features = w.in, out_features = w.out;
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
    const float* w_block = w.f32 + col_begin * in_features;
    std::vector<float> widened;  // bf16 weights: this part's columns in f32 (prefill only).
    if (w.bf16 != nullptr) {
      widened.resize(n * in_features);
      ConvertToFloat(DType::kBF16, w.bf16 + col_begin * in_features, widened.data(),
                     widened.size());
      w_block = widened.data();
    }
    float* y_block = y + row_begin * ldy + col_begin;
    if (bias != nullptr) {
      for (int64_t r = 0; r < m; ++r)
        std::copy(bias + col_begin, bias + col_end, y_block + r * ldy);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(in_features), 1.0f, x + row_begin * ldx, static_cast<int>(ldx),
                w_block, static_cast<int>(in_features), bias != nullptr ? 1.0f : 0.0f, y_block,
                static_cast<int>(ldy));
  });
}

void Linear(const float* x, int64_t ldx, int64_t rows, const WeightView& w, const float* bias,
            float* y, int64_t ldy, ThreadPool& pool) {
  if (rows == 0 || w.out == 0) return;
  if (rows <= kGemvMaxRows) {
    Gemv(x, ldx, rows, w, bias, y, ldy, pool);
  } else {
    Sgemm(x, ldx, rows, w, bias, y, ldy, pool);
  }
}

}  // namespace

ProjectionWeight::ProjectionWeight(std::vector<float> values, int64_t out_features,
                                   int64_t in_features, DType dtype)
    : dtype_(dtype), out_features_(out_features), in_features_(in_features) {
  if (dtype == DType::kBF16) {
    bf16_.resize(values.size());
    ConvertFromFloat(values.data(), DType::kBF16, bf16_.data(), values.size());
  } else {
    f32_ = std::move(values);
  }
}

void LinearForward(const float* x, int64_t ldx, int64_t rows, const ProjectionWeight& w,
                   const float* bias, float* y, int64_t ldy, ThreadPool& pool) {
  const WeightView view{w.dtype() == DType::kF32 ? w.f32() : nullptr,
                        w.dtype() == DType::kBF16 ? w.bf16() : nullptr, w.in_features(),
                        w.out_features()};
  Linear(x, ldx, rows, view, bias, y, ldy, pool);
}

void LinearForward(const float* x, int64_t ldx, int64_t rows, const float* w, const float* bias,
                   int64_t in_features, int64_t out_features, float* y, int64_t ldy,
                   ThreadPool& pool) {
  Linear(x, ldx, rows, WeightView{w, nullptr, in_features, out_features}, bias, y, ldy, pool);
}

const char* ConfigureBlasForBackend() {
  openblas_set_num_threads(1);
  return openblas_get_config();
}

}  // namespace attnserve
