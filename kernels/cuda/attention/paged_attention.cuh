// Paged attention over the KV pool: prefill (a tiled online-softmax flash-attention kernel) and
// split-KV decode (flash-decoding). Both kernels run the same block-level loop, AttendRows: a
// block owns up to kAttentionRowsPerBlock query rows of ONE KV head (the query heads of a GQA/MQA
// group, and for prefill several tokens), so each KV tile is read once for all of them.
//
// Per key tile of kKeys keys the block
//   1. gathers K and V rows from their pages into shared memory (float),
//   2. S = Q . K^T (Q pre-scaled by the softmax scale), masked to each row's visible keys,
//   3. updates each row's running max m and sum l (warp per row) and turns S into P,
//   4. O = O * exp(m_old - m_new) + P . V.
// Prefill writes O / l; decode writes (m, l, O) per KV split and a combine kernel merges splits.
//
// These run on CUDA cores in fp32: decode for every page type (it is bound by reading KV, not by
// arithmetic) and prefill for f32 and 8-bit pages (dequantized as the tile is gathered) and at
// head dim 256; f16/bf16 prefill at 64 and 128 runs on tensor cores (prefill_mma.cuh).
// Masking is in MaskSpec and in the host plan (key ranges), never in the loop body beyond the
// per-row [lo, hi) test; soft-cap, ALiBi and sinks are hooks (variant_hooks.cuh).
//
// Each kernel body is a block function (PrefillBlock, PagedDecodeBlock) written against simt.h, so
// the same source also runs on the CPU block emulator, which is how CI (no GPU) executes it
// (tests/gpu/attention_emulation_test.cc); the __global__ wrappers and launchers are nvcc
// only.
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_CUH_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_CUH_

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention/kv_element.cuh"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/variant_hooks.cuh"
#include "kernels/cuda/simt/simt.h"

