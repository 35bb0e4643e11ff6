#include "kernels/cpu/linear.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <vector>

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

// bf16 weights on AVX-512 read 32 weights (one cache line of a row) per load and widen them in
// two single-uop steps instead of two shuffle-and-shift pairs: a 32-bit lane j of the line holds
// weights 2j (low half) and 2j + 1 (high half), so `lane << 16` is weight 2j as a float and
// `lane & 0xffff0000` weight 2j + 1. x is deinterleaved to match once per projection
// (Bf16PairX): per 32-block, its 16 even elements and then its 16 odd ones; elements past the
// last whole block are copied as they are. Lane j then sums x[2j] w[2j] + x[2j+1] w[2j+1] per
// block, another order than the 16-wide tile's (the float64-reference tests bound both).
// At batch 1-8 this is a quarter to a half of the tile's vector uops (BM_SmolStep's bf16 rows).
ATTNSERVE_AVX512 void Bf16PairX(const float* x, int64_t ldx, int64_t rows, int64_t in, float* xp) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const int64_t in32 = in / 32 * 32;
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x + r * ldx;
    float* dst = xp + r * in;
    for (int64_t i = 0; i < in32; i += 32) {
      const __m512 a = _mm512_loadu_ps(src + i), b = _mm512_loadu_ps(src + i + 16);
      _mm512_storeu_ps(dst + i, _mm512_permutex2var_ps(a, even, b));
      _mm512_storeu_ps(dst + i + 16, _mm512_permutex2var_ps(a, odd, b));
    }
    std::copy(src + in32, src + in, dst + in32);
  }
}

// The tile of GemvTile512 for bf16 weights and Bf16PairX's x (row stride `in`): O features x R
// rows, O * R <= 16 accumulators, 2 O weight vectors per line of each row.
template <int O, int R>
ATTNSERVE_AVX512 void Bf16PairTile512(const float* xp, const uint16_t* w, int64_t in,
                                      const float* bias, int64_t o, float* y, int64_t ldy,
                                      const char* prefetch, const char* prefetch_end) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  __m512 acc[O][R];
  for (int a = 0; a < O; ++a)
    for (int r = 0; r < R; ++r) acc[a][r] = _mm512_setzero_ps();
  const int64_t in32 = in / 32 * 32;
  for (int64_t i = 0; i < in32; i += 32) {
    if (prefetch < prefetch_end) {  // O lines of weights per iteration.
      for (int l = 0; l < O; ++l) _mm_prefetch(prefetch + 64 * l, _MM_HINT_T0);
      prefetch += 64 * O;
    }
    __m512 w_even[O], w_odd[O];
    for (int a = 0; a < O; ++a) {
      const __m512i line = _mm512_loadu_si512(w + (o + a) * in + i);
      w_even[a] = _mm512_castsi512_ps(_mm512_slli_epi32(line, 16));
      w_odd[a] = _mm512_castsi512_ps(_mm512_and_si512(line, high));
    }
    for (int r = 0; r < R; ++r) {
      const __m512 xe = _mm512_loadu_ps(xp + r * in + i);
      const __m512 xo = _mm512_loadu_ps(xp + r * in + i + 16);
      for (int a = 0; a < O; ++a) {
        acc[a][r] = _mm512_fmadd_ps(xe, w_even[a], acc[a][r]);
        acc[a][r] = _mm512_fmadd_ps(xo, w_odd[a], acc[a][r]);
      }
    }
  }
  int64_t i = in32;
  if (in - in32 >= 16) {  // One 16-wide block left, in order.
    for (int a = 0; a < O; ++a) {
      const __m512 wv = avx512::Load16(w + (o + a) * in + i);
      for (int r = 0; r < R; ++r) {
        acc[a][r] = _mm512_fmadd_ps(_mm512_loadu_ps(xp + r * in + i), wv, acc[a][r]);
      }
    }
    i += 16;
  }
  for (int a = 0; a < O; ++a) {
    const uint16_t* w_row = w + (o + a) * in;
    for (int r = 0; r < R; ++r) {
      float sum = avx512::HorizontalSum(acc[a][r]);
      for (int64_t t = i; t < in; ++t) sum += xp[r * in + t] * Widen(w_row[t]);
      y[r * ldy + o + a] = sum + (bias != nullptr ? bias[o + a] : 0.0f);
    }
  }
}

