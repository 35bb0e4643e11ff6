// Prefill attention on tensor cores (mma.sync m16n8k16, fp32 accumulation) over f16/bf16 KV
// pages: FlashAttention-2's loop with the paged gather of the CUDA-core kernel.
//
// A block of 4 warps owns 64 query rows of one KV head: the sequence's rows flattened as
// (token, group head), so a GQA/MQA group shares every K/V tile and nothing is repeated. Warp w
// owns rows [16w, 16w + 16) and keeps, in registers,
//   Q  as A fragments (16 x head_dim, rounded to the page type once),
//   O  as C fragments (16 x head_dim, fp32), and the running max m and partial sum l of its rows.
// Per tile of 64 keys the block gathers K (row-major) and V (transposed) from their pages into
// shared memory, then each warp
//   1. S = Q K^T             8 x head_dim/16 mma; scaled in fp32, soft-capped and ALiBi-biased
//                            (TransformLogit, variant_hooks.cuh); masked to [lo, hi) per row,
//   2. online softmax        row max over the 4 lanes sharing a row (two shuffles); O, l rescaled,
//   3. O += P V              P re-packed from S's C fragments straight into A fragments (the C
//                            layout of two adjacent 8-key tiles is the A layout of 16 keys).
// A warp skips tiles outside all of its rows' windows (causal and sliding-window tiles). Each row
// ends as O * OutputScale (1 / l, a sink joined).
//
// The source is shared with the CPU block emulator (simt.h), which runs it in CI.
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_PREFILL_MMA_CUH_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_PREFILL_MMA_CUH_

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/variant_hooks.cuh"
#include "kernels/cuda/simt/simt.h"

namespace attnserve::cuda {

// Shared memory of one block: 35.8 KB (head_dim 128) or 18.4 KB (64), under the 48 KB static
// limit. Rows are padded by 8 elements (16 bytes) so the 8 row groups of a warp's fragment loads
// fall on distinct banks: row stride = 4 banks mod 32.
template <int kHeadDim>
struct MmaPrefillStorage {
  static constexpr int kKeyStride = kHeadDim + 8;
  static constexpr int kValueStride = kMmaPrefillKeys + 8;
  alignas(16) uint16_t k[kMmaPrefillKeys * kKeyStride];  // k[key][dim]
  alignas(16) uint16_t vt[kHeadDim * kValueStride];      // vt[dim][key]: V transposed.
};

template <simt::Half16 kType, int kHeadDim>
ATTNSERVE_SIMT void MmaPrefillBlock(const AttentionParams& p, int item_index, int kv_head,
                                    MmaPrefillStorage<kHeadDim>& sm) {
  using Storage = MmaPrefillStorage<kHeadDim>;
  constexpr int kKeys = kMmaPrefillKeys;
  constexpr int kKeyTiles = kKeys / 8;         // 8-key n-tiles of S.
  constexpr int kDimSteps = kHeadDim / 16;     // k-steps of Q K^T.
  constexpr int kDimTiles = kHeadDim / 8;      // 8-dim n-tiles of O.
  constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks of one K/V row.

  const WorkItem item = p.items[item_index];
  const SequenceDesc seq = p.sequences[item.sequence];
  const int tid = simt::ThreadIndex();
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;  // Fragment row group and thread-in-group.
  const int rows = item.row_end - item.row_begin;
  const PagedKv& kv = p.kv;
  const int64_t value_offset = kv.ValueOffset();

  // ---- This lane's two rows (g and g + 8 of the warp's 16): where they live, what they see.
  int lo[2], hi[2], head_of[2] = {0, 0};
  int query[2] = {0, 0};          // Each row's query index in its sequence (ALiBi).
  float slope[2] = {0.0f, 0.0f};  // ALiBi slope of each row's head.
  const float* q_row[2];
  float* out_row[2];
  ATTNSERVE_UNROLL
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + g + 8 * i;
    lo[i] = hi[i] = 0;  // A padding row sees nothing and is never written.
    q_row[i] = nullptr;
    out_row[i] = nullptr;
    if (r < rows) {
      const int flat = item.row_begin + r;
      const int token = flat / p.group;
      const int head = kv_head * p.group + flat % p.group;
      head_of[i] = head;
      query[i] = seq.first_index + token;
      slope[i] = AlibiSlope(p.variant, head);
      p.mask.VisibleKeys(seq.first_index + token, seq.length, &lo[i], &hi[i]);
      q_row[i] = p.q + int64_t{seq.first_row + token} * p.q_stride + int64_t{head} * kHeadDim;
      out_row[i] = p.out + (int64_t{seq.first_row + token} * p.num_heads + head) * kHeadDim;
    }
  }
  // The warp's key range: rows are ordered by token, so its first row begins it and its last
  // row ends it (warp-uniform).
  const int warp_first = warp * 16;
  const int warp_last = (rows < warp_first + 16 ? rows : warp_first + 16) - 1;
  int warp_lo = 0, warp_hi = 0;
  if (warp_last >= warp_first) {
    int unused;
    p.mask.VisibleKeys(seq.first_index + (item.row_begin + warp_first) / p.group, seq.length,
                       &warp_lo, &unused);
    p.mask.VisibleKeys(seq.first_index + (item.row_begin + warp_last) / p.group, seq.length,
                       &unused, &warp_hi);
  }

