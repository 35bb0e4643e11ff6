#include "kernels/cpu/small_batch_gemv.h"

#include "kernels/core/dtype.h"
#include "kernels/cpu/simd_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ATTNSERVE_X86 1
#define ATTNSERVE_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace attnserve {

namespace {

inline float Widen(float v) { return v; }
inline float Widen(uint16_t bits) { return BF16ToFloat(bits); }

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

ATTNSERVE_AVX2 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
ATTNSERVE_AVX2 inline __m256 Load8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

ATTNSERVE_AVX2 inline float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

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
      float sum = Sum8(acc[a][r]);
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

template <typename W>
void Gemv(const float* x, int64_t ldx, int64_t rows, const W* w, int64_t in, const float* bias,
          int64_t o_begin, int64_t o_end, float* y, int64_t ldy) {
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
