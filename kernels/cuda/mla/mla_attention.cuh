// Absorbed-form MLA paged attention over the latent pages: prefill (causal, chunked over a cached
// prefix, ragged batches) and split-KV decode, one block loop for both (MlaAttendRows). All heads
// share one "KV head", the cached row [c_kv | k_pe]: the key is the whole row (latent + rope
// wide), the value its first `latent` elements, so each tile of rows is read once from the pages
// for kMlaRowsPerBlock query rows and serves as both K and V.
//
// Per key tile of kMlaKeysPerTile keys the block
//   1. gathers the rows from their pages into shared memory (float),
//   2. S = Q . K^T (Q pre-scaled), -inf outside each row's visible keys,
//   3. updates each row's running max m and sum l (warp per row), S -> P,
//   4. O = O * exp(m_old - m_new) + P . K[:, 0:latent].
// Prefill writes O / l; decode writes (m, l, O) per split and the GQA path's combine merges them.
//
// fp32 on CUDA cores for every page type (decode is bound by reading the pages); 8-bit pages are
// dequantized in the gather (code times the page's latent or RoPE key scale, as the CPU's
// DequantizePageRows). The widths are runtime values (DeepSeek-V2/V3: 512 + 64), so the tile
// lives in dynamic shared memory laid out by MlaTileLayout (105 KB at 512 + 64 with 16 rows and
// 16 keys). Block functions are written against simt.h, so the same source runs on the CPU block
// emulator in CI; the __global__ wrappers and launchers are in mla_attention.cu.
#ifndef ATTNSERVE_KERNELS_CUDA_MLA_MLA_ATTENTION_CUH_
#define ATTNSERVE_KERNELS_CUDA_MLA_MLA_ATTENTION_CUH_

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention/kv_element.cuh"
#include "kernels/cuda/mla/mla_params.h"
#include "kernels/cuda/simt/simt.h"

