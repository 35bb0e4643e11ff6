#include "kernels/cpu/linear.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>

#include "kernels/core/tensor.h"
#include "kernels/cpu/simd_kernels.h"

namespace attnserve {

// ---- SmallBatchGemv: register tiles for the few rows of a decode step ----------------------------

namespace {

// The portable version (what non-AVX2 CPUs run): f32 accumulation, in another order than the
// AVX2 lanes'.
template <typename W>
void GemvPortable(const float* x, int64_t ldx, int64_t rows, const W* w, int64_t in,
                  const float* bias, int64_t o_begin, int64_t o_end, float* y, int64_t ldy) {
  for (int64_t o = o_begin; o < o_end; ++o) {
    const W* w_row = w + o * in;
    for (int64_t r = 0; r < rows; ++r) {
      const float* x_row = x + r * ldx;
      float sum = 0.0f;
      for (int64_t i = 0; i < in; ++i) sum += x_row[i] * Widen(w_row[i]);
      y[r * ldy + o] = sum + (bias != nullptr ? bias[o] : 0.0f);
    }
  }
}

#ifdef ATTNSERVE_X86

using avx2::HorizontalSum;
using avx2::Load8;

// One register tile: O output features x R rows, O * R accumulators (<= 8 of the 16 registers,
// leaving room for the O weight loads and an x load). Each weight vector loaded serves R rows.
// [prefetch, prefetch_end): the next tile's weight rows, brought into cache one line per line of
// weights this tile consumes (empty when they are already there); see GemvTile512.
template <int O, int R, typename W>
ATTNSERVE_AVX2 void GemvTile(const float* x, int64_t ldx, const W* w, int64_t in, const float* bias,
                             int64_t o, float* y, int64_t ldy, const char* prefetch,
                             const char* prefetch_end) {
  // Bytes of weights one iteration consumes (O rows x 8 elements); a line is prefetched every
  // kEvery iterations, kLines lines at a time.
  constexpr int kBytes = O * static_cast<int>(sizeof(W)) * 8;
  constexpr int kLines = kBytes >= 64 ? kBytes / 64 : 1;
  constexpr int64_t kEvery = kBytes >= 64 ? 1 : 64 / kBytes;
  __m256 acc[O][R];
  for (int a = 0; a < O; ++a)
    for (int r = 0; r < R; ++r) acc[a][r] = _mm256_setzero_ps();
  const int64_t in8 = in / 8 * 8;
  for (int64_t i = 0; i < in8; i += 8) {
    if (prefetch < prefetch_end && (i / 8) % kEvery == 0) {
      for (int l = 0; l < kLines; ++l) _mm_prefetch(prefetch + 64 * l, _MM_HINT_T0);
      prefetch += 64 * kLines;
    }
    __m256 wv[O];
    for (int a = 0; a < O; ++a) wv[a] = Load8(w + (o + a) * in + i);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * ldx + i);
      for (int a = 0; a < O; ++a) acc[a][r] = _mm256_fmadd_ps(xv, wv[a], acc[a][r]);
    }
  }
  for (int a = 0; a < O; ++a) {
    const W* w_row = w + (o + a) * in;
    for (int r = 0; r < R; ++r) {
      float sum = HorizontalSum(acc[a][r]);
      for (int64_t i = in8; i < in; ++i) sum += x[r * ldx + i] * Widen(w_row[i]);
      y[r * ldy + o + a] = sum + (bias != nullptr ? bias[o + a] : 0.0f);
    }
  }
}

// All rows for output features [o, o + O): row tiles of 4, then one tile of the 1-3 left. The
// features' weight rows (O x in) stay in L1 across the row tiles, so W is streamed from memory
// once whatever the row count; the first row tile prefetches the rows of the next call,
// [o + O, min(o + 2 O, o_end)).
template <int O, typename W>
ATTNSERVE_AVX2 void GemvFeatures(const float* x, int64_t ldx, int64_t rows, const W* w, int64_t in,
                                 const float* bias, int64_t o, int64_t o_end, float* y,
                                 int64_t ldy) {
  const char* prefetch = reinterpret_cast<const char*>(w + std::min(o + O, o_end) * in);
  const char* prefetch_end = reinterpret_cast<const char*>(w + std::min(o + 2 * O, o_end) * in);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    GemvTile<O, 4>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy, prefetch, prefetch_end);
    prefetch = prefetch_end;  // Later row tiles read the same weights, now in cache.
  }
  switch (rows - r) {
    case 3:
      GemvTile<O, 3>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy, prefetch, prefetch_end);
      break;
    case 2:
      GemvTile<O, 2>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy, prefetch, prefetch_end);
      break;
    case 1:
      GemvTile<O, 1>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy, prefetch, prefetch_end);
      break;
    default:
      break;
  }
}

