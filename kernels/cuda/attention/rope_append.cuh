// RoPE fused with the KV append: RMS-normalises each row's q and k heads when the layer has a q/k
// norm (RmsNormHead, variant_hooks.cuh), rotates their first rotary_dim dims (both layouts;
// partial rotary rotates fewer than head_dim), writes q back in place and k, v into the row's page
// slot in the page dtype (round to nearest even). One block per batch row. Written against simt.h,
// so tests run it on the CPU block emulator. 8-bit pages are written by kv_append.cuh instead.
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_ROPE_APPEND_CUH_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_ROPE_APPEND_CUH_

#include <cstdint>

#include "kernels/cuda/attention/kv_element.cuh"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/variant_hooks.cuh"
#include "kernels/cuda/simt/simt.h"

namespace attnserve::cuda {

inline constexpr int kRopeAppendThreads = 128;
inline constexpr int kMaxHalfRotary = 128;  // rotary_dim <= 256 (the launcher checks).

struct RopeAppendStorage {
  float cos_table[kMaxHalfRotary];
  float sin_table[kMaxHalfRotary];
};

template <KvType kKv>
ATTNSERVE_SIMT void RopeAppendBlock(const RopeAppendParams& p, int row, RopeAppendStorage& sm) {
  using Elem = KvElement<kKv>;
  using T = typename Elem::T;
  const int tid = simt::ThreadIndex();
  const int half = p.rope.pairs();
  const int head_dim = p.kv.head_dim;
  const int kv_heads = p.kv.num_kv_heads;
  // The row's cos/sin table, a thread per pair, by the CPU's formula (RotaryPositions: fp64
  // angles, cos and sin rounded to float, then times YaRN's attention factor).
  for (int i = tid; i < half; i += kRopeAppendThreads) {
    p.rope.PairCosSin(p.positions[row], i, &sm.cos_table[i], &sm.sin_table[i]);
  }
  float* qkv = p.qkv + row * p.qkv_stride;
  // q and k heads are consecutive head_dim-wide vectors: num_heads of q, then kv_heads of k.
  const int rotated_heads = p.num_heads + kv_heads;
  // q/k norm before RoPE, a thread per head (block-uniform branch: no barrier is skipped).
  if (p.qk_norm.q_scale != nullptr) {
    for (int head = tid; head < rotated_heads; head += kRopeAppendThreads) {
      const float* scale = head < p.num_heads ? p.qk_norm.q_scale : p.qk_norm.k_scale;
      RmsNormHead(qkv + int64_t{head} * head_dim, head_dim, scale, p.qk_norm.eps);
    }
  }
  simt::SyncBlock();  // The tables and the normalised heads.
  for (int e = tid; e < rotated_heads * half; e += kRopeAppendThreads) {
    const int head = e / half, i = e % half;
    float* x = qkv + int64_t{head} * head_dim;
    p.rope.RotatePair(x, x, i, sm.cos_table[i], sm.sin_table[i]);
  }
  simt::SyncBlock();
  // 8-bit pages: QuantizedAppendBlock (kv_append.cuh) appends the rotated k and v after this
  // kernel, a sequence's rows in order (a page's scale depends on its earlier rows).
  if (IsQuantized(p.kv_type)) return;
  // Append k and v to the row's slot.
  const SequenceDesc seq = p.sequences[p.row_sequence[row]];
  const int index = seq.first_index + (row - seq.first_row);
  const int64_t page_offset = p.kv.page_offsets[seq.first_page + index / p.kv.page_size];
  if (page_offset < 0) return;  // Impossible for a correct plan: new tokens' pages are reserved.
  T* page = reinterpret_cast<T*>(static_cast<char*>(p.kv.pool) + page_offset);
  const int slot = index % p.kv.page_size;
  const float* k = qkv + int64_t{p.num_heads} * head_dim;
  const float* v = k + int64_t{kv_heads} * head_dim;
  for (int e = tid; e < kv_heads * head_dim; e += kRopeAppendThreads) {
    const int h = e / head_dim, d = e % head_dim;
    const int64_t element = p.kv.KeyElement(h, slot) + d;
    Elem::Store(page + element, k[e]);
    Elem::Store(page + p.kv.ValueOffset() + element, v[e]);
  }
}

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_ROPE_APPEND_CUH_
