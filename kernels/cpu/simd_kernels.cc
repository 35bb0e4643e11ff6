#include "kernels/cpu/simd_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

// ---- AVX-512F register tiles of the decode attention's two group loops (GroupScores and
// GroupAccumulate, simd_kernels.h), which serve every query row of a KV head (a GQA/MQA group, or
// all heads of absorbed MLA) from each K/V row: the dispatch below takes them when
// SimdKernelsUseAvx512() and the dimension is a multiple of 16, beside the AVX2 tiles and the
// portable loops of the same two functions.
//
//   GroupScores      8 query rows x 2 keys (16 zmm accumulators) while 8 rows are left (MQA,
//                    absorbed MLA: a whole group), each loaded key chunk widened once for all 8
//                    rows and the 16 sums reduced by one transposing tree; then 4 query rows x 4
//                    keys (each key chunk serving 4 rows, each query chunk 4 keys); three rows
//                    left: 3 x 4; one row: 1 x 8.
//   GroupAccumulate  8 rows x 48 columns (24 zmm) while 8 rows are left, then 4 rows x 64
//                    columns (16 zmm; three rows left: 3 x 64), the accumulator tile in registers
//                    over the whole run of value rows: each value chunk is loaded once per tile,
//                    the weights broadcast from memory. Column chunks outside, rows inside, so a
//                    chunk of the run's value rows stays in L1 across row tiles.
//   bf16 in the 8-row tiles: 32 values per load, split into even and odd floats (a shift and a
//   mask, no zero-extension), q and the accumulator columns taken in that even/odd order.
//
// Why: grouped decode (GQA-4, MQA, absorbed MLA: 4-16 query rows per K/V row) was compute-bound
// on AVX2's 16 registers of 8 lanes at 0.25-0.66 of the read ceiling (docs/benchmarks.md); with
// 4-row tiles an 8-row group still widened every bf16 K/V chunk twice and re-read each P·V chunk
// from L2 (a 128-key run of 64 f32 columns is 32 KiB, L1's size).

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
    // Halves first: Reduce8 then sums 8 ymm at once (R * K is 3, 4, 8, 12 or 16 here: a group
    // of 8 is padded with repeats, which are not stored).
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

// Rows [0, rows) in quads, then a triple, or a pair and a single, against keys[0, K). Three rows
// left (SmolLM2's 9 / 3 heads, GQA-3) take one 3-row tile: each key chunk loaded once for all
// three rather than once for a pair and again for the single row.
template <int K, typename Element>
ATTNSERVE_AVX512 inline void ScoresColumn(const float* q, int rows, int64_t dim,
                                          const Element* const* keys, float* out, int64_t ld) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) ScoresTile<4, K>(q + r * dim, dim, keys, out + r * ld, ld);
  if (rows - r == 3) {
    ScoresTile<3, K>(q + r * dim, dim, keys, out + r * ld, ld);
    return;
  }
  if (r + 2 <= rows) {
    ScoresTile<2, K>(q + r * dim, dim, keys, out + r * ld, ld);
    r += 2;
  }
  if (r < rows) ScoresTile<1, K>(q + r * dim, dim, keys, out + r * ld, ld);
}

// Sums of 16 zmm accumulators in one zmm: lane j = v[j][0] + ... + v[j][15]. A transposing tree
// (30 shuffles, 15 adds for 16 sums, against 16 extracts and two hadd trees before): pairs within
// each 128-bit lane, then 64-bit halves, then the 128-bit lanes twice.
ATTNSERVE_AVX512 __attribute__((always_inline)) inline __m512 Reduce16(const __m512* v) {
  __m512 w[8], u[4], t[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(w[2 * i]), b = _mm512_castps_pd(w[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // u[i]'s 128-bit lane L holds the partial sums of v[4i, 4i + 4) over lane L.
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(t[0], t[1], 0x88),
                       _mm512_shuffle_f32x4(t[0], t[1], 0xDD));
}

// 32 bf16 values from p[0, 32) as two float vectors, even = p[0, 2, ..., 30] and
// odd = p[1, 3, ..., 31]: one load and one shift or mask per 16 values (a bf16 is the high half
// of a float, and element 2i + 1 already sits in the high half of 32-bit lane i), against a
// zero-extension and a shift for Load16. Callers keep their query or accumulator columns in the
// same even/odd order (EvenOddOrder).
ATTNSERVE_AVX512 inline void LoadEvenOdd32(const uint16_t* p, __m512* even, __m512* odd) {
  const __m512i bits = _mm512_loadu_si512(p);
  *even = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
  *odd = _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(0xFFFF0000u)));
}

// out[r * dim, +dim) = q's row r with each whole 32-column block reordered as its 16 even columns
// then its 16 odd ones (the order LoadEvenOdd32 gives); a last 16-column block stays as it is.
// Two permutes per 32 columns (it ran once per block of keys, as scalar moves: ~4 per key of MQA).
ATTNSERVE_AVX512 inline void EvenOddOrder(const float* q, int rows, int64_t dim, float* out) {
  const __m512i even_index =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_index =
      _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int r = 0; r < rows; ++r) {
    const float* in = q + r * dim;
    float* o = out + r * dim;
    int64_t d = 0;
    for (; d + 32 <= dim; d += 32) {
      const __m512 lo = _mm512_loadu_ps(in + d), hi = _mm512_loadu_ps(in + d + 16);
      _mm512_storeu_ps(o + d, _mm512_permutex2var_ps(lo, even_index, hi));
      _mm512_storeu_ps(o + d + 16, _mm512_permutex2var_ps(lo, odd_index, hi));
    }
    for (; d < dim; ++d) o[d] = in[d];
  }
}