template <typename W>
ATTNSERVE_AVX2 void GemvAvx2(const float* x, int64_t ldx, int64_t rows, const W* w, int64_t in,
                             const float* bias, int64_t o_begin, int64_t o_end, float* y,
                             int64_t ldy) {
  // 2 features per tile when a row tile can hold 4 rows (8 accumulators), else 4 (<= 8).
  int64_t o = o_begin;
  if (rows >= 3) {
    for (; o + 2 <= o_end; o += 2) GemvFeatures<2>(x, ldx, rows, w, in, bias, o, o_end, y, ldy);
  } else {
    for (; o + 4 <= o_end; o += 4) GemvFeatures<4>(x, ldx, rows, w, in, bias, o, o_end, y, ldy);
  }
  for (; o < o_end; ++o) GemvFeatures<1>(x, ldx, rows, w, in, bias, o, o_end, y, ldy);
}

#endif  // ATTNSERVE_X86

#ifdef ATTNSERVE_X86_AVX512

// The AVX-512 version of GemvTile: 16 lanes, and with 32 registers up to 16 accumulators
// (O * R <= 16), so each weight vector serves 4 rows and each x vector 4 features.
// [prefetch, prefetch_end): bytes to bring into cache while this tile computes (the next tile's
// weight rows), one cache line per line of weights the tile consumes, so the memory reads of a
// cold weight run ahead of the FMAs; empty for a tile whose weights are already in cache.
template <int O, int R, typename W>
ATTNSERVE_AVX512 void GemvTile512(const float* x, int64_t ldx, const W* w, int64_t in,
                                  const float* bias, int64_t o, float* y, int64_t ldy,
                                  const char* prefetch, const char* prefetch_end) {
  // Cache lines of weights one iteration consumes (O rows x 16 elements), at least one.
  constexpr int kLines = O * static_cast<int>(sizeof(W)) * 16 / 64 > 0
                             ? O * static_cast<int>(sizeof(W)) * 16 / 64
                             : 1;
  __m512 acc[O][R];
  for (int a = 0; a < O; ++a)
    for (int r = 0; r < R; ++r) acc[a][r] = _mm512_setzero_ps();
  const int64_t in16 = in / 16 * 16;
  for (int64_t i = 0; i < in16; i += 16) {
    if (prefetch < prefetch_end) {
      for (int l = 0; l < kLines; ++l) _mm_prefetch(prefetch + 64 * l, _MM_HINT_T0);
      prefetch += 64 * kLines;
    }
    __m512 wv[O];
    for (int a = 0; a < O; ++a) wv[a] = avx512::Load16(w + (o + a) * in + i);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * ldx + i);
      for (int a = 0; a < O; ++a) acc[a][r] = _mm512_fmadd_ps(xv, wv[a], acc[a][r]);
    }
  }
  for (int a = 0; a < O; ++a) {
    const W* w_row = w + (o + a) * in;
    for (int r = 0; r < R; ++r) {
      float sum = avx512::HorizontalSum(acc[a][r]);
      for (int64_t i = in16; i < in; ++i) sum += x[r * ldx + i] * Widen(w_row[i]);
      y[r * ldy + o + a] = sum + (bias != nullptr ? bias[o + a] : 0.0f);
    }
  }
}

// All rows for output features [o, o + O) (row tiles of 4, then one of the 1-3 left); the first
// row tile prefetches the weight rows [o + O, min(o + 2 O, o_end)) of the next call.
template <int O, typename W>
ATTNSERVE_AVX512 void GemvFeatures512(const float* x, int64_t ldx, int64_t rows, const W* w,
                                      int64_t in, const float* bias, int64_t o, int64_t o_end,
                                      float* y, int64_t ldy) {
  const char* prefetch = reinterpret_cast<const char*>(w + std::min(o + O, o_end) * in);
  const char* prefetch_end = reinterpret_cast<const char*>(w + std::min(o + 2 * O, o_end) * in);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    GemvTile512<O, 4>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy, prefetch, prefetch_end);
    prefetch = prefetch_end;  // Later row tiles read the same weights, now in cache.
  }
  switch (rows - r) {
    case 3:
      GemvTile512<O, 3>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy, prefetch,
                        prefetch_end);
      break;
    case 2:
      GemvTile512<O, 2>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy, prefetch,
                        prefetch_end);
      break;
    case 1:
      GemvTile512<O, 1>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy, prefetch,
                        prefetch_end);
      break;
    default:
      break;
  }
}

