// The MLA kernels around the attention (their launchers are in mla_latent.cu):
//   MlaAppendBlock  RMSNorm of the q latent and of c_kv, RoPE of k_pe, [c_kv | k_pe] -> page slot
//   MlaQuantizedAppendBlock  8-bit pages: the rows MlaAppendBlock left in `latent` -> codes
//   MlaQueryBlock   q_lat = [q_nope . W_UK_h | RoPE(q_pe)]   (W_UK absorbed into the query)
//   MlaOutputBlock  out_h = o_lat_h . W_UV_h^T               (W_UV applied after attention)
// Written against simt.h, so the same source runs on the CPU block emulator in CI.
#ifndef ATTNSERVE_KERNELS_CUDA_MLA_MLA_LATENT_CUH_
#define ATTNSERVE_KERNELS_CUDA_MLA_MLA_LATENT_CUH_

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention/kv_element.cuh"
#include "kernels/cuda/mla/mla_params.h"
#include "kernels/cuda/simt/simt.h"
#include "kernels/kv/kv_codes.h"

namespace attnserve::cuda {

struct MlaAppendStorage {
  float partial[kMlaLatentThreads / 32];
  float inv_rms;
};

// ---- Helpers ------------------------------------------------------------------------------------

// x[i] <- weight[i] * (x[i] * inv_rms), inv_rms = 1 / sqrt(mean(x^2) + eps): DeepseekV3RMSNorm in
// fp32, the CPU's RmsNormRows. Every thread of the block calls it.
ATTNSERVE_SIMT void BlockRmsNorm(float* x, const float* weight, int width, float eps,
                                 MlaAppendStorage& sm) {
  const int tid = simt::ThreadIndex(), lane = tid % 32, warp = tid / 32;
  float sum = 0.0f;
  for (int i = tid; i < width; i += kMlaLatentThreads) sum = fmaf(x[i], x[i], sum);
  sum = WarpSum(sum);
  if (lane == 0) sm.partial[warp] = sum;
  simt::SyncBlock();
  if (tid == 0) {
    float total = 0.0f;
    for (int w = 0; w < kMlaLatentThreads / 32; ++w) total += sm.partial[w];
    sm.inv_rms = 1.0f / sqrtf(total / static_cast<float>(width) + eps);
  }
  simt::SyncBlock();
  const float inv_rms = sm.inv_rms;
  for (int i = tid; i < width; i += kMlaLatentThreads) x[i] = weight[i] * (x[i] * inv_rms);
  simt::SyncBlock();
}

// Rotates pair i of the `rope.rotary_dim`-wide vector `in` at `position` into `out` (may alias),
// by the CPU's formula (RotaryPositions, kernels/spec/attention_variation.h).
ATTNSERVE_SIMT void RotateMlaPair(const RotaryPositions& rope, int64_t position, const float* in,
                                  float* out, int i) {
  float c, s;
  rope.PairCosSin(position, i, &c, &s);
  rope.RotatePair(in, out, i, c, s);
}

// ---- Block functions ----------------------------------------------------------------------------

// Block `row` of grid (rows). 8-bit pages: stops before the store (MlaQuantizedAppendBlock).
template <KvType kKv>
ATTNSERVE_SIMT void MlaAppendBlock(const MlaAppendParams& p, int row, MlaAppendStorage& sm) {
  using Elem = KvElement<kKv>;
  using T = typename Elem::T;
  const int tid = simt::ThreadIndex();
  const int width = p.kv.row_width();
  if (p.q_lora > 0) BlockRmsNorm(p.q_latent + int64_t{row} * p.q_lora, p.q_norm, p.q_lora, p.eps, sm);
  float* latent = p.latent + int64_t{row} * width;
  BlockRmsNorm(latent, p.kv_norm, p.kv.latent_dim, p.eps, sm);
  float* k_pe = latent + p.kv.latent_dim;
  for (int i = tid; i < p.rope.pairs(); i += kMlaLatentThreads) {
    RotateMlaPair(p.rope, p.positions[row], k_pe, k_pe, i);
  }
  simt::SyncBlock();
  if constexpr (!Elem::kQuantized) {
    const SequenceDesc seq = p.sequences[p.row_sequence[row]];
    const int index = seq.first_index + (row - seq.first_row);
    const int64_t page_offset = p.kv.page_offsets[seq.first_page + index / p.kv.page_size];
    if (page_offset < 0) return;  // Impossible for a correct plan: new tokens' pages are reserved.
    T* page = reinterpret_cast<T*>(static_cast<char*>(p.kv.pool) + page_offset);
    T* slot = page + p.kv.RowElement(index % p.kv.page_size);
    for (int e = tid; e < width; e += kMlaLatentThreads) Elem::Store(slot + e, latent[e]);
  }
}

// Block (b, segment) of grid (batch, 2), one warp: quantizes sequence b's new rows, in order,
// into their pages with the rule of the CPU's WritePageRow (kernels/cpu/host_page_store.cc) and
// the arithmetic of kernels/kv/kv_codes.h, so the pages hold the CPU's bytes. Segment 0 is the
// latent c_kv (columns [0, latent_dim), scale 0), segment 1 the RoPE key k_pe (the rest, scale
// 1; none without RoPE dims, whose scale the CPU leaves unwritten too). A page's scale is set by
// its slot-0 row and grows, requantizing the page's earlier rows, when a later row needs more:
// the rows of a page are sequential, as in the GQA path's QuantizedAppendBlock (kv_append.cuh).
template <bool kFp8>
ATTNSERVE_SIMT void MlaQuantizedAppendBlock(const MlaAppendParams& p, int b, int segment) {
  const int lane = simt::ThreadIndex();
  const MlaPagedKv& kv = p.kv;
  const int width = kv.row_width();
  const int begin = segment == 0 ? 0 : kv.latent_dim;
  const int end = segment == 0 ? kv.latent_dim : width;
  if (begin >= end) return;  // Block-uniform: no RoPE key.
  const int columns = end - begin;
  const SequenceDesc seq = p.sequences[b];
  for (int i = 0; i < seq.num_new; ++i) {  // Block-uniform: every lane runs every row.
    const int index = seq.first_index + i;
    const int64_t page_offset = kv.page_offsets[seq.first_page + index / kv.page_size];
    if (page_offset < 0) continue;  // Impossible for a correct plan: new tokens' pages exist.
    char* page = static_cast<char*>(kv.pool) + page_offset;
    uint8_t* codes = reinterpret_cast<uint8_t*>(page) + begin;  // Slot 0's first column.
    float* scale = reinterpret_cast<float*>(page + kv.ScalesOffset()) + segment;
    const int slot = index % kv.page_size;
    const float* x = p.latent + int64_t{seq.first_row + i} * width + begin;
    // The segment's finite absmax (a non-finite value never sets the scale; it is stored as NaN).
    float absmax = 0.0f;
    for (int c = lane; c < columns; c += kMlaQuantizedAppendThreads) {
      const float magnitude = fabsf(x[c]);
      if (magnitude <= 3.402823466e38f) absmax = fmaxf(absmax, magnitude);
    }
    absmax = WarpMax(absmax);
    const float needed = KvScaleOf(kFp8, absmax);
    // Slot 0 starts the page (a reused page's old scale is stale); later rows keep the scale
    // unless they need a larger one, which requantizes the segment of rows [0, slot) first.
    const float old_scale = slot == 0 ? 0.0f : *scale;
    const float new_scale = slot == 0 || needed > old_scale ? needed : old_scale;
    if (slot > 0 && new_scale > old_scale) {
      const float ratio = old_scale / new_scale;
      for (int64_t e = lane; e < int64_t{slot} * columns; e += kMlaQuantizedAppendThreads) {
        uint8_t* code = codes + kv.RowElement(static_cast<int>(e / columns)) + e % columns;
        *code = RescaleKvCode(kFp8, *code, ratio);
      }
    }
    const float inverse = new_scale > 0.0f ? 1.0f / new_scale : 0.0f;
    uint8_t* row = codes + kv.RowElement(slot);
    for (int c = lane; c < columns; c += kMlaQuantizedAppendThreads) {
      row[c] = QuantizeKvValue(kFp8, x[c], inverse);
    }
    simt::SyncBlock();  // Every lane has read *scale.
    if (lane == 0) *scale = new_scale;
    simt::SyncBlock();  // The next row reads it.
  }
}

// Block (head, chunk) of grid (num_heads, ceil(rows / kMlaProjectionRows)); `q_nope` is dynamic
// shared memory of kMlaProjectionRows * nope floats.
ATTNSERVE_SIMT void MlaQueryBlock(const MlaQueryParams& p, int head, int chunk, float* q_nope) {
  const int tid = simt::ThreadIndex();
  const int qk = p.nope + p.rope_dim;
  const int width = p.latent + p.rope_dim;
  const int row0 = chunk * kMlaProjectionRows;
  const int rows = p.rows - row0 < kMlaProjectionRows ? p.rows - row0 : kMlaProjectionRows;
  for (int e = tid; e < rows * p.nope; e += kMlaLatentThreads) {
    const int r = e / p.nope, n = e % p.nope;
    q_nope[r * p.nope + n] = p.q[(int64_t{row0 + r} * p.num_heads + head) * qk + n];
  }
  // RoPE(q_pe) straight into the query's tail (a copy without RoPE: q_pe still meets k_pe).
  const int half = p.rope.pairs();
  if (half > 0) {
    for (int e = tid; e < rows * half; e += kMlaLatentThreads) {
      const int r = e / half, i = e % half;
      const int64_t flat = int64_t{row0 + r} * p.num_heads + head;
      RotateMlaPair(p.rope, p.positions[row0 + r], p.q + flat * qk + p.nope,
                    p.q_latent + flat * width + p.latent, i);
    }
  } else {
    for (int e = tid; e < rows * p.rope_dim; e += kMlaLatentThreads) {
      const int r = e / p.rope_dim, i = e % p.rope_dim;
      const int64_t flat = int64_t{row0 + r} * p.num_heads + head;
      p.q_latent[flat * width + p.latent + i] = p.q[flat * qk + p.nope + i];
    }
  }
  simt::SyncBlock();
  // q_lat[r, 0:latent] = q_nope[r] . W_UK_h: thread per latent column, W_UK_h read once.
  const float* w = p.w_uk + int64_t{head} * p.w_uk_head_stride;
  for (int l = tid; l < p.latent; l += kMlaLatentThreads) {
    float acc[kMlaProjectionRows];
    for (int r = 0; r < kMlaProjectionRows; ++r) acc[r] = 0.0f;
    for (int n = 0; n < p.nope; ++n) {
      const float weight = w[int64_t{n} * p.latent + l];
      ATTNSERVE_UNROLL
      for (int r = 0; r < kMlaProjectionRows; ++r) {
        if (r < rows) acc[r] = fmaf(q_nope[r * p.nope + n], weight, acc[r]);
      }
    }
    for (int r = 0; r < rows; ++r) {
      p.q_latent[(int64_t{row0 + r} * p.num_heads + head) * width + l] = acc[r];
    }
  }
}

// Block (head, chunk) of grid (num_heads, ceil(rows / kMlaProjectionRows)); `o_lat` is dynamic
// shared memory of kMlaProjectionRows * latent floats.
ATTNSERVE_SIMT void MlaOutputBlock(const MlaOutputParams& p, int head, int chunk, float* o_lat) {
  const int tid = simt::ThreadIndex();
  const int row0 = chunk * kMlaProjectionRows;
  const int rows = p.rows - row0 < kMlaProjectionRows ? p.rows - row0 : kMlaProjectionRows;
  for (int e = tid; e < rows * p.latent; e += kMlaLatentThreads) {
    const int r = e / p.latent, l = e % p.latent;
    const int64_t e_in = (int64_t{row0 + r} * p.num_heads + head) * p.latent + l;
    o_lat[r * p.latent + l] =
        p.o_latent != nullptr
            ? p.o_latent[e_in]
            : KvElement<KvType::kBF16>::Load(
                  static_cast<const __nv_bfloat16*>(p.o_latent_bf16) + e_in);
  }
  simt::SyncBlock();
  const float* w = p.w_uv_t + int64_t{head} * p.latent * p.v;
  for (int j = tid; j < p.v; j += kMlaLatentThreads) {
    float acc[kMlaProjectionRows];
    for (int r = 0; r < kMlaProjectionRows; ++r) acc[r] = 0.0f;
    for (int l = 0; l < p.latent; ++l) {
      const float weight = w[int64_t{l} * p.v + j];
      ATTNSERVE_UNROLL
      for (int r = 0; r < kMlaProjectionRows; ++r) {
        if (r < rows) acc[r] = fmaf(o_lat[r * p.latent + l], weight, acc[r]);
      }
    }
    for (int r = 0; r < rows; ++r) {
      p.out[(int64_t{row0 + r} * p.num_heads + head) * p.v + j] = acc[r];
    }
  }
}

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_MLA_MLA_LATENT_CUH_