// Scores of 8 query rows (q rows `dim` apart) against keys[0, 2): 16 zmm accumulators over the
// head dimension, each loaded key chunk widened once for all 8 rows and the query chunks taken
// from L1 as FMA memory operands; then one Reduce16 into out[r * ld + k]. bf16 keys: q in
// EvenOddOrder. Always inlined into GroupScores' loop over key pairs (measured: MQA bf16 kernel
// 1.86 -> 1.70 ms of CPU, MLA bf16 4.42 -> 4.15, one thread, three runs each alternated).
template <typename Element>
ATTNSERVE_AVX512 __attribute__((always_inline)) inline void ScoresTile8x2(
    const float* q, int64_t dim, const Element* const* keys, float* out, int64_t ld) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  const Element* const k0 = keys[0];
  const Element* const k1 = keys[1];
  int64_t d = 0;
  if constexpr (std::is_same_v<Element, uint16_t>) {
    // bf16 keys: q is in EvenOddOrder, so each 32-column block of a key is two vectors (one
    // load, one shift, one mask) that meet q's even and odd halves.
    for (; d + 32 <= dim; d += 32) {
      __m512 e0, o0, e1, o1;
      LoadEvenOdd32(k0 + d, &e0, &o0);
      LoadEvenOdd32(k1 + d, &e1, &o1);
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        const __m512 xe = _mm512_loadu_ps(q + r * dim + d);
        const __m512 xo = _mm512_loadu_ps(q + r * dim + d + 16);
        acc[2 * r] = _mm512_fmadd_ps(xo, o0, _mm512_fmadd_ps(xe, e0, acc[2 * r]));
        acc[2 * r + 1] = _mm512_fmadd_ps(xo, o1, _mm512_fmadd_ps(xe, e1, acc[2 * r + 1]));
      }
    }
  }
  for (; d < dim; d += 16) {
    const __m512 y0 = Load16(k0 + d);
    const __m512 y1 = Load16(k1 + d);
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      const __m512 x = _mm512_loadu_ps(q + r * dim + d);
      acc[2 * r] = _mm512_fmadd_ps(x, y0, acc[2 * r]);
      acc[2 * r + 1] = _mm512_fmadd_ps(x, y1, acc[2 * r + 1]);
    }
  }
  alignas(64) float sums[16];
  _mm512_store_ps(sums, Reduce16(acc));
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    out[r * ld] = sums[2 * r];
    out[r * ld + 1] = sums[2 * r + 1];
  }
}

// acc rows [0, 8) (`dim` apart), columns [d0, d0 + 16 C) += P · V over value rows [0, count): an
// 8 x C zmm tile (C <= 3: 24 accumulators) held over the run, each value chunk loaded and widened
// once for all 8 rows, the weights broadcast from memory into the FMAs. Requests the tile's chunk
// of the value row kPrefetchKeys ahead (MHA/GQA/MQA values live apart from the keys the scores
// pass read).
template <int C, typename Element>
ATTNSERVE_AVX512 inline void AccumulateTile8(const float* w, int64_t ld,
                                             const Element* const* value_rows, int count,
                                             int64_t d0, float* y, int64_t dim) {
  __m512 acc[8][C];
#pragma GCC unroll 24
  for (int i = 0; i < 8 * C; ++i) {
    acc[i / C][i % C] = _mm512_loadu_ps(y + (i / C) * dim + d0 + 16 * (i % C));
  }
  for (int s = 0; s < count; ++s) {
    if (s + kPrefetchKeys < count) {
      const char* ahead = reinterpret_cast<const char*>(value_rows[s + kPrefetchKeys] + d0);
#pragma GCC unroll 3
      for (int b = 0; b < C * 16 * static_cast<int>(sizeof(Element)); b += 64) {
        _mm_prefetch(ahead + b, _MM_HINT_T0);
      }
    }
    const Element* v = value_rows[s] + d0;
    __m512 x[C];
#pragma GCC unroll 3
    for (int c = 0; c < C; ++c) x[c] = Load16(v + 16 * c);
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      const __m512 p = _mm512_set1_ps(w[r * ld + s]);
#pragma GCC unroll 3
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(p, x[c], acc[r][c]);
    }
  }
#pragma GCC unroll 24
  for (int i = 0; i < 8 * C; ++i) {
    _mm512_storeu_ps(y + (i / C) * dim + d0 + 16 * (i % C), acc[i / C][i % C]);
  }
}

// acc rows [0, 8) (`dim` apart), columns [d0, d0 + 32) += P · V over bf16 value rows [0, count):
// the tile held as even and odd columns (16 zmm), so each 32-value chunk is one load, one shift and
// one mask for all 8 rows; the accumulator columns are put in that order on load and back on
// store (two permutes per 32 columns and row, once per run).
ATTNSERVE_AVX512 inline void AccumulateTile8EvenOdd(const float* w, int64_t ld,
                                                    const uint16_t* const* value_rows, int count,
                                                    int64_t d0, float* y, int64_t dim) {
  const __m512i even_index =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_index =
      _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  __m512 even[8], odd[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    const __m512 lo = _mm512_loadu_ps(y + r * dim + d0);
    const __m512 hi = _mm512_loadu_ps(y + r * dim + d0 + 16);
    even[r] = _mm512_permutex2var_ps(lo, even_index, hi);
    odd[r] = _mm512_permutex2var_ps(lo, odd_index, hi);
  }
  for (int s = 0; s < count; ++s) {
    if (s + kPrefetchKeys < count) {
      _mm_prefetch(reinterpret_cast<const char*>(value_rows[s + kPrefetchKeys] + d0), _MM_HINT_T0);
    }
    __m512 e, o;
    LoadEvenOdd32(value_rows[s] + d0, &e, &o);
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      const __m512 p = _mm512_set1_ps(w[r * ld + s]);
      even[r] = _mm512_fmadd_ps(p, e, even[r]);
      odd[r] = _mm512_fmadd_ps(p, o, odd[r]);
    }
  }
  const __m512i low_index =
      _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i high_index =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    _mm512_storeu_ps(y + r * dim + d0, _mm512_permutex2var_ps(even[r], low_index, odd[r]));
    _mm512_storeu_ps(y + r * dim + d0 + 16, _mm512_permutex2var_ps(even[r], high_index, odd[r]));
  }
}

