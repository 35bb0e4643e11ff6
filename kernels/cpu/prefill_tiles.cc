#include "kernels/cpu/prefill_tiles.h"

#include <algorithm>

#include "kernels/cpu/simd_kernels.h"

namespace attnserve {

namespace {

#ifdef ATTNSERVE_X86_AVX512

// ---- AVX-512F: one panel of 16 keys is one zmm.

// Rows [0, R) × panels [0, P): R * P accumulators; per head-dimension step P panel loads and R
// broadcasts of q (folded into the FMAs) feed R * P FMAs.
template <int R, int P>
ATTNSERVE_AVX512 inline void ScoresTile512(const float* q, int dim, const float* panels,
                                           float* scores, int64_t ld) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  const int64_t panel_stride = int64_t{kKeyPanel} * dim;
  for (int d = 0; d < dim; ++d) {
    __m512 k[P];
    for (int p = 0; p < P; ++p) k[p] = _mm512_loadu_ps(panels + p * panel_stride + d * kKeyPanel);
    for (int r = 0; r < R; ++r) {
      const __m512 qr = _mm512_set1_ps(q[r * dim + d]);
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(qr, k[p], acc[r][p]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(scores + r * ld + p * kKeyPanel, acc[r][p]);
  }
}

// Runs of 4 panels outer, rows inner: the run (16 KiB at head dim 64) stays in L1 while every row
// passes over it, instead of each group of rows streaming the whole block from L2. 4 rows × 4
// panels: 8 loads (4 panels, 4 q broadcasts) per 16 FMAs.
template <int P>
ATTNSERVE_AVX512 void ScoresPanels512(const float* q, int rows, int dim, const float* k,
                                      float* out, int64_t ld) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) ScoresTile512<4, P>(q + int64_t{r} * dim, dim, k, out + r * ld, ld);
  for (; r < rows; ++r) ScoresTile512<1, P>(q + int64_t{r} * dim, dim, k, out + r * ld, ld);
}

ATTNSERVE_AVX512 void PanelScores512(const float* q, int rows, int dim, const float* panels,
                                     int num_panels, float* scores, int64_t ld) {
  const int64_t panel_stride = int64_t{kKeyPanel} * dim;
  int p = 0;
  for (; p + 4 <= num_panels; p += 4) {
    ScoresPanels512<4>(q, rows, dim, panels + p * panel_stride, scores + p * kKeyPanel, ld);
  }
  for (; p < num_panels; ++p) {
    ScoresPanels512<1>(q, rows, dim, panels + p * panel_stride, scores + p * kKeyPanel, ld);
  }
}

// Rows [0, R) × columns [0, 16 V) of acc, held in registers over all `count` value rows.
template <int R, int V>
ATTNSERVE_AVX512 inline void AccumulateTile512(const float* weights, int64_t ld,
                                               const float* values, int count, int dim,
                                               float* acc) {
  __m512 o[R][V];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) o[r][v] = _mm512_loadu_ps(acc + r * dim + v * 16);
  }
  for (int k = 0; k < count; ++k) {
    __m512 x[V];
    for (int v = 0; v < V; ++v) x[v] = _mm512_loadu_ps(values + int64_t{k} * dim + v * 16);
    for (int r = 0; r < R; ++r) {
      const __m512 w = _mm512_set1_ps(weights[r * ld + k]);
      for (int v = 0; v < V; ++v) o[r][v] = _mm512_fmadd_ps(w, x[v], o[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(acc + r * dim + v * 16, o[r][v]);
  }
}

template <int R>
ATTNSERVE_AVX512 void AccumulateRows512(const float* weights, int64_t ld, const float* values,
                                        int count, int dim, float* acc) {
  int c = 0;
  for (; c + 64 <= dim; c += 64) {
    AccumulateTile512<R, 4>(weights, ld, values + c, count, dim, acc + c);
  }
  for (; c < dim; c += 16) AccumulateTile512<R, 1>(weights, ld, values + c, count, dim, acc + c);
}

// Runs of kAccumulateKeys value rows outer, rows inner: the run (32 KiB at head dim 64) stays in
// L1 while every row group passes over it; the accumulators go through L1 once per run. 128 rows
// rather than 32 pay each tile's accumulator loads, stores and call a quarter as often
// (BM_PrefillAttention, one thread: MHA 44.4 -> 41.8 ms CPU); 256 (64 KiB) no longer fits L1 and
// lost (46.9 ms).
constexpr int kAccumulateKeys = 128;

ATTNSERVE_AVX512 void TileAccumulate512(const float* weights, int64_t ld, int rows,
                                        const float* values, int count, int dim, float* acc) {
  for (int k = 0; k < count; k += kAccumulateKeys) {
    const int n = std::min(kAccumulateKeys, count - k);
    const float* w = weights + k;
    const float* v = values + int64_t{k} * dim;
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
      AccumulateRows512<4>(w + r * ld, ld, v, n, dim, acc + int64_t{r} * dim);
    }
    for (; r < rows; ++r) AccumulateRows512<1>(w + r * ld, ld, v, n, dim, acc + int64_t{r} * dim);
  }
}

// A whole panel: element (d, j) = keys[j * dim + d], one 16-key gather and one store per d
// instead of 16 scalar stores (PackKeyPanels, MHA prefill kernel: 1.9% -> 0.9% of its samples).
ATTNSERVE_AVX512 void PackWholePanel512(const float* keys, int dim, float* panel) {
  const __m512i offsets =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(dim));
  for (int d = 0; d < dim; ++d) {
    _mm512_storeu_ps(panel + d * kKeyPanel, _mm512_i32gather_ps(offsets, keys + d, 4));
  }
}