template <typename W>
ATTNSERVE_AVX512 void GemvAvx512(const float* x, int64_t ldx, int64_t rows, const W* w,
                                 int64_t in, const float* bias, int64_t o_begin, int64_t o_end,
                                 float* y, int64_t ldy) {
  // 4 features per tile when a row tile holds 4 rows (16 accumulators), else 8 (<= 16).
  int64_t o = o_begin;
  if (rows >= 3) {
    for (; o + 4 <= o_end; o += 4) {
      GemvFeatures512<4>(x, ldx, rows, w, in, bias, o, o_end, y, ldy);
    }
  } else {
    for (; o + 8 <= o_end; o += 8) {
      GemvFeatures512<8>(x, ldx, rows, w, in, bias, o, o_end, y, ldy);
    }
  }
  for (; o < o_end; ++o) GemvFeatures512<1>(x, ldx, rows, w, in, bias, o, o_end, y, ldy);
}

#endif  // ATTNSERVE_X86_AVX512

template <typename W>
void GemvTiles(const float* x, int64_t ldx, int64_t rows, const W* w, int64_t in,
               const float* bias, int64_t o_begin, int64_t o_end, float* y, int64_t ldy) {
#ifdef ATTNSERVE_X86_AVX512
  // bf16 weights gain at every row count (1.28x at 1 row, 1.38x at 4-8, BM_SmallBatchGemv); f32
  // weights only from 3 rows (1.12x at 8): one f32 row is bound by the weight read and measured
  // 4% slower on 16 lanes than on 8.
  if (SimdKernelsUseAvx512() && (sizeof(W) == sizeof(uint16_t) || rows >= 3)) {
    GemvAvx512(x, ldx, rows, w, in, bias, o_begin, o_end, y, ldy);
    return;
  }
#endif
#ifdef ATTNSERVE_X86
  if (SimdKernelsUseAvx2()) {
    GemvAvx2(x, ldx, rows, w, in, bias, o_begin, o_end, y, ldy);
    return;
  }
#endif
  GemvPortable(x, ldx, rows, w, in, bias, o_begin, o_end, y, ldy);
}

}  // namespace

void SmallBatchGemv(const float* x, int64_t ldx, int64_t rows, const float* w, int64_t in,
                    const float* bias, int64_t o_begin, int64_t o_end, float* y, int64_t ldy) {
  GemvTiles(x, ldx, rows, w, in, bias, o_begin, o_end, y, ldy);
}

void SmallBatchGemv(const float* x, int64_t ldx, int64_t rows, const uint16_t* w, int64_t in,
                    const float* bias, int64_t o_begin, int64_t o_end, float* y, int64_t ldy) {
  GemvTiles(x, ldx, rows, w, in, bias, o_begin, o_end, y, ldy);
}

// ---- LinearForward ------------------------------------------------------------------------------

namespace {
// Below this many rows a row split would give each thread a sliver of a GEMM; split the weight's
// output features instead, which also splits the (dominant) weight traffic of decode.
constexpr int64_t kMinRowsPerThread = 32;
// GEMV work is split into chunks of output features taken one at a time by whichever thread is
// free, each a share of what is left (guided scheduling): the first chunks are long, so each
// thread streams long contiguous weight ranges with its prefetches running ahead (a chunk's first
// tile is the only one not prefetched), and the last are short, so the threads finish together
// (fixed blocks of 64 features left up to one block's time of one thread idle at the end: 1/15
// of the q/k/v projection at SmolLM2's shape, 1/9 of the output one). On a loaded machine a late
// thread still costs at most one chunk. A chunk is a multiple of kGemvChunkAlign features (the
// kernels' widest tile) but for the tail.
constexpr int64_t kGemvChunkAlign = 8;
// The share of the remaining features a chunk takes: 1 / (kGemvChunkShare * threads).
constexpr int64_t kGemvChunkShare = 2;
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
  const int threads = pool.num_threads();
  if (threads == 1 || w.out <= kGemvChunkAlign || rows * w.in * w.out < kMinParallelMacs) {
    block(0, w.out);
    return;
  }
  std::atomic<int64_t> next{0};
  // One item per thread; each takes chunks until none is left (a thread that starts late finds
  // the others have taken its share).
  pool.ParallelFor(threads, [&](int64_t) {
    int64_t begin = next.load(std::memory_order_relaxed);
    while (begin < w.out) {
      const int64_t share = (w.out - begin) / (kGemvChunkShare * threads);
      const int64_t chunk = std::max(kGemvChunkAlign, share / kGemvChunkAlign * kGemvChunkAlign);
      const int64_t end = std::min(w.out, begin + chunk);
      if (next.compare_exchange_weak(begin, end, std::memory_order_relaxed)) {
        block(begin, end);
        begin = next.load(std::memory_order_relaxed);
      }
    }
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