// Rows [0, 8) over all of [0, dim): bf16 values in 32-column even/odd tiles; f32 values (and a
// last 16 bf16 columns) in column tiles of 3 chunks (2 or 1 at the end, so no tile is a lone chunk
// when it can be avoided: 16 chunks are 3+3+3+3+2+2).
template <typename Element>
ATTNSERVE_AVX512 inline void AccumulateRows8(const float* weights, int64_t ld,
                                             const Element* const* value_rows, int count,
                                             int64_t dim, float* acc) {
  int64_t d0 = 0;
  if constexpr (std::is_same_v<Element, uint16_t>) {
    for (; d0 + 32 <= dim; d0 += 32) {
      AccumulateTile8EvenOdd(weights, ld, value_rows, count, d0, acc, dim);
    }
  }
  while (d0 < dim) {
    const int64_t chunks = (dim - d0) / 16;
    if (chunks % 3 == 0 || chunks >= 5) {
      AccumulateTile8<3>(weights, ld, value_rows, count, d0, acc, dim);
      d0 += 48;
    } else if (chunks >= 2) {
      AccumulateTile8<2>(weights, ld, value_rows, count, d0, acc, dim);
      d0 += 32;
    } else {
      AccumulateTile8<1>(weights, ld, value_rows, count, d0, acc, dim);
      d0 += 16;
    }
  }
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
  // Three rows left: one 3-row tile, each value chunk loaded once for all three (as ScoresColumn).
  if (rows - r == 3) {
    AccumulateTile<3, C>(weights + r * ld, ld, value_rows, count, d0, acc + r * dim, dim, r == 0);
    return;
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

// q's rows as the tiles below read them: bf16 keys: each whole 8-row group in EvenOddOrder, the
// rows left over as they are; f32 keys: as they are.
ATTNSERVE_AVX512 void GroupScoresQuery(const float* q, int rows, int64_t dim, bool bf16_keys,
                                       float* out) {
  const int reordered = bf16_keys ? rows / 8 * 8 : 0;
  EvenOddOrder(q, reordered, dim, out);
  std::memcpy(out + reordered * dim, q + reordered * dim, sizeof(float) * (rows - reordered) * dim);
}

// scores[g * ld + s] = q[g * dim, +dim) . key_rows[s][0, dim) for g < rows, s < count, keys
// stored as float or as bf16 bits (Element float or uint16_t); dim % 16 == 0; q laid out by
// GroupScoresQuery. The AVX-512 target is on the template's first declaration: GCC takes a
// function template's target from there, and without it a portable build (ATTNSERVE_NATIVE=OFF)
// could not inline the always-inline tiles.
template <typename Element>
ATTNSERVE_AVX512 void GroupScores(const float* q, int rows, int64_t dim,
                                  const Element* const* key_rows, int count, float* scores,
                                  int64_t ld) {
  const int rows8 = rows / 8 * 8;
  // Groups of 8 and more rows (MQA, absorbed MLA): 8 rows x 2 keys, each key row widened once per
  // 8 rows rather than per 4. What is left of the rows takes the quads below.
  if (rows8 > 0) {
    const float* q8 = q;
    const int count2 = count / 2 * 2;
    for (int s = 0; s < count2; s += 2) {
      if (s + kPrefetchKeys + 2 <= count) {
        for (int k = s + kPrefetchKeys; k < s + kPrefetchKeys + 2; ++k) {
          const char* row = reinterpret_cast<const char*>(key_rows[k]);
          for (int64_t b = 0; b < dim * int64_t{sizeof(Element)}; b += 64) {
            _mm_prefetch(row + b, _MM_HINT_T0);
          }
        }
      }
      for (int r = 0; r < rows8; r += 8) {
        ScoresTile8x2(q8 + r * dim, dim, key_rows + s, scores + r * ld + s, ld);
      }
    }
    if (count2 < count) {
      for (int r = 0; r < rows8; r += 8) {
        if constexpr (std::is_same_v<Element, uint16_t>) {
          // q is in EvenOddOrder, which only the 8 x 2 tile reads: the last key as both keys.
          const Element* const last[2] = {key_rows[count2], key_rows[count2]};
          float pair[16];
          ScoresTile8x2(q8 + r * dim, dim, last, pair, 2);
          for (int g = 0; g < 8; ++g) scores[(r + g) * ld + count2] = pair[2 * g];
        } else {
          ScoresColumn<1>(q8 + r * dim, 8, dim, key_rows + count2, scores + r * ld + count2, ld);
        }
      }
    }
    if (rows8 == rows) return;
    scores += rows8 * ld;
  }
  q += rows8 * dim;
  rows -= rows8;
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

// acc[g * dim, +dim) += sum_s weights[g * ld + s] * value_rows[s][0, dim) for g < rows;
// dim % 16 == 0.
template <typename Element>
ATTNSERVE_AVX512 void GroupAccumulate(const float* weights, int64_t ld, int rows,
                                      const Element* const* value_rows, int count, int64_t dim,
                                      float* acc) {
  // Groups of 8 and more rows: 8 rows x up to 48 columns, each value chunk widened once per 8 rows.
  const int rows8 = rows / 8 * 8;
  for (int r = 0; r < rows8; r += 8) {
    AccumulateRows8(weights + r * ld, ld, value_rows, count, dim, acc + r * dim);
  }
  if (rows8 == rows) return;
  weights += rows8 * ld;
  acc += rows8 * dim;
  rows -= rows8;
  int64_t d0 = 0;
  for (; d0 + 64 <= dim; d0 += 64) {
    AccumulateColumns<4>(weights, ld, rows, value_rows, count, d0, acc, dim);
  }
  for (; d0 < dim; d0 += 16) AccumulateColumns<1>(weights, ld, rows, value_rows, count, d0, acc, dim);
}

#endif  // ATTNSERVE_X86_AVX512

}  // namespace attnserve::avx512

namespace attnserve {

namespace {

// ---- Portable versions (the reference semantics; also what non-AVX2 CPUs run).

void OnlineSoftmaxRowPortable(float* s, int64_t count, int64_t lo, int64_t hi, float scale,
                              const AttentionVariation& variation, const LogitSite& site,
                              float* max, float* sum, float* acc, int64_t value_dim) {
  if (scale != 1.0f) {
    for (int64_t k = lo; k < hi; ++k) s[k] *= scale;
  }
  variation.TransformLogits(s + lo, hi - lo, {site.head, site.query, site.first_key + lo});
  float block_max = -std::numeric_limits<float>::infinity();
  for (int64_t k = lo; k < hi; ++k) block_max = std::max(block_max, s[k]);
  const float new_max = std::max(*max, block_max);
  const float correction = std::exp(*max - new_max);
  if (correction != 1.0f) {
    *sum *= correction;
    Scale(correction, acc, value_dim);
  }
  float block_sum = 0.0f;
  std::fill(s, s + lo, 0.0f);
#pragma omp simd reduction(+ : block_sum)
  for (int64_t k = lo; k < hi; ++k) {
    s[k] = ExpApprox(s[k] - new_max);
    block_sum += s[k];
  }
  std::fill(s + hi, s + count, 0.0f);
  *sum += block_sum;
  *max = new_max;
}

template <typename Element>
void GroupScoresPortable(const float* q, int rows, int64_t dim, const Element* const* key_rows,
                         int count, float* scores, int64_t ld) {
  const int count4 = count / 4 * 4;
  for (int r = 0; r < rows; ++r) {
    const float* q_row = q + r * dim;
    float* out = scores + r * ld;
    int s = 0;
    for (; s < count4; s += 4) {
      Dot4(q_row, key_rows[s], key_rows[s + 1], key_rows[s + 2], key_rows[s + 3], dim, out + s);
    }
    for (; s < count; ++s) out[s] = Dot(q_row, key_rows[s], dim);
  }
}

template <typename Element>
void GroupAccumulatePortable(const float* weights, int64_t ld, int rows,
                             const Element* const* value_rows, int count, int64_t dim, float* acc) {
  const int count4 = count / 4 * 4;
  for (int r = 0; r < rows; ++r) {
    const float* w = weights + r * ld;
    float* y = acc + r * dim;
    int s = 0;
    for (; s < count4; s += 4) {
      Axpy4(w + s, value_rows[s], value_rows[s + 1], value_rows[s + 2], value_rows[s + 3], y, dim);
    }
    for (; s < count; ++s) Axpy(w[s], value_rows[s], y, dim);
  }
}

#ifdef ATTNSERVE_X86

// ---- AVX2/FMA versions.

// ExpApprox (simd_kernels.h) on 8 lanes: the same range reduction and polynomial, with FMA.
ATTNSERVE_AVX2 inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33f)), _mm256_set1_ps(88.37f));
  const __m256 n = _mm256_floor_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 e_r = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_cvtps_epi32(_mm256_add_ps(n, _mm256_set1_ps(127.0f))), 23);
  return _mm256_mul_ps(e_r, _mm256_castsi256_ps(bits));
}