#endif  // ATTNSERVE_X86_AVX512

#ifdef ATTNSERVE_X86

// ---- AVX2/FMA: one panel of 16 keys is two ymm.

template <int R>
ATTNSERVE_AVX2 inline void ScoresTile256(const float* q, int dim, const float* panel,
                                         float* scores, int64_t ld) {
  __m256 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  for (int d = 0; d < dim; ++d) {
    const __m256 k0 = _mm256_loadu_ps(panel + d * kKeyPanel);
    const __m256 k1 = _mm256_loadu_ps(panel + d * kKeyPanel + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 qr = _mm256_broadcast_ss(q + r * dim + d);
      lo[r] = _mm256_fmadd_ps(qr, k0, lo[r]);
      hi[r] = _mm256_fmadd_ps(qr, k1, hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(scores + r * ld, lo[r]);
    _mm256_storeu_ps(scores + r * ld + 8, hi[r]);
  }
}

// Panels outer, rows inner, as PanelScores512.
ATTNSERVE_AVX2 void PanelScores256(const float* q, int rows, int dim, const float* panels,
                                   int num_panels, float* scores, int64_t ld) {
  const int64_t panel_stride = int64_t{kKeyPanel} * dim;
  for (int p = 0; p < num_panels; ++p) {
    const float* k = panels + p * panel_stride;
    float* out = scores + p * kKeyPanel;
    int r = 0;
    for (; r + 4 <= rows; r += 4) ScoresTile256<4>(q + int64_t{r} * dim, dim, k, out + r * ld, ld);
    for (; r < rows; ++r) ScoresTile256<1>(q + int64_t{r} * dim, dim, k, out + r * ld, ld);
  }
}

// Rows [0, R) × 16 columns of acc in registers over all `count` value rows.
template <int R>
ATTNSERVE_AVX2 inline void AccumulateTile256(const float* weights, int64_t ld, const float* values,
                                             int count, int dim, float* acc) {
  __m256 lo[R], hi[R];
  for (int r = 0; r < R; ++r) {
    lo[r] = _mm256_loadu_ps(acc + r * dim);
    hi[r] = _mm256_loadu_ps(acc + r * dim + 8);
  }
  for (int k = 0; k < count; ++k) {
    const __m256 x0 = _mm256_loadu_ps(values + int64_t{k} * dim);
    const __m256 x1 = _mm256_loadu_ps(values + int64_t{k} * dim + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(weights + r * ld + k);
      lo[r] = _mm256_fmadd_ps(w, x0, lo[r]);
      hi[r] = _mm256_fmadd_ps(w, x1, hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(acc + r * dim, lo[r]);
    _mm256_storeu_ps(acc + r * dim + 8, hi[r]);
  }
}

// Runs of value rows outer, rows inner, as TileAccumulate512.
ATTNSERVE_AVX2 void TileAccumulate256(const float* weights, int64_t ld, int rows,
                                      const float* values, int count, int dim, float* acc) {
  constexpr int kRun = 32;
  for (int k = 0; k < count; k += kRun) {
    const int n = std::min(kRun, count - k);
    const float* w = weights + k;
    const float* v = values + int64_t{k} * dim;
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
      for (int c = 0; c < dim; c += 16) {
        AccumulateTile256<4>(w + r * ld, ld, v + c, n, dim, acc + int64_t{r} * dim + c);
      }
    }
    for (; r < rows; ++r) {
      for (int c = 0; c < dim; c += 16) {
        AccumulateTile256<1>(w + r * ld, ld, v + c, n, dim, acc + int64_t{r} * dim + c);
      }
    }
  }
}

#endif  // ATTNSERVE_X86

}  // namespace

PrefillTileIsa PrefillTileIsaFor(int key_dim, int value_dim) {
  if (key_dim % kKeyPanel != 0 || value_dim % 16 != 0) return PrefillTileIsa::kPortable;
#ifdef ATTNSERVE_X86_AVX512
  if (SimdKernelsUseAvx512()) return PrefillTileIsa::kAvx512;
#endif
#ifdef ATTNSERVE_X86
  if (SimdKernelsUseAvx2()) return PrefillTileIsa::kAvx2;
#endif
  return PrefillTileIsa::kPortable;
}

void PackKeyPanels(const float* keys, int64_t count, int dim, float* panels) {
  const int64_t num_panels = (count + kKeyPanel - 1) / kKeyPanel;
  for (int64_t p = 0; p < num_panels; ++p) {
    float* panel = panels + p * kKeyPanel * dim;
    const int64_t in_panel = std::min<int64_t>(kKeyPanel, count - p * kKeyPanel);
#ifdef ATTNSERVE_X86_AVX512
    if (in_panel == kKeyPanel && SimdKernelsUseAvx512()) {
      PackWholePanel512(keys + p * kKeyPanel * dim, dim, panel);
      continue;
    }
#endif
    for (int64_t j = 0; j < kKeyPanel; ++j) {
      if (j >= in_panel) {
        for (int d = 0; d < dim; ++d) panel[d * kKeyPanel + j] = 0.0f;
        continue;
      }
      const float* key = keys + (p * kKeyPanel + j) * dim;
      for (int d = 0; d < dim; ++d) panel[d * kKeyPanel + j] = key[d];
    }
  }
}

void PanelScores(PrefillTileIsa isa, const float* q, int rows, int dim, const float* panels,
                 int num_panels, float* scores, int64_t ld) {
#ifdef ATTNSERVE_X86_AVX512
  if (isa == PrefillTileIsa::kAvx512) {
    PanelScores512(q, rows, dim, panels, num_panels, scores, ld);
    return;
  }
#endif
#ifdef ATTNSERVE_X86
  if (isa == PrefillTileIsa::kAvx2) PanelScores256(q, rows, dim, panels, num_panels, scores, ld);
#endif
}

void TileAccumulate(PrefillTileIsa isa, const float* weights, int64_t ld, int rows,
                    const float* values, int count, int dim, float* acc) {
#ifdef ATTNSERVE_X86_AVX512
  if (isa == PrefillTileIsa::kAvx512) {
    TileAccumulate512(weights, ld, rows, values, count, dim, acc);
    return;
  }
#endif
#ifdef ATTNSERVE_X86
  if (isa == PrefillTileIsa::kAvx2) TileAccumulate256(weights, ld, rows, values, count, dim, acc);
#endif
}

}  // namespace attnserve