namespace attnserve::cuda {

// ---- Helpers ------------------------------------------------------------------------------------

// The online-softmax loop over keys [key_begin, key_end) of one sequence for `rows` query rows
// whose queries, state and visible ranges the caller has put in shared memory.
template <KvType kKv>
ATTNSERVE_SIMT void MlaAttendRows(const MlaTileLayout& t, float* smem, const MlaPagedKv& kv,
                                  const SequenceDesc& seq, int rows, int key_begin, int key_end) {
  using Elem = KvElement<kKv>;
  using T = typename Elem::T;
  constexpr int kKeys = kMlaKeysPerTile;
  const int tid = simt::ThreadIndex(), lane = tid % 32, warp = tid / 32;
  const int width = t.width, latent = t.latent, k_stride = width + 1;
  float* q = smem + t.q;
  float* o = smem + t.o;
  float* k = smem + t.k;
  float* s = smem + t.s;
  float* m = smem + t.m;
  float* l = smem + t.l;
  float* corr = smem + t.corr;
  const int* lo = reinterpret_cast<const int*>(smem + t.lo);
  const int* hi = reinterpret_cast<const int*>(smem + t.hi);

  for (int tile = key_begin; tile < key_end; tile += kKeys) {
    const int count = key_end - tile < kKeys ? key_end - tile : kKeys;
    // 1. Cached rows -> shared memory (consecutive threads read consecutive elements of a row).
    for (int e = tid; e < kKeys * width; e += kMlaThreads) {
      const int key = e / width, d = e % width;
      float value = 0.0f;
      if (key < count) {
        const int index = tile + key;
        const int64_t page_offset = kv.page_offsets[seq.first_page + index / kv.page_size];
        if (page_offset >= 0) {  // Always true for a correct plan; guards against a stray read.
          const char* bytes = static_cast<const char*>(kv.pool) + page_offset;
          const T* page = reinterpret_cast<const T*>(bytes);
          value = Elem::Load(page + kv.RowElement(index % kv.page_size) + d);
          if constexpr (Elem::kQuantized) {  // Code times its page's latent or RoPE key scale.
            value *= reinterpret_cast<const float*>(bytes + kv.ScalesOffset())[d < latent ? 0 : 1];
          }
        }
      }
      k[key * k_stride + d] = value;
    }
    simt::SyncBlock();
    // 2. S = Q . K^T over the whole row [c | k_pe], -inf outside each row's visible keys.
    for (int e = tid; e < rows * kKeys; e += kMlaThreads) {
      const int r = e / kKeys, key = e % kKeys;
      const int index = tile + key;
      float score = -INFINITY;
      if (key < count && index >= lo[r] && index < hi[r]) {
        const float* qr = q + r * width;
        const float* kr = k + key * k_stride;
        float dot = 0.0f;
        ATTNSERVE_UNROLL_BY(8)
        for (int d = 0; d < width; ++d) dot = fmaf(qr[d], kr[d], dot);
        score = dot;
      }
      s[r * kKeys + key] = score;
    }
    simt::SyncBlock();
    // 3. Online softmax, one warp per row, one lane per key (warp-uniform loop for the shuffles).
    for (int r = warp; r < rows; r += kMlaThreads / 32) {
      const float score = lane < kKeys ? s[r * kKeys + lane] : -INFINITY;
      const float m_old = m[r];
      const float m_new = fmaxf(m_old, WarpMax(score));
      float prob = 0.0f, c = 1.0f;
      if (m_new != -INFINITY) {  // A row that has seen no visible key keeps m = -inf, l = 0.
        prob = expf(score - m_new);
        c = expf(m_old - m_new);
      }
      const float tile_sum = WarpSum(prob);
      if (lane < kKeys) s[r * kKeys + lane] = prob;
      if (lane == 0) {
        l[r] = l[r] * c + tile_sum;
        m[r] = m_new;
        corr[r] = c;
      }
    }
    simt::SyncBlock();
    // 4. O = O * corr + P . V, V = the tile's first `latent` columns.
    for (int e = tid; e < rows * latent; e += kMlaThreads) {
      const int r = e / latent, d = e % latent;
      float acc = o[r * latent + d] * corr[r];
      for (int key = 0; key < count; ++key) acc = fmaf(s[r * kKeys + key], k[key * k_stride + d], acc);
      o[r * latent + d] = acc;
    }
    simt::SyncBlock();
  }
}

// Loads `rows` absorbed query rows (row r at q + q_row(r) * width), scaled, and resets the state.
template <typename QRow>
ATTNSERVE_SIMT void MlaLoadQueries(const MlaTileLayout& t, float* smem, const float* q_lat,
                                   float scale, int rows, QRow q_row) {
  const int tid = simt::ThreadIndex();
  for (int e = tid; e < rows * t.width; e += kMlaThreads) {
    const int r = e / t.width, d = e % t.width;
    smem[t.q + r * t.width + d] = q_lat[int64_t{q_row(r)} * t.width + d] * scale;
  }
  for (int e = tid; e < rows * t.latent; e += kMlaThreads) smem[t.o + e] = 0.0f;
  if (tid < rows) {
    smem[t.m + tid] = -INFINITY;
    smem[t.l + tid] = 0.0f;
  }
}

// ---- Block functions ----------------------------------------------------------------------------

// One block of the prefill: block `item_index` of grid (num_items). Rows are (token, head) pairs
// of the sequence's new tokens, flattened token-major (PlanPrefillItems with group = num_heads).
template <KvType kKv>
ATTNSERVE_SIMT void MlaPrefillBlock(const MlaAttentionParams& p, int item_index, float* smem) {
  const MlaTileLayout t(p.kv.latent_dim, p.kv.rope_dim);
  const int tid = simt::ThreadIndex();
  const WorkItem item = p.items[item_index];
  const SequenceDesc seq = p.sequences[item.sequence];
  const int rows = item.row_end - item.row_begin;
  int* lo = reinterpret_cast<int*>(smem + t.lo);
  int* hi = reinterpret_cast<int*>(smem + t.hi);
  int* out_row = reinterpret_cast<int*>(smem + t.out_row);
  if (tid < rows) {
    const int flat = item.row_begin + tid;
    const int token = flat / p.num_heads;
    p.mask.VisibleKeys(seq.first_index + token, seq.length, &lo[tid], &hi[tid]);
    out_row[tid] = seq.first_row * p.num_heads + flat;  // (row, head) of the batch, flattened.
  }
  MlaLoadQueries(t, smem, p.q, p.scale, rows,
                 [&](int r) { return seq.first_row * p.num_heads + item.row_begin + r; });
  simt::SyncBlock();
  MlaAttendRows<kKv>(t, smem, p.kv, seq, rows, item.key_begin, item.key_end);
  for (int e = tid; e < rows * t.latent; e += kMlaThreads) {
    const int r = e / t.latent, d = e % t.latent;
    const float l = smem[t.l + r];
    p.out[int64_t{out_row[r]} * t.latent + d] = l > 0.0f ? smem[t.o + e] / l : 0.0f;
  }
}

// One block of the split-KV decode: block (item_index, row_block) of grid (num_items,
// ceil(num_heads / kMlaRowsPerBlock)): heads [row_block * 16, ...) of the sequence's new token
// over one KV split. Writes the split's partial state.
template <KvType kKv>
ATTNSERVE_SIMT void MlaDecodeBlock(const MlaAttentionParams& p, int item_index, int row_block,
                                   float* smem) {
  const MlaTileLayout t(p.kv.latent_dim, p.kv.rope_dim);
  const int tid = simt::ThreadIndex();
  const WorkItem item = p.items[item_index];
  const SequenceDesc seq = p.sequences[item.sequence];
  const int h0 = row_block * kMlaRowsPerBlock;
  const int rows = p.num_heads - h0 < kMlaRowsPerBlock ? p.num_heads - h0 : kMlaRowsPerBlock;
  if (rows <= 0) return;  // Block-uniform: no thread reaches a barrier.
  if (tid < rows) {
    reinterpret_cast<int*>(smem + t.lo)[tid] = item.key_begin;  // The split is all visible.
    reinterpret_cast<int*>(smem + t.hi)[tid] = item.key_end;
  }
  MlaLoadQueries(t, smem, p.q, p.scale, rows,
                 [&](int r) { return seq.first_row * p.num_heads + h0 + r; });
  simt::SyncBlock();
  MlaAttendRows<kKv>(t, smem, p.kv, seq, rows, item.key_begin, item.key_end);
  const int64_t partial_row = int64_t{item_index} * p.num_heads + h0;
  for (int e = tid; e < rows * t.latent; e += kMlaThreads) {
    p.partial_acc[partial_row * t.latent + e] = smem[t.o + e];
  }
  if (tid < rows) {
    p.partial_max[partial_row + tid] = smem[t.m + tid];
    p.partial_sum[partial_row + tid] = smem[t.l + tid];
  }
}

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_MLA_MLA_ATTENTION_CUH_