using avx2::HorizontalMax;
using avx2::HorizontalSum;
using avx2::Load8;
using avx2::Reduce8;

// Lanes i < n all ones.
ATTNSERVE_AVX2 inline __m256i TailMask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

ATTNSERVE_AVX2 void OnlineSoftmaxRowAvx2(float* s, int64_t count, int64_t lo, int64_t hi,
                                         float scale, const AttentionVariation& variation,
                                         const LogitSite& site, float* max, float* sum, float* acc,
                                         int64_t value_dim) {
  float* const v = s + lo;
  const int64_t n = hi - lo;
  const int64_t n8 = n / 8 * 8;
  const __m256i tail = TailMask(n - n8);
  if (scale != 1.0f) {
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t k = 0; k < n8; k += 8) {
      _mm256_storeu_ps(v + k, _mm256_mul_ps(_mm256_loadu_ps(v + k), vscale));
    }
    for (int64_t k = n8; k < n; ++k) v[k] *= scale;
  }
  variation.TransformLogits(v, n, {site.head, site.query, site.first_key + lo});
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 vmax = neg_inf;
  for (int64_t k = 0; k < n8; k += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(v + k));
  if (n8 < n) {
    const __m256 x = _mm256_maskload_ps(v + n8, tail);
    vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(neg_inf, x, _mm256_castsi256_ps(tail)));
  }
  const float new_max = std::max(*max, HorizontalMax(vmax));
  const float correction = std::exp(*max - new_max);
  if (correction != 1.0f) {
    *sum *= correction;
    const __m256 c = _mm256_set1_ps(correction);
    int64_t d = 0;
    for (; d + 8 <= value_dim; d += 8) {
      _mm256_storeu_ps(acc + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), c));
    }
    for (; d < value_dim; ++d) acc[d] *= correction;
  }
  const __m256 vnew_max = _mm256_set1_ps(new_max);
  __m256 vsum = _mm256_setzero_ps();
  for (int64_t k = 0; k < n8; k += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(v + k), vnew_max));
    _mm256_storeu_ps(v + k, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  if (n8 < n) {
    const __m256 e = _mm256_and_ps(Exp8(_mm256_sub_ps(_mm256_maskload_ps(v + n8, tail), vnew_max)),
                                   _mm256_castsi256_ps(tail));
    _mm256_maskstore_ps(v + n8, tail, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  std::fill(s, s + lo, 0.0f);
  std::fill(s + hi, s + count, 0.0f);
  *sum += HorizontalSum(vsum);
  *max = new_max;
}

// Scores of query rows r and r + 1 against key rows [s, s + 4): a 2 x 4 register tile, so each
// loaded key chunk serves two rows (6 loads per 8 FMAs instead of 9 with one row x 8 keys).
template <typename Element>
ATTNSERVE_AVX2 inline void ScoresTile2x4(const float* q0, const float* q1, int64_t dim,
                                         const Element* const* keys, float* out0, float* out1) {
  const Element* k0 = keys[0];
  const Element* k1 = keys[1];
  const Element* k2 = keys[2];
  const Element* k3 = keys[3];
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  for (int64_t d = 0; d < dim; d += 8) {
    const __m256 x0 = _mm256_loadu_ps(q0 + d);
    const __m256 x1 = _mm256_loadu_ps(q1 + d);
    const __m256 y0 = Load8(k0 + d);
    a0 = _mm256_fmadd_ps(x0, y0, a0);
    b0 = _mm256_fmadd_ps(x1, y0, b0);
    const __m256 y1 = Load8(k1 + d);
    a1 = _mm256_fmadd_ps(x0, y1, a1);
    b1 = _mm256_fmadd_ps(x1, y1, b1);
    const __m256 y2 = Load8(k2 + d);
    a2 = _mm256_fmadd_ps(x0, y2, a2);
    b2 = _mm256_fmadd_ps(x1, y2, b2);
    const __m256 y3 = Load8(k3 + d);
    a3 = _mm256_fmadd_ps(x0, y3, a3);
    b3 = _mm256_fmadd_ps(x1, y3, b3);
  }
  const __m256 sums = Reduce8(a0, a1, a2, a3, b0, b1, b2, b3);
  _mm_storeu_ps(out0, _mm256_castps256_ps128(sums));
  _mm_storeu_ps(out1, _mm256_extractf128_ps(sums, 1));
}

// One query row against key rows [s, s + 8).
template <typename Element>
ATTNSERVE_AVX2 inline void ScoresTile1x8(const float* q_row, int64_t dim,
                                         const Element* const* keys, float* out) {
  const Element* k0 = keys[0];
  const Element* k1 = keys[1];
  const Element* k2 = keys[2];
  const Element* k3 = keys[3];
  const Element* k4 = keys[4];
  const Element* k5 = keys[5];
  const Element* k6 = keys[6];
  const Element* k7 = keys[7];
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t d = 0; d < dim; d += 8) {
    const __m256 x = _mm256_loadu_ps(q_row + d);
    a0 = _mm256_fmadd_ps(x, Load8(k0 + d), a0);
    a1 = _mm256_fmadd_ps(x, Load8(k1 + d), a1);
    a2 = _mm256_fmadd_ps(x, Load8(k2 + d), a2);
    a3 = _mm256_fmadd_ps(x, Load8(k3 + d), a3);
    a4 = _mm256_fmadd_ps(x, Load8(k4 + d), a4);
    a5 = _mm256_fmadd_ps(x, Load8(k5 + d), a5);
    a6 = _mm256_fmadd_ps(x, Load8(k6 + d), a6);
    a7 = _mm256_fmadd_ps(x, Load8(k7 + d), a7);
  }
  _mm256_storeu_ps(out, Reduce8(a0, a1, a2, a3, a4, a5, a6, a7));
}

// One query row against key rows [s, s + 4).
template <typename Element>
ATTNSERVE_AVX2 inline void ScoresTile1x4(const float* q_row, int64_t dim,
                                         const Element* const* keys, float* out) {
  const Element* k0 = keys[0];
  const Element* k1 = keys[1];
  const Element* k2 = keys[2];
  const Element* k3 = keys[3];
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t d = 0; d < dim; d += 8) {
    const __m256 x = _mm256_loadu_ps(q_row + d);
    a0 = _mm256_fmadd_ps(x, Load8(k0 + d), a0);
    a1 = _mm256_fmadd_ps(x, Load8(k1 + d), a1);
    a2 = _mm256_fmadd_ps(x, Load8(k2 + d), a2);
    a3 = _mm256_fmadd_ps(x, Load8(k3 + d), a3);
  }
  _mm_storeu_ps(out, _mm256_castps256_ps128(Reduce8(a0, a1, a2, a3, a0, a1, a2, a3)));
}

