#include "kernels/cpu/group_tiles_avx512.h"

#include "kernels/cpu/simd_kernels.h"

namespace attnserve::avx512 {

#ifdef ATTNSERVE_X86_AVX512

namespace {

// Key rows (scores) and value rows (P·V) are prefetched this many keys ahead of the tile reading
// them.
constexpr int kPrefetchKeys = 8;

// Scores of query rows [0, R) (q rows `dim` apart) against keys[0, K): an R x K tile of zmm
// accumulators over the head dimension, then reduced (each zmm's halves added, then 8 sums per
// avx2::Reduce8) into out[r * ld + k].
template <int R, int K, typename Element>
ATTNSERVE_AVX512 inline void ScoresTile(const float* q, int64_t dim, const Element* const* keys,
                                        float* out, int64_t ld) {
  __m512 acc[R][K];
#pragma GCC unroll 16
  for (int i = 0; i < R * K; ++i) acc[i / K][i % K] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; d += 16) {
    __m512 y[K];
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) y[k] = Load16(keys[k] + d);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_loadu_ps(q + r * dim + d);
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) acc[r][k] = _mm512_fmadd_ps(x, y[k], acc[r][k]);
    }
  }
  if constexpr (R * K == 1) {
    out[0] = _mm512_reduce_add_ps(acc[0][0]);
  } else {
    // Halves first: Reduce8 then sums 8 ymm at once (R * K is 4, 8 or 16 here; 4 is padded).
    constexpr int kGroups = (R * K + 7) / 8;
    __m256 h[kGroups * 8];
#pragma GCC unroll 16
    for (int i = 0; i < kGroups * 8; ++i) {
      const __m512 a = acc[(i % (R * K)) / K][i % K];
      h[i] = _mm256_add_ps(_mm512_castps512_ps256(a),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    }
#pragma GCC unroll 2
    for (int g = 0; g < kGroups; ++g) {
      const __m256 sums = avx2::Reduce8(h[8 * g], h[8 * g + 1], h[8 * g + 2], h[8 * g + 3],
                                        h[8 * g + 4], h[8 * g + 5], h[8 * g + 6], h[8 * g + 7]);
      if constexpr (K == 8) {
        _mm256_storeu_ps(out + g * ld, sums);
      } else if constexpr (K == 4) {
        _mm_storeu_ps(out + (2 * g) * ld, _mm256_castps256_ps128(sums));
        if (2 * g + 1 < R) _mm_storeu_ps(out + (2 * g + 1) * ld, _mm256_extractf128_ps(sums, 1));
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, sums);
        for (int j = 0; j < 8 && 8 * g + j < R * K; ++j) {
          out[((8 * g + j) / K) * ld + (8 * g + j) % K] = tmp[j];
        }
      }
    }
  }
}

// Rows [0, rows) in quads, then a pair and a single, against keys[0, K).
template <int K, typename Element>
ATTNSERVE_AVX512 inline void ScoresColumn(const float* q, int rows, int64_t dim,
                                          const Element* const* keys, float* out, int64_t ld) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) ScoresTile<4, K>(q + r * dim, dim, keys, out + r * ld, ld);
  if (r + 2 <= rows) {
    ScoresTile<2, K>(q + r * dim, dim, keys, out + r * ld, ld);
    r += 2;
  }
  if (r < rows) ScoresTile<1, K>(q + r * dim, dim, keys, out + r * ld, ld);
}