  // ---- Q as A fragments, rounded once to the page type (padding rows are zero).
  uint32_t qa[kDimSteps][4];
  ATTNSERVE_UNROLL
  for (int s = 0; s < kDimSteps; ++s) {
    ATTNSERVE_UNROLL
    for (int half = 0; half < 2; ++half) {  // Columns 2t (half 0) or 2t + 8 (half 1).
      ATTNSERVE_UNROLL
      for (int i = 0; i < 2; ++i) {  // Rows g (i = 0) or g + 8 (i = 1).
        const int col = s * 16 + 8 * half + 2 * t;
        const float x0 = q_row[i] != nullptr ? q_row[i][col] : 0.0f;
        const float x1 = q_row[i] != nullptr ? q_row[i][col + 1] : 0.0f;
        qa[s][2 * half + i] = simt::PackPair<kType>(x0, x1);
      }
    }
  }

  float o[kDimTiles][4];
  ATTNSERVE_UNROLL
  for (int n = 0; n < kDimTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};  // This lane's share of each row sum; the quad adds them at the end.

  for (int tile = item.key_begin; tile < item.key_end; tile += kKeys) {
    const int count = item.key_end - tile < kKeys ? item.key_end - tile : kKeys;
    // ---- Gather the tile: 16-byte chunks of K rows and V rows; keys past `count` are zero.
    for (int c = tid; c < kKeys * kChunksPerRow; c += kMmaPrefillThreads) {
      const int key = c / kChunksPerRow, d0 = (c % kChunksPerRow) * 8;
      uint4 k_chunk = {0, 0, 0, 0}, v_chunk = {0, 0, 0, 0};
      const int index = tile + key;
      const int64_t page_offset =
          key < count ? kv.page_offsets[seq.first_page + index / kv.page_size] : -1;
      if (page_offset >= 0) {  // Evicted pages (-1) lie outside every row's window.
        const uint16_t* page =
            reinterpret_cast<const uint16_t*>(static_cast<const char*>(kv.pool) + page_offset);
        const int64_t element = kv.KeyElement(kv_head, index % kv.page_size) + d0;
        k_chunk = simt::Load16(page + element);
        v_chunk = simt::Load16(page + value_offset + element);
      }
      simt::Store16(sm.k + key * Storage::kKeyStride + d0, k_chunk);
      const uint32_t v_words[4] = {v_chunk.x, v_chunk.y, v_chunk.z, v_chunk.w};
      ATTNSERVE_UNROLL
      for (int j = 0; j < 8; ++j) {
        sm.vt[(d0 + j) * Storage::kValueStride + key] =
            static_cast<uint16_t>(j % 2 == 0 ? v_words[j / 2] & 0xFFFFu : v_words[j / 2] >> 16);
      }
    }
    simt::SyncBlock();

    if (tile < warp_hi && tile + count > warp_lo) {
      // ---- 1. S = Q K^T, scaled and masked.
      float s[kKeyTiles][4];
      ATTNSERVE_UNROLL
      for (int n = 0; n < kKeyTiles; ++n) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        const uint16_t* k_row = sm.k + (n * 8 + g) * Storage::kKeyStride + 2 * t;
        ATTNSERVE_UNROLL
        for (int step = 0; step < kDimSteps; ++step) {
          const uint32_t b[2] = {simt::LoadPair(k_row + step * 16),
                                 simt::LoadPair(k_row + step * 16 + 8)};
          simt::Mma16816<kType>(s[n], qa[step], b);
        }
      }
      float tile_max[2] = {-INFINITY, -INFINITY};
      ATTNSERVE_UNROLL
      for (int n = 0; n < kKeyTiles; ++n) {
        ATTNSERVE_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int i = e / 2;
          const int key = tile + n * 8 + 2 * t + (e & 1);
          const bool visible = key < tile + count && key >= lo[i] && key < hi[i];
          s[n][e] = visible ? TransformLogit(p.variant, s[n][e] * p.scale, slope[i], key - query[i])
                            : -INFINITY;
          tile_max[i] = fmaxf(tile_max[i], s[n][e]);
        }
      }
      // ---- 2. Online softmax: the 4 lanes of a quad hold one row's 64 scores between them.
      float corr[2];
      ATTNSERVE_UNROLL
      for (int i = 0; i < 2; ++i) {
        tile_max[i] = fmaxf(tile_max[i], simt::ShflXor(tile_max[i], 1));
        tile_max[i] = fmaxf(tile_max[i], simt::ShflXor(tile_max[i], 2));
        const float m_new = fmaxf(m[i], tile_max[i]);
        // A row with no visible key so far keeps m = -inf, l = 0, O = 0.
        corr[i] = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
        m[i] = m_new;
        l[i] *= corr[i];
      }
      ATTNSERVE_UNROLL
      for (int n = 0; n < kKeyTiles; ++n) {
        ATTNSERVE_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int i = e / 2;
          s[n][e] = m[i] == -INFINITY ? 0.0f : expf(s[n][e] - m[i]);  // exp(-inf) = 0: masked.
          l[i] += s[n][e];
        }
      }
      ATTNSERVE_UNROLL
      for (int n = 0; n < kDimTiles; ++n) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
      }
      // ---- 3. O += P V, 16 keys per k-step.
      ATTNSERVE_UNROLL
      for (int step = 0; step < kKeys / 16; ++step) {
        const uint32_t pa[4] = {
            simt::PackPair<kType>(s[2 * step][0], s[2 * step][1]),
            simt::PackPair<kType>(s[2 * step][2], s[2 * step][3]),
            simt::PackPair<kType>(s[2 * step + 1][0], s[2 * step + 1][1]),
            simt::PackPair<kType>(s[2 * step + 1][2], s[2 * step + 1][3]),
        };
        ATTNSERVE_UNROLL
        for (int n = 0; n < kDimTiles; ++n) {
          const uint16_t* v_row = sm.vt + (n * 8 + g) * Storage::kValueStride + step * 16 + 2 * t;
          const uint32_t b[2] = {simt::LoadPair(v_row), simt::LoadPair(v_row + 8)};
          simt::Mma16816<kType>(o[n], pa, b);
        }
      }
    }
    simt::SyncBlock();  // The next gather overwrites the tile.
  }

  // ---- O / l. The quad's lanes hold disjoint columns of each row's sum.
  ATTNSERVE_UNROLL
  for (int i = 0; i < 2; ++i) {
    l[i] += simt::ShflXor(l[i], 1);
    l[i] += simt::ShflXor(l[i], 2);
  }
  ATTNSERVE_UNROLL
  for (int i = 0; i < 2; ++i) {
    if (out_row[i] == nullptr) continue;
    const float inv = OutputScale(p.variant, head_of[i], m[i], l[i]);
    ATTNSERVE_UNROLL
    for (int n = 0; n < kDimTiles; ++n) {
      out_row[i][n * 8 + 2 * t] = o[n][2 * i] * inv;
      out_row[i][n * 8 + 2 * t + 1] = o[n][2 * i + 1] * inv;
    }
  }
}