// dim % 8 == 0. One row: 1 x 8 tiles. Several: 4 keys at a time (they stay in L1) against row
// pairs in 2 x 4 tiles and a last odd row in a 1 x 4 tile. Keys past the last tile one at a time.
template <typename Element>
ATTNSERVE_AVX2 void GroupScoresAvx2(const float* q, int rows, int64_t dim,
                                    const Element* const* key_rows, int count, float* scores,
                                    int64_t ld) {
  const int tile = rows == 1 ? 8 : 4;
  const int tiled = count / tile * tile;
  const int pairs_end = rows / 2 * 2;
  for (int s = 0; s < tiled; s += tile) {
    if (rows == 1) {
      ScoresTile1x8(q, dim, key_rows + s, scores + s);
      continue;
    }
    for (int r = 0; r < pairs_end; r += 2) {
      ScoresTile2x4(q + r * dim, q + (r + 1) * dim, dim, key_rows + s, scores + r * ld + s,
                    scores + (r + 1) * ld + s);
    }
    if (pairs_end < rows) {
      ScoresTile1x4(q + pairs_end * dim, dim, key_rows + s, scores + pairs_end * ld + s);
    }
  }
  for (int s = tiled; s < count; ++s) {
    const Element* k = key_rows[s];
    for (int r = 0; r < rows; ++r) {
      const float* q_row = q + r * dim;
      __m256 a = _mm256_setzero_ps();
      for (int64_t d = 0; d < dim; d += 8) {
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q_row + d), Load8(k + d), a);
      }
      scores[r * ld + s] = HorizontalSum(a);
    }
  }
}