namespace attnserve::cuda {

// ---- Tile plan ----------------------------------------------------------------------------------

template <int kHeadDim>
struct TileTraits {
  static constexpr int kRows = kAttentionRowsPerBlock;  // Query rows per block.
  // Keys per tile: 32 (D=64), 16 (D=128), 4 (D=256: Q and O alone take 32 KB of shared memory).
  static constexpr int kKeys = kHeadDim > 128 ? 1024 / kHeadDim : 2048 / kHeadDim;
  static constexpr int kThreads = kAttentionThreads;
  static constexpr int kWarps = kThreads / 32;
  static_assert(kKeys <= 32, "softmax step gives each lane one key of the tile");
};

// Shared memory of one block: 27.3 KB (D=64), 34.4 KB (D=128) or 41.8 KB (D=256), under the
// 48 KB static limit.
template <int kHeadDim>
struct TileStorage {
  using Traits = TileTraits<kHeadDim>;
  float q[Traits::kRows][kHeadDim];      // Q rows, pre-scaled.
  float o[Traits::kRows][kHeadDim];      // Unnormalised output accumulators.
  float k[Traits::kKeys][kHeadDim + 1];  // +1: lanes reading different keys hit distinct banks.
  float v[Traits::kKeys][kHeadDim];
  float s[Traits::kRows][Traits::kKeys];  // Scores, then probabilities.
  float m[Traits::kRows];                 // Running max.
  float l[Traits::kRows];                 // Running sum.
  float corr[Traits::kRows];              // exp(m_old - m_new) of the current tile.
  int lo[Traits::kRows];                  // Visible keys of each row: [lo, hi).
  int hi[Traits::kRows];
  float slope[Traits::kRows];  // ALiBi slope of each row's head (0 without ALiBi).
  int query[Traits::kRows];    // Each row's query index in its sequence (ALiBi's key - query).
  int64_t out_offset[Traits::kRows];  // Prefill: where each row's output goes.
};

// ---- Helpers ------------------------------------------------------------------------------------

// Loads `rows` query rows (row r from q + q_offset(r)) scaled by `scale`, and resets the softmax
// state. Callers fill lo/hi, slope and query before calling AttendRows.
template <int kHeadDim, typename QOffset>
ATTNSERVE_SIMT void LoadQueries(TileStorage<kHeadDim>& sm, const float* q, float scale, int rows,
                                QOffset q_offset) {
  const int tid = simt::ThreadIndex();
  for (int e = tid; e < rows * kHeadDim; e += kAttentionThreads) {
    const int r = e / kHeadDim, d = e % kHeadDim;
    sm.q[r][d] = q[q_offset(r) + d] * scale;
    sm.o[r][d] = 0.0f;
  }
  if (tid < rows) {
    sm.m[tid] = -INFINITY;
    sm.l[tid] = 0.0f;
  }
}

// The online-softmax loop over keys [key_begin, key_end) of one sequence and KV head.
template <KvType kKv, int kHeadDim>
ATTNSERVE_SIMT void AttendRows(TileStorage<kHeadDim>& sm, const PagedKv& kv,
                               const AttentionVariantParams& variant, const SequenceDesc& seq,
                               int kv_head, int rows, int key_begin, int key_end) {
  using Traits = TileTraits<kHeadDim>;
  using Elem = KvElement<kKv>;
  using T = typename Elem::T;
  constexpr int kKeys = Traits::kKeys;
  const int tid = simt::ThreadIndex(), lane = tid % 32, warp = tid / 32;
  const int64_t value_offset = kv.ValueOffset();

  for (int tile = key_begin; tile < key_end; tile += kKeys) {
    const int count = key_end - tile < kKeys ? key_end - tile : kKeys;
    // 1. K, V tile -> shared memory (consecutive threads read consecutive elements of a row).
    for (int e = tid; e < kKeys * kHeadDim; e += kAttentionThreads) {
      const int k = e / kHeadDim, d = e % kHeadDim;
      float key = 0.0f, value = 0.0f;
      if (k < count) {
        const int index = tile + k;
        const int64_t page_offset = kv.page_offsets[seq.first_page + index / kv.page_size];
        if (page_offset >= 0) {  // Always true for a correct plan; guards against a stray read.
          const char* page_bytes = static_cast<const char*>(kv.pool) + page_offset;
          const T* page = reinterpret_cast<const T*>(page_bytes);
          const int64_t element = kv.KeyElement(kv_head, index % kv.page_size) + d;
          key = Elem::Load(page + element);
          value = Elem::Load(page + value_offset + element);
          if constexpr (Elem::kQuantized) {  // value(code) * the page's scale, as the CPU reads it.
            const float* scales = reinterpret_cast<const float*>(page_bytes + kv.scales_offset);
            key *= scales[kv_head];
            value *= scales[kv.num_kv_heads + kv_head];
          }
        }
      }
      sm.k[k][d] = key;
      sm.v[k][d] = value;
    }
    simt::SyncBlock();
    // 2. S = Q . K^T (soft-capped, ALiBi-biased: TransformLogit), -inf outside each row's visible
    //    keys.
    for (int e = tid; e < rows * kKeys; e += kAttentionThreads) {
      const int r = e / kKeys, k = e % kKeys;
      const int index = tile + k;
      float score = -INFINITY;
      if (k < count && index >= sm.lo[r] && index < sm.hi[r]) {
        float dot = 0.0f;
        ATTNSERVE_UNROLL_BY(8)
        for (int d = 0; d < kHeadDim; ++d) dot = fmaf(sm.q[r][d], sm.k[k][d], dot);
        score = TransformLogit(variant, dot, sm.slope[r], index - sm.query[r]);
      }
      sm.s[r][k] = score;
    }
    simt::SyncBlock();
    // 3. Online softmax, one warp per row, one lane per key. The loop is warp-uniform (rows and
    //    warp are), as the shuffles of WarpMax/WarpSum require.
    for (int r = warp; r < rows; r += Traits::kWarps) {
      const float score = lane < kKeys ? sm.s[r][lane] : -INFINITY;
      const float m_old = sm.m[r];
      const float m_new = fmaxf(m_old, WarpMax(score));
      float prob = 0.0f, corr = 1.0f;
      if (m_new != -INFINITY) {  // A row that has seen no visible key yet keeps m = -inf, l = 0.
        prob = expf(score - m_new);  // exp(-inf) = 0 for masked keys.
        corr = expf(m_old - m_new);
      }
      const float tile_sum = WarpSum(prob);
      if (lane < kKeys) sm.s[r][lane] = prob;
      if (lane == 0) {
        sm.l[r] = sm.l[r] * corr + tile_sum;
        sm.m[r] = m_new;
        sm.corr[r] = corr;
      }
    }
    simt::SyncBlock();
    // 4. O = O * corr + P . V
    for (int e = tid; e < rows * kHeadDim; e += kAttentionThreads) {
      const int r = e / kHeadDim, d = e % kHeadDim;
      float acc = sm.o[r][d] * sm.corr[r];
      for (int k = 0; k < count; ++k) acc = fmaf(sm.s[r][k], sm.v[k][d], acc);
      sm.o[r][d] = acc;
    }
    simt::SyncBlock();
  }
}

// ---- Block functions ----------------------------------------------------------------------------

// One block of the prefill: block (item_index, kv_head) of grid (num_items, num_kv_heads, 1). An
// item is (sequence, query-row chunk), its key range the union of its rows' visible keys.
template <KvType kKv, int kHeadDim>
ATTNSERVE_SIMT void PrefillBlock(const AttentionParams& p, int item_index, int kv_head,
                                 TileStorage<kHeadDim>& sm) {
  const int tid = simt::ThreadIndex();
  const WorkItem item = p.items[item_index];
  const SequenceDesc seq = p.sequences[item.sequence];
  const int rows = item.row_end - item.row_begin;
  // Row r is (token t, group head g) of the sequence's new tokens.
  if (tid < rows) {
    const int flat = item.row_begin + tid;
    const int t = flat / p.group, g = flat % p.group;
    int lo, hi;
    p.mask.VisibleKeys(seq.first_index + t, seq.length, &lo, &hi);
    sm.lo[tid] = lo;
    sm.hi[tid] = hi;
    sm.slope[tid] = AlibiSlope(p.variant, kv_head * p.group + g);
    sm.query[tid] = seq.first_index + t;
    sm.out_offset[tid] = int64_t{seq.first_row + t} * p.num_heads * kHeadDim +
                         int64_t{kv_head * p.group + g} * kHeadDim;
  }
  LoadQueries(sm, p.q, p.scale, rows, [&](int r) {
    const int flat = item.row_begin + r;
    const int t = flat / p.group, g = flat % p.group;
    return int64_t{seq.first_row + t} * p.q_stride + int64_t{kv_head * p.group + g} * kHeadDim;
  });
  simt::SyncBlock();
  AttendRows<kKv, kHeadDim>(sm, p.kv, p.variant, seq, kv_head, rows, item.key_begin,
                            item.key_end);
  // O's row factor (1 / l, a sink joined) into corr, free after the loop.
  if (tid < rows) {
    const int head = kv_head * p.group + (item.row_begin + tid) % p.group;
    sm.corr[tid] = OutputScale(p.variant, head, sm.m[tid], sm.l[tid]);
  }
  simt::SyncBlock();
  for (int e = tid; e < rows * kHeadDim; e += kAttentionThreads) {
    const int r = e / kHeadDim, d = e % kHeadDim;
    p.out[sm.out_offset[r] + d] = sm.o[r][d] * sm.corr[r];
  }
}

// One block of the split-KV decode: block (item_index, kv_head, row_block) of grid (num_items,
// num_kv_heads, row_blocks). An item is one KV split of one sequence, and row_block picks which
// kAttentionRowsPerBlock heads of the KV head's group this block serves (0 unless the group is
// larger). Writes the split's partial state; the combine (combine.cuh) finishes.
template <KvType kKv, int kHeadDim>
ATTNSERVE_SIMT void PagedDecodeBlock(const AttentionParams& p, int item_index, int kv_head,
                                     int row_block, TileStorage<kHeadDim>& sm) {
  const int tid = simt::ThreadIndex();
  const WorkItem item = p.items[item_index];
  const SequenceDesc seq = p.sequences[item.sequence];
  const int g0 = row_block * kAttentionRowsPerBlock;
  const int rows = p.group - g0 < kAttentionRowsPerBlock ? p.group - g0 : kAttentionRowsPerBlock;
  if (rows <= 0) return;  // Block-uniform: no thread reaches a barrier.
  const int first_head = kv_head * p.group + g0;
  if (tid < rows) {
    sm.lo[tid] = item.key_begin;  // Every key of the split is visible to the new token.
    sm.hi[tid] = item.key_end;
    sm.slope[tid] = AlibiSlope(p.variant, first_head + tid);
    sm.query[tid] = seq.first_index;  // The new token: length - 1, as the CPU's decode.
  }
  LoadQueries(sm, p.q, p.scale, rows, [&](int r) {
    return int64_t{seq.first_row} * p.q_stride + int64_t{first_head + r} * kHeadDim;
  });
  simt::SyncBlock();
  // Sinks join in the combine, once per row: a split's partial state never holds one.
  AttendRows<kKv, kHeadDim>(sm, p.kv, p.variant, seq, kv_head, rows, item.key_begin,
                            item.key_end);
  const int64_t partial_row = int64_t{item_index} * p.num_heads + first_head;
  for (int e = tid; e < rows * kHeadDim; e += kAttentionThreads) {
    const int r = e / kHeadDim, d = e % kHeadDim;
    p.partial_acc[(partial_row + r) * kHeadDim + d] = sm.o[r][d];
  }
  if (tid < rows) {
    p.partial_max[partial_row + tid] = sm.m[tid];
    p.partial_sum[partial_row + tid] = sm.l[tid];
  }
}

#if defined(__CUDACC__)

// ---- Kernels ------------------------------------------------------------------------------------

template <KvType kKv, int kHeadDim>
__global__ void __launch_bounds__(kAttentionThreads) PrefillKernel(const AttentionParams p) {
  __shared__ TileStorage<kHeadDim> sm;
  PrefillBlock<kKv, kHeadDim>(p, blockIdx.x, blockIdx.y, sm);
}

template <KvType kKv, int kHeadDim>
__global__ void __launch_bounds__(kAttentionThreads) PagedDecodeKernel(const AttentionParams p) {
  __shared__ TileStorage<kHeadDim> sm;
  PagedDecodeBlock<kKv, kHeadDim>(p, blockIdx.x, blockIdx.y, blockIdx.z, sm);
}

// ---- Launchers ----------------------------------------------------------------------------------

template <KvType kKv, int kHeadDim>
cudaError_t LaunchPrefill(const AttentionParams& params, cudaStream_t stream) {
  if (params.num_items == 0) return cudaSuccess;
  const dim3 grid(params.num_items, params.kv.num_kv_heads, 1);
  PrefillKernel<kKv, kHeadDim><<<grid, kAttentionThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

template <KvType kKv, int kHeadDim>
cudaError_t LaunchPagedDecode(const AttentionParams& params, int row_blocks, cudaStream_t stream) {
  if (params.num_items == 0) return cudaSuccess;
  const dim3 grid(params.num_items, params.kv.num_kv_heads, row_blocks);
  PagedDecodeKernel<kKv, kHeadDim><<<grid, kAttentionThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

// Instantiations per KV type and the supported head dims (prefill: f32 pages at 64 and 128, every
// page type at 256; 16-bit pages at 64 and 128 prefill on tensor cores, prefill_mma.cuh).
#define ATTNSERVE_INSTANTIATE_PREFILL(KV)                                           \
  template cudaError_t LaunchPrefill<KV, 64>(const AttentionParams&, cudaStream_t); \
  template cudaError_t LaunchPrefill<KV, 128>(const AttentionParams&, cudaStream_t);
#define ATTNSERVE_INSTANTIATE_PREFILL_HD256(KV) \
  template cudaError_t LaunchPrefill<KV, 256>(const AttentionParams&, cudaStream_t);
#define ATTNSERVE_INSTANTIATE_DECODE(KV)                                                      \
  template cudaError_t LaunchPagedDecode<KV, 64>(const AttentionParams&, int, cudaStream_t);  \
  template cudaError_t LaunchPagedDecode<KV, 128>(const AttentionParams&, int, cudaStream_t); \
  template cudaError_t LaunchPagedDecode<KV, 256>(const AttentionParams&, int, cudaStream_t);

#endif  // defined(__CUDACC__)

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_CUH_