#if defined(__CUDACC__)

// grid (num_items, num_kv_heads); items planned with kMmaPrefillRows rows per block.
template <simt::Half16 kType, int kHeadDim>
__global__ void __launch_bounds__(kMmaPrefillThreads) MmaPrefillKernel(const AttentionParams p) {
  __shared__ MmaPrefillStorage<kHeadDim> sm;
  MmaPrefillBlock<kType, kHeadDim>(p, blockIdx.x, blockIdx.y, sm);
}

template <KvType kKv, int kHeadDim>
cudaError_t LaunchMmaPrefill(const AttentionParams& params, cudaStream_t stream) {
  static_assert(kKv != KvType::kF32, "tensor-core prefill takes 16-bit pages");
  constexpr simt::Half16 kType = kKv == KvType::kBF16 ? simt::Half16::kBF16 : simt::Half16::kF16;
  if (params.num_items == 0) return cudaSuccess;
  const dim3 grid(params.num_items, params.kv.num_kv_heads, 1);
  MmaPrefillKernel<kType, kHeadDim><<<grid, kMmaPrefillThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

#define ATTNSERVE_INSTANTIATE_MMA_PREFILL(KV)                                          \
  template cudaError_t LaunchMmaPrefill<KV, 64>(const AttentionParams&, cudaStream_t); \
  template cudaError_t LaunchMmaPrefill<KV, 128>(const AttentionParams&, cudaStream_t);

#endif

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_PREFILL_MMA_CUH_