// acc rows r and r + 1, columns [d0, d0 + 32) += P · V: a 2 x 32 register tile held over all
// `count` value rows, each loaded value chunk serving both rows (6 loads per 8 FMAs).
template <typename Element>
ATTNSERVE_AVX2 inline void AccumulateTile2x32(const float* w0, const float* w1,
                                              const Element* const* value_rows, int count,
                                              int64_t d0, float* y0, float* y1) {
  __m256 a0 = _mm256_loadu_ps(y0), a1 = _mm256_loadu_ps(y0 + 8), a2 = _mm256_loadu_ps(y0 + 16),
         a3 = _mm256_loadu_ps(y0 + 24);
  __m256 b0 = _mm256_loadu_ps(y1), b1 = _mm256_loadu_ps(y1 + 8), b2 = _mm256_loadu_ps(y1 + 16),
         b3 = _mm256_loadu_ps(y1 + 24);
  for (int s = 0; s < count; ++s) {
    const __m256 p0 = _mm256_broadcast_ss(w0 + s);
    const __m256 p1 = _mm256_broadcast_ss(w1 + s);
    const Element* x = value_rows[s] + d0;
    const __m256 x0 = Load8(x);
    a0 = _mm256_fmadd_ps(p0, x0, a0);
    b0 = _mm256_fmadd_ps(p1, x0, b0);
    const __m256 x1 = Load8(x + 8);
    a1 = _mm256_fmadd_ps(p0, x1, a1);
    b1 = _mm256_fmadd_ps(p1, x1, b1);
    const __m256 x2 = Load8(x + 16);
    a2 = _mm256_fmadd_ps(p0, x2, a2);
    b2 = _mm256_fmadd_ps(p1, x2, b2);
    const __m256 x3 = Load8(x + 24);
    a3 = _mm256_fmadd_ps(p0, x3, a3);
    b3 = _mm256_fmadd_ps(p1, x3, b3);
  }
  _mm256_storeu_ps(y0, a0);
  _mm256_storeu_ps(y0 + 8, a1);
  _mm256_storeu_ps(y0 + 16, a2);
  _mm256_storeu_ps(y0 + 24, a3);
  _mm256_storeu_ps(y1, b0);
  _mm256_storeu_ps(y1 + 8, b1);
  _mm256_storeu_ps(y1 + 16, b2);
  _mm256_storeu_ps(y1 + 24, b3);
}

// dim % 8 == 0. With dim % 32 == 0, row pairs take 2 x 32 tiles (AccumulateTile2x32); the other
// rows go column chunks of up to 64 (8 registers), each chunk's accumulator held in registers
// over all `count` value rows.
template <typename Element>
ATTNSERVE_AVX2 void GroupAccumulateAvx2(const float* weights, int64_t ld, int rows,
                                        const Element* const* value_rows, int count, int64_t dim,
                                        float* acc) {
  if (dim % 32 == 0 && rows >= 2) {
    const int pairs_end = rows / 2 * 2;
    for (int64_t d0 = 0; d0 < dim; d0 += 32) {
      for (int r = 0; r < pairs_end; r += 2) {
        AccumulateTile2x32(weights + r * ld, weights + (r + 1) * ld, value_rows, count, d0,
                           acc + r * dim + d0, acc + (r + 1) * dim + d0);
      }
    }
    if (pairs_end == rows) return;
    weights += pairs_end * ld;
    acc += pairs_end * dim;
    rows -= pairs_end;
  }
  for (int64_t d0 = 0; d0 < dim; d0 += 64) {
    if (dim - d0 >= 64) {
      for (int r = 0; r < rows; ++r) {
        const float* w = weights + r * ld;
        float* y = acc + r * dim + d0;
        __m256 y0 = _mm256_loadu_ps(y), y1 = _mm256_loadu_ps(y + 8), y2 = _mm256_loadu_ps(y + 16),
               y3 = _mm256_loadu_ps(y + 24), y4 = _mm256_loadu_ps(y + 32),
               y5 = _mm256_loadu_ps(y + 40), y6 = _mm256_loadu_ps(y + 48),
               y7 = _mm256_loadu_ps(y + 56);
        for (int s = 0; s < count; ++s) {
          const __m256 p = _mm256_broadcast_ss(w + s);
          const Element* x = value_rows[s] + d0;
          y0 = _mm256_fmadd_ps(p, Load8(x), y0);
          y1 = _mm256_fmadd_ps(p, Load8(x + 8), y1);
          y2 = _mm256_fmadd_ps(p, Load8(x + 16), y2);
          y3 = _mm256_fmadd_ps(p, Load8(x + 24), y3);
          y4 = _mm256_fmadd_ps(p, Load8(x + 32), y4);
          y5 = _mm256_fmadd_ps(p, Load8(x + 40), y5);
          y6 = _mm256_fmadd_ps(p, Load8(x + 48), y6);
          y7 = _mm256_fmadd_ps(p, Load8(x + 56), y7);
        }
        _mm256_storeu_ps(y, y0);
        _mm256_storeu_ps(y + 8, y1);
        _mm256_storeu_ps(y + 16, y2);
        _mm256_storeu_ps(y + 24, y3);
        _mm256_storeu_ps(y + 32, y4);
        _mm256_storeu_ps(y + 40, y5);
        _mm256_storeu_ps(y + 48, y6);
        _mm256_storeu_ps(y + 56, y7);
      }
    } else {
      for (int r = 0; r < rows; ++r) {
        const float* w = weights + r * ld;
        for (int64_t d = d0; d < dim; d += 8) {
          float* y = acc + r * dim + d;
          __m256 a = _mm256_loadu_ps(y);
          for (int s = 0; s < count; ++s) {
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(w + s), Load8(value_rows[s] + d), a);
          }
          _mm256_storeu_ps(y, a);
        }
      }
    }
  }
}

