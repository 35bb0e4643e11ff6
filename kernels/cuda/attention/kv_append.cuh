// Quantize-on-append for 8-bit KV pages (fp8 e4m3, int8): the rule of kernels/kv/quantization.h
// as the CPU's WritePageRow (kernels/cpu/host_page_store.cc) applies it, with the arithmetic of
// kernels/kv/kv_codes.h, so a page holds the same bytes whichever backend wrote it (forks and
// exports copy pages verbatim between them).
//
// A page's scale (per KV head, for K and for V) is set by its slot-0 row and grows, a power of two
// at a time, when a later row's absmax needs more; the page's earlier rows are then requantized.
// That makes the rows of one page sequential, so a block owns one (sequence, KV head, K or V)
// and walks the sequence's new rows in order; a warp shares each row's absmax and codes.
// Runs after the RoPE kernel (rope_append.cuh), which leaves rotated k and v in qkv for 8-bit
// pages. Written against simt.h: the CPU block emulator runs the same source in CI.
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_KV_APPEND_CUH_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_KV_APPEND_CUH_

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention/kv_element.cuh"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/simt/simt.h"
#include "kernels/kv/kv_codes.h"

namespace attnserve::cuda {

inline constexpr int kQuantizedAppendThreads = 32;  // One warp.

// Block (b, kv_head, is_value) of grid (batch, num_kv_heads, 2).
template <bool kFp8>
ATTNSERVE_SIMT void QuantizedAppendBlock(const RopeAppendParams& p, int b, int kv_head,
                                         int is_value) {
  const int lane = simt::ThreadIndex();
  const SequenceDesc seq = p.sequences[b];
  const PagedKv& kv = p.kv;
  const int head_dim = kv.head_dim;
  // This (KV head, K or V)'s columns in a qkv row: q heads, then k heads, then v heads.
  const int64_t column = int64_t{p.num_heads + is_value * kv.num_kv_heads + kv_head} * head_dim;
  const int64_t value_offset = is_value ? kv.ValueOffset() : 0;
  for (int i = 0; i < seq.num_new; ++i) {  // Block-uniform: every lane runs every row.
    const int index = seq.first_index + i;
    const int64_t page_offset = kv.page_offsets[seq.first_page + index / kv.page_size];
    if (page_offset < 0) continue;  // Impossible for a correct plan: new tokens' pages exist.
    char* page = static_cast<char*>(kv.pool) + page_offset;
    uint8_t* codes = reinterpret_cast<uint8_t*>(page);
    float* scale = reinterpret_cast<float*>(page + kv.scales_offset) +
                   is_value * kv.num_kv_heads + kv_head;
    const int slot = index % kv.page_size;
    const float* x = p.qkv + int64_t{seq.first_row + i} * p.qkv_stride + column;
    // The row's finite absmax (a non-finite value never sets the scale; it is stored as NaN).
    float absmax = 0.0f;
    for (int d = lane; d < head_dim; d += kQuantizedAppendThreads) {
      const float magnitude = fabsf(x[d]);
      if (magnitude <= 3.402823466e38f) absmax = fmaxf(absmax, magnitude);
    }
    absmax = WarpMax(absmax);
    const float needed = KvScaleOf(kFp8, absmax);
    // Slot 0 starts the page (a reused page's old scale is stale); later rows keep the scale
    // unless they need a larger one, which requantizes the page's rows [0, slot) first.
    const float old_scale = slot == 0 ? 0.0f : *scale;
    const float new_scale = slot == 0 || needed > old_scale ? needed : old_scale;
    // A KV head's rows of one page are consecutive: slots [0, slot) are one run of codes.
    uint8_t* first_row = codes + kv.KeyElement(kv_head, 0) + value_offset;
    if (slot > 0 && new_scale > old_scale) {
      const float ratio = old_scale / new_scale;
      for (int64_t e = lane; e < int64_t{slot} * head_dim; e += kQuantizedAppendThreads) {
        first_row[e] = RescaleKvCode(kFp8, first_row[e], ratio);
      }
    }
    const float inverse = new_scale > 0.0f ? 1.0f / new_scale : 0.0f;
    uint8_t* row = first_row + int64_t{slot} * head_dim;
    for (int d = lane; d < head_dim; d += kQuantizedAppendThreads) {
      row[d] = QuantizeKvValue(kFp8, x[d], inverse);
    }
    simt::SyncBlock();  // Every lane has read *scale.
    if (lane == 0) *scale = new_scale;
    simt::SyncBlock();  // The next row reads it.
  }
}

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_KV_APPEND_CUH_
