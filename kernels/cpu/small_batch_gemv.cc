#include "kernels/cpu/small_batch_gemv.h"

#include "kernels/core/dtype.h"
#include "kernels/cpu/avx2_helpers.h"
#include "kernels/cpu/avx512_helpers.h"
#include "kernels/cpu/simd_kernels.h"

namespace attnserve {

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
template <int O, int R, typename W>
ATTNSERVE_AVX2 void GemvTile(const float* x, int64_t ldx, const W* w, int64_t in, const float* bias,
                             int64_t o, float* y, int64_t ldy) {
  __m256 acc[O][R];
  for (int a = 0; a < O; ++a)
    for (int r = 0; r < R; ++r) acc[a][r] = _mm256_setzero_ps();
  const int64_t in8 = in / 8 * 8;
  for (int64_t i = 0; i < in8; i += 8) {
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
// once whatever the row count.
template <int O, typename W>
ATTNSERVE_AVX2 void GemvFeatures(const float* x, int64_t ldx, int64_t rows, const W* w, int64_t in,
                                 const float* bias, int64_t o, float* y, int64_t ldy) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) GemvTile<O, 4>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy);
  switch (rows - r) {
    case 3:
      GemvTile<O, 3>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy);
      break;
    case 2:
      GemvTile<O, 2>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy);
      break;
    case 1:
      GemvTile<O, 1>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy);
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
    for (; o + 2 <= o_end; o += 2) GemvFeatures<2>(x, ldx, rows, w, in, bias, o, y, ldy);
  } else {
    for (; o + 4 <= o_end; o += 4) GemvFeatures<4>(x, ldx, rows, w, in, bias, o, y, ldy);
  }
  for (; o < o_end; ++o) GemvFeatures<1>(x, ldx, rows, w, in, bias, o, y, ldy);
}

#endif  // ATTNSERVE_X86

#ifdef ATTNSERVE_X86_AVX512

// The AVX-512 version of GemvTile: 16 lanes, and with 32 registers up to 16 accumulators
// (O * R <= 16), so each weight vector serves 4 rows and each x vector 4 features.
template <int O, int R, typename W>
ATTNSERVE_AVX512 void GemvTile512(const float* x, int64_t ldx, const W* w, int64_t in,
                                  const float* bias, int64_t o, float* y, int64_t ldy) {
  __m512 acc[O][R];
  for (int a = 0; a < O; ++a)
    for (int r = 0; r < R; ++r) acc[a][r] = _mm512_setzero_ps();
  const int64_t in16 = in / 16 * 16;
  for (int64_t i = 0; i < in16; i += 16) {
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

template <int O, typename W>
ATTNSERVE_AVX512 void GemvFeatures512(const float* x, int64_t ldx, int64_t rows, const W* w,
                                      int64_t in, const float* bias, int64_t o, float* y,
                                      int64_t ldy) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    GemvTile512<O, 4>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy);
  }
  switch (rows - r) {
    case 3:
      GemvTile512<O, 3>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy);
      break;
    case 2:
      GemvTile512<O, 2>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy);
      break;
    case 1:
      GemvTile512<O, 1>(x + r * ldx, ldx, w, in, bias, o, y + r * ldy, ldy);
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
    for (; o + 4 <= o_end; o += 4) GemvFeatures512<4>(x, ldx, rows, w, in, bias, o, y, ldy);
  } else {
    for (; o + 8 <= o_end; o += 8) GemvFeatures512<8>(x, ldx, rows, w, in, bias, o, y, ldy);
  }
  for (; o < o_end; ++o) GemvFeatures512<1>(x, ldx, rows, w, in, bias, o, y, ldy);
}

#endif  // ATTNSERVE_X86_AVX512

template <typename W>
void Gemv(const float* x, int64_t ldx, int64_t rows, const W* w, int64_t in, const float* bias,
          int64_t o_begin, int64_t o_end, float* y, int64_t ldy) {
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
  Gemv(x, ldx, rows, w, in, bias, o_begin, o_end, y, ldy);
}

void SmallBatchGemv(const float* x, int64_t ldx, int64_t rows, const uint16_t* w, int64_t in,
                    const float* bias, int64_t o_begin, int64_t o_end, float* y, int64_t ldy) {
  Gemv(x, ldx, rows, w, in, bias, o_begin, o_end, y, ldy);
}

}  // namespace attnserve