#endif  // ATTNSERVE_X86

#ifdef ATTNSERVE_X86_AVX512

// ---- AVX-512F versions of the softmax rows (prefill's blocks of 512 keys: 32 vectors a pass).

// e^x on 16 lanes as 2^t, t = x log2(e): n = round(t), 2^(t - n) by a degree-6 polynomial on
// [-1/2, 1/2] (relative error 1e-7, near-minimax, fitted for this), scaled by 2^n with scalef,
// which also gives 0 for t far below -126 and inf above 128 without clamps. 10 vector
// instructions against ExpApprox's 16 (its two-constant range reduction and the clamps): the
// softmax's exp was the largest part of prefill attention outside the tiles (~17% in `perf`).
// Less exact than ExpApprox for large |x| (t's rounding, 6e-8 of |t|), where e^x is already
// negligible against the row maximum's 1. t is clamped at -150 (2^-150 rounds to 0), so -inf
// and NaN give 0, as ExpApprox's clamp gives ~0.
ATTNSERVE_AVX512 inline __m512 Exp16(__m512 x) {
  const __m512 t = _mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                 _mm512_set1_ps(-150.0f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.5345810970757157e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3399930903688073e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618489071726799e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550328642129898e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022646248340607e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471824645996e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// The online softmax's step for one row against its new running max: the row's accumulator and
// sum are rescaled by exp(old max - new max), and v[0, n16 + tail) becomes exp(v - new max).
// Returns the sum of the new exps, in lanes.
ATTNSERVE_AVX512 __attribute__((always_inline)) inline __m512 RescaleAndExpRow512(
    float* v, int64_t n16, __mmask16 tail, float old_max, float new_max, float* sum, float* acc,
    int64_t value_dim) {
  // ExpApprox, not std::exp: a libm call per row and block was 2% of prefill attention.
  const float correction = ExpApprox(old_max - new_max);
  if (correction != 1.0f) {
    *sum *= correction;
    const __m512 c = _mm512_set1_ps(correction);
    int64_t d = 0;
    for (; d + 16 <= value_dim; d += 16) {
      _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), c));
    }
    for (; d < value_dim; ++d) acc[d] *= correction;
  }
  const __m512 vnew_max = _mm512_set1_ps(new_max);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t k = 0; k < n16; k += 16) {
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(v + k), vnew_max));
    _mm512_storeu_ps(v + k, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  if (tail != 0) {
    const __m512 e = _mm512_maskz_mov_ps(
        tail, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, v + n16), vnew_max)));
    _mm512_mask_storeu_ps(v + n16, tail, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  return vsum;
}

ATTNSERVE_AVX512 void OnlineSoftmaxRowAvx512(float* s, int64_t count, int64_t lo, int64_t hi,
                                             float scale, const AttentionVariation& variation,
                                             const LogitSite& site, float* max, float* sum,
                                             float* acc, int64_t value_dim) {
  float* const v = s + lo;
  const int64_t n = hi - lo;
  const int64_t n16 = n / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - n16)) - 1u);
  if (scale != 1.0f) {
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t k = 0; k < n16; k += 16) {
      _mm512_storeu_ps(v + k, _mm512_mul_ps(_mm512_loadu_ps(v + k), vscale));
    }
    if (tail != 0) {
      _mm512_mask_storeu_ps(v + n16, tail,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, v + n16), vscale));
    }
  }
  variation.TransformLogits(v, n, {site.head, site.query, site.first_key + lo});
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 vmax = neg_inf;
  for (int64_t k = 0; k < n16; k += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(v + k));
  if (tail != 0) vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(neg_inf, tail, v + n16));
  // Halves, then the AVX2 reduction.
  const __m256 half_max = _mm256_max_ps(
      _mm512_castps512_ps256(vmax),
      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(vmax), 1)));
  const float new_max = std::max(*max, HorizontalMax(half_max));
  const __m512 vsum = RescaleAndExpRow512(v, n16, tail, *max, new_max, sum, acc, value_dim);
  std::fill(s, s + lo, 0.0f);
  std::fill(s + hi, s + count, 0.0f);
  *sum += _mm512_reduce_add_ps(vsum);
  *max = new_max;
}

// OnlineSoftmaxRows on AVX-512: the row loop inside, the exp's constants hoisted by the compiler.
ATTNSERVE_AVX512 void OnlineSoftmaxRowsAvx512(float* s, int64_t ld, int64_t rows, int64_t count,
                                              float* max, float* sum, float* acc,
                                              int64_t value_dim) {
  const int64_t n16 = count / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (count - n16)) - 1u);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < rows; ++r) {
    float* const v = s + r * ld;
    __m512 vmax = neg_inf;
    for (int64_t k = 0; k < n16; k += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(v + k));
    if (tail != 0) vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(neg_inf, tail, v + n16));
    const float new_max = std::max(max[r], _mm512_reduce_max_ps(vmax));
    const __m512 vsum = RescaleAndExpRow512(v, n16, tail, max[r], new_max, &sum[r],
                                            acc + r * value_dim, value_dim);
    sum[r] += _mm512_reduce_add_ps(vsum);
    max[r] = new_max;
  }
}

#endif  // ATTNSERVE_X86_AVX512