// Output features [o, o + O) for all `rows` (<= kGemvMaxRows) in one row tile, so each line of
// weights is widened once however many rows use it; prefetches the next O features' rows.
template <int O>
ATTNSERVE_AVX512 void Bf16PairFeatures512(const float* xp, int64_t rows, const uint16_t* w,
                                          int64_t in, const float* bias, int64_t o, int64_t o_end,
                                          float* y, int64_t ldy) {
  const char* prefetch = reinterpret_cast<const char*>(w + std::min(o + O, o_end) * in);
  const char* prefetch_end = reinterpret_cast<const char*>(w + std::min(o + 2 * O, o_end) * in);
  switch (rows) {
#define ATTNSERVE_PAIR_TILE(R)                                                             \
  case R:                                                                                  \
    if constexpr (O * R <= 16) {                                                           \
      Bf16PairTile512<O, R>(xp, w, in, bias, o, y, ldy, prefetch, prefetch_end);           \
    }                                                                                      \
    break;
    ATTNSERVE_PAIR_TILE(1)
    ATTNSERVE_PAIR_TILE(2)
    ATTNSERVE_PAIR_TILE(3)
    ATTNSERVE_PAIR_TILE(4)
    ATTNSERVE_PAIR_TILE(5)
    ATTNSERVE_PAIR_TILE(6)
    ATTNSERVE_PAIR_TILE(7)
    ATTNSERVE_PAIR_TILE(8)
#undef ATTNSERVE_PAIR_TILE
    default:
      break;
  }
}

// SmallBatchGemv of bf16 weights on AVX-512 with x already through Bf16PairX; rows <=
// kGemvMaxRows. 8 features per tile at 1-2 rows, 4 at 3-4, 2 at 5-8 (<= 16 accumulators).
ATTNSERVE_AVX512 void Bf16PairGemv512(const float* xp, int64_t rows, const uint16_t* w, int64_t in,
                                      const float* bias, int64_t o_begin, int64_t o_end, float* y,
                                      int64_t ldy) {
  int64_t o = o_begin;
  if (rows <= 2) {
    for (; o + 8 <= o_end; o += 8) Bf16PairFeatures512<8>(xp, rows, w, in, bias, o, o_end, y, ldy);
  } else if (rows <= 4) {
    for (; o + 4 <= o_end; o += 4) Bf16PairFeatures512<4>(xp, rows, w, in, bias, o, o_end, y, ldy);
  } else {
    for (; o + 2 <= o_end; o += 2) Bf16PairFeatures512<2>(xp, rows, w, in, bias, o, o_end, y, ldy);
  }
  for (; o < o_end; ++o) Bf16PairFeatures512<1>(xp, rows, w, in, bias, o, o_end, y, ldy);
}

// Bf16PairX's output for up to kGemvMaxRows rows, per thread, grown only.
float* Bf16PairScratch(int64_t floats) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < floats) scratch.resize(floats);
  return scratch.data();
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
    if constexpr (sizeof(W) == sizeof(uint16_t)) {
      if (rows <= kGemvMaxRows) {
        float* xp = Bf16PairScratch(rows * in);
        Bf16PairX(x, ldx, rows, in, xp);
        Bf16PairGemv512(xp, rows, w, in, bias, o_begin, o_end, y, ldy);
        return;
      }
    }
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
  // bf16 weights on AVX-512: x deinterleaved once here (on the caller's scratch, which outlives
  // the loop below) rather than once per chunk.
  const float* bf16_pair_x = nullptr;
#ifdef ATTNSERVE_X86_AVX512
  if (w.bf16 != nullptr && SimdKernelsUseAvx512()) {
    float* xp = Bf16PairScratch(rows * w.in);
    Bf16PairX(x, ldx, rows, w.in, xp);
    bf16_pair_x = xp;
  }
#endif
  auto block = [&](int64_t begin, int64_t end) {
    if (w.f32 != nullptr) {
      SmallBatchGemv(x, ldx, rows, w.f32, w.in, bias, begin, end, y, ldy);
    } else if (bf16_pair_x != nullptr) {
#ifdef ATTNSERVE_X86_AVX512
      Bf16PairGemv512(bf16_pair_x, rows, w.bf16, w.in, bias, begin, end, y, ldy);
#endif
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