// acc rows [0, R) (`dim` apart), columns [d0, d0 + 16 C) += P · V over value rows [0, count):
// the R x C zmm tile stays in registers over the run. `prefetch` (the first row quad of a column
// chunk): requests the chunk of the value row kPrefetchKeys ahead, which the scores pass did not
// touch (values live apart from keys in MHA/GQA pages).
template <int R, int C, typename Element>
ATTNSERVE_AVX512 inline void AccumulateTile(const float* w, int64_t ld,
                                            const Element* const* value_rows, int count,
                                            int64_t d0, float* y, int64_t dim, bool prefetch) {
  __m512 acc[R][C];
#pragma GCC unroll 16
  for (int i = 0; i < R * C; ++i) {
    acc[i / C][i % C] = _mm512_loadu_ps(y + (i / C) * dim + d0 + 16 * (i % C));
  }
  for (int s = 0; s < count; ++s) {
    if (prefetch && s + kPrefetchKeys < count) {
      const char* ahead = reinterpret_cast<const char*>(value_rows[s + kPrefetchKeys] + d0);
#pragma GCC unroll 4
      for (int b = 0; b < C * 16 * static_cast<int>(sizeof(Element)); b += 64) {
        _mm_prefetch(ahead + b, _MM_HINT_T0);
      }
    }
    const Element* v = value_rows[s] + d0;
    __m512 x[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) x[c] = Load16(v + 16 * c);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_set1_ps(w[r * ld + s]);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(p, x[c], acc[r][c]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < R * C; ++i) {
    _mm512_storeu_ps(y + (i / C) * dim + d0 + 16 * (i % C), acc[i / C][i % C]);
  }
}

template <int C, typename Element>
ATTNSERVE_AVX512 inline void AccumulateColumns(const float* weights, int64_t ld, int rows,
                                               const Element* const* value_rows, int count,
                                               int64_t d0, float* acc, int64_t dim) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) {
    AccumulateTile<4, C>(weights + r * ld, ld, value_rows, count, d0, acc + r * dim, dim, r == 0);
  }
  if (r + 2 <= rows) {
    AccumulateTile<2, C>(weights + r * ld, ld, value_rows, count, d0, acc + r * dim, dim, r == 0);
    r += 2;
  }
  if (r < rows) {
    AccumulateTile<1, C>(weights + r * ld, ld, value_rows, count, d0, acc + r * dim, dim, r == 0);
  }
}

}  // namespace

template <typename Element>
ATTNSERVE_AVX512 void GroupScores(const float* q, int rows, int64_t dim,
                                  const Element* const* key_rows, int count, float* scores,
                                  int64_t ld) {
  int s = 0;
  if (rows == 1) {
    for (; s + 8 <= count; s += 8) ScoresTile<1, 8>(q, dim, key_rows + s, scores + s, ld);
  }
  for (; s + 4 <= count; s += 4) {
    // The key rows a few tiles ahead: a block's rows sit in pages whose 4 KiB runs the hardware
    // prefetcher picks up late, and with one KV head nothing else requests them early.
    if (s + kPrefetchKeys + 4 <= count) {
      for (int k = s + kPrefetchKeys; k < s + kPrefetchKeys + 4; ++k) {
        const char* row = reinterpret_cast<const char*>(key_rows[k]);
        for (int64_t b = 0; b < dim * int64_t{sizeof(Element)}; b += 64) {
          _mm_prefetch(row + b, _MM_HINT_T0);
        }
      }
    }
    ScoresColumn<4>(q, rows, dim, key_rows + s, scores + s, ld);
  }
  for (; s < count; ++s) ScoresColumn<1>(q, rows, dim, key_rows + s, scores + s, ld);
}

template <typename Element>
ATTNSERVE_AVX512 void GroupAccumulate(const float* weights, int64_t ld, int rows,
                                      const Element* const* value_rows, int count, int64_t dim,
                                      float* acc) {
  int64_t d0 = 0;
  for (; d0 + 64 <= dim; d0 += 64) {
    AccumulateColumns<4>(weights, ld, rows, value_rows, count, d0, acc, dim);
  }
  for (; d0 < dim; d0 += 16) AccumulateColumns<1>(weights, ld, rows, value_rows, count, d0, acc, dim);
}

template void GroupScores<float>(const float*, int, int64_t, const float* const*, int, float*,
                                 int64_t);
template void GroupScores<uint16_t>(const float*, int, int64_t, const uint16_t* const*, int, float*,
                                    int64_t);
template void GroupAccumulate<float>(const float*, int64_t, int, const float* const*, int, int64_t,
                                     float*);
template void GroupAccumulate<uint16_t>(const float*, int64_t, int, const uint16_t* const*, int,
                                        int64_t, float*);

#endif  // ATTNSERVE_X86_AVX512

}  // namespace attnserve::avx512