// ATTNSERVE_CPU_PORTABLE=1 in the environment forces the portable loops (to test them on an
// AVX2 machine).
bool DetectAvx2() {
#ifdef ATTNSERVE_X86
  const char* portable = std::getenv("ATTNSERVE_CPU_PORTABLE");
  if (portable != nullptr && portable[0] != '\0' && portable[0] != '0') return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool UseAvx2() {
  static const bool use = DetectAvx2();
  return use;
}

// AVX-512F on top of AVX2 (the AVX-512 kernels fall back to AVX2 helpers for their tails).
// ATTNSERVE_CPU_AVX512=0 in the environment keeps the AVX2 paths (to compare them back to back).
bool DetectAvx512() {
#ifdef ATTNSERVE_X86
  if (!UseAvx2()) return false;
  const char* avx512 = std::getenv("ATTNSERVE_CPU_AVX512");
  if (avx512 != nullptr && avx512[0] == '0') return false;
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

template <typename Element>
void GroupScoresDispatch(const float* q, int rows, int64_t dim, const Element* const* key_rows,
                         int count, float* scores, int64_t ld) {
#ifdef ATTNSERVE_X86_AVX512
  if (dim % 16 == 0 && SimdKernelsUseAvx512()) {
    avx512::GroupScores(q, rows, dim, key_rows, count, scores, ld);
    return;
  }
#endif
#ifdef ATTNSERVE_X86
  if (UseAvx2() && dim % 8 == 0) {
    GroupScoresAvx2(q, rows, dim, key_rows, count, scores, ld);
    return;
  }
#endif
  GroupScoresPortable(q, rows, dim, key_rows, count, scores, ld);
}

void GroupScoresQueryDispatch(const float* q, int rows, int64_t dim, bool bf16_keys, float* out) {
#ifdef ATTNSERVE_X86_AVX512
  if (dim % 16 == 0 && SimdKernelsUseAvx512()) {
    avx512::GroupScoresQuery(q, rows, dim, bf16_keys, out);
    return;
  }
#endif
  std::memcpy(out, q, sizeof(float) * rows * dim);  // The AVX2 and portable loops read q as is.
}

template <typename Element>
void GroupAccumulateDispatch(const float* weights, int64_t ld, int rows,
                             const Element* const* value_rows, int count, int64_t dim, float* acc) {
#ifdef ATTNSERVE_X86_AVX512
  if (dim % 16 == 0 && SimdKernelsUseAvx512()) {
    avx512::GroupAccumulate(weights, ld, rows, value_rows, count, dim, acc);
    return;
  }
#endif
#ifdef ATTNSERVE_X86
  if (UseAvx2() && dim % 8 == 0) {
    GroupAccumulateAvx2(weights, ld, rows, value_rows, count, dim, acc);
    return;
  }
#endif
  GroupAccumulatePortable(weights, ld, rows, value_rows, count, dim, acc);
}

}  // namespace

bool SimdKernelsUseAvx2() { return UseAvx2(); }

bool SimdKernelsUseAvx512() {
  static const bool use = DetectAvx512();
  return use;
}

void OnlineSoftmaxRow(float* s, int64_t count, int64_t lo, int64_t hi, float scale,
                      const AttentionVariation& variation, const LogitSite& site, float* max,
                      float* sum, float* acc, int64_t value_dim) {
#ifdef ATTNSERVE_X86_AVX512
  if (SimdKernelsUseAvx512()) {
    OnlineSoftmaxRowAvx512(s, count, lo, hi, scale, variation, site, max, sum, acc, value_dim);
    return;
  }
#endif
#ifdef ATTNSERVE_X86
  if (UseAvx2()) {
    OnlineSoftmaxRowAvx2(s, count, lo, hi, scale, variation, site, max, sum, acc, value_dim);
    return;
  }
#endif
  OnlineSoftmaxRowPortable(s, count, lo, hi, scale, variation, site, max, sum, acc, value_dim);
}

void OnlineSoftmaxRows(float* s, int64_t ld, int64_t rows, int64_t count, float* max, float* sum,
                       float* acc, int64_t value_dim) {
#ifdef ATTNSERVE_X86_AVX512
  if (SimdKernelsUseAvx512()) {
    OnlineSoftmaxRowsAvx512(s, ld, rows, count, max, sum, acc, value_dim);
    return;
  }
#endif
  static const AttentionVariation kPlain;
  for (int64_t r = 0; r < rows; ++r) {
    OnlineSoftmaxRow(s + r * ld, count, 0, count, /*scale=*/1.0f, kPlain, LogitSite{}, &max[r],
                     &sum[r], acc + r * value_dim, value_dim);
  }
}

void GroupScoresQuery(const float* q, int rows, int64_t dim, bool bf16_keys, float* out) {
  GroupScoresQueryDispatch(q, rows, dim, bf16_keys, out);
}
void GroupScores(const float* q, int rows, int64_t dim, const float* const* key_rows, int count,
                 float* scores, int64_t ld) {
  GroupScoresDispatch(q, rows, dim, key_rows, count, scores, ld);
}
void GroupScores(const float* q, int rows, int64_t dim, const uint16_t* const* key_rows, int count,
                 float* scores, int64_t ld) {
  GroupScoresDispatch(q, rows, dim, key_rows, count, scores, ld);
}
void GroupAccumulate(const float* weights, int64_t ld, int rows, const float* const* value_rows,
                     int count, int64_t dim, float* acc) {
  GroupAccumulateDispatch(weights, ld, rows, value_rows, count, dim, acc);
}
void GroupAccumulate(const float* weights, int64_t ld, int rows, const uint16_t* const* value_rows,
                     int count, int64_t dim, float* acc) {
  GroupAccumulateDispatch(weights, ld, rows, value_rows, count, dim, acc);
}

}  // namespace attnserve
