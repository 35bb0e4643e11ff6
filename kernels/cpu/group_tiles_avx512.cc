#include "kernels/cpu/group_tiles_avx512.h"

#include <cstring>
#include <type_traits>
#include <vector>

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
  // q in a 64-byte-aligned copy: the tiles read q chunks as memory operands of their FMAs (8-row
  // tiles: one per 2 FMAs), and a caller's q off a 64-byte boundary (a std::vector's is at 16)
  // could split every such load over two cache lines (measured, one thread: MQA f32/bf16 and MLA
  // f32 kernels 1.10-1.15x; MLA bf16 no longer 1.3x slower in some processes; docs/benchmarks.md).
  // bf16 keys: the 8-row groups' rows in EvenOddOrder. On the stack up to 16 rows of 512 columns (MQA 8 x 64, absorbed MLA 8-16 x 288),
  // so a block of keys allocates nothing; beyond that f32 reads q as given, bf16 a heap copy.
  const int rows8 = rows / 8 * 8;
  constexpr bool kReorder = std::is_same_v<Element, uint16_t>;
  constexpr int64_t kStackFloats = 16 * 512;
  alignas(64) float stack[kStackFloats];
  std::vector<float> heap;
  const float* q_tiles = q;
  if (rows * dim <= kStackFloats || (kReorder && rows8 > 0)) {
    float* copy = stack;
    if (rows * dim > kStackFloats) {
      heap.resize(static_cast<size_t>(rows) * dim);
      copy = heap.data();
    }
    if (kReorder) {
      EvenOddOrder(q, rows8, dim, copy);
    } else {
      std::memcpy(copy, q, sizeof(float) * rows8 * dim);
    }
    std::memcpy(copy + rows8 * dim, q + rows8 * dim, sizeof(float) * (rows - rows8) * dim);
    q_tiles = copy;
  }
  // Groups of 8 and more rows (MQA, absorbed MLA): 8 rows x 2 keys, each key row widened once per
  // 8 rows rather than per 4. What is left of the rows takes the quads below.
  if (rows8 > 0) {
    const float* q8 = q_tiles;
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
        ScoresColumn<1>(q + r * dim, 8, dim, key_rows + count2, scores + r * ld + count2, ld);
      }
    }
    if (rows8 == rows) return;
    scores += rows8 * ld;
  }
  q = q_tiles + rows8 * dim;
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
