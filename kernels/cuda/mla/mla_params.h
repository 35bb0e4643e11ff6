// Plain parameter structs of the CUDA MLA kernels (DeepSeek-V2/V3 multi-head latent attention in
// the absorbed form), shared by the host layer (kernels/cuda/layer/cuda_mla_layer.cc, C++20) and
// the kernels (nvcc, C++17). No absl, no allocation; every pointer is device memory.
//
// The absorbed form (the CPU's AbsorbedDecode, kernels/cpu/mla_layer.cc), per row and head h:
//   q_lat_h = [q_nope_h . W_UK_h | RoPE(q_pe_h)]        [latent + rope]
//   o_lat_h = softmax(scale * q_lat_h . [c | k_pe]^T) . c     over the cached rows
//   out_h   = o_lat_h . W_UV_h^T                          [v_head_dim]
// so attention is MQA with num_heads query rows per token over one shared "KV head" whose key is
// the whole cached row [c_kv | k_pe] and whose value is its first kv_lora_rank elements.
#ifndef ATTNSERVE_KERNELS_CUDA_MLA_MLA_PARAMS_H_
#define ATTNSERVE_KERNELS_CUDA_MLA_MLA_PARAMS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/core/host_device.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/kv/page_layout.h"
#include "kernels/spec/attention_variation.h"

namespace attnserve::cuda {

// The latent pages, as the CPU lays them out (kernels/kv/page_layout.h):
// [page_size][latent_dim + rope_dim], latent c_kv first, then the rotated k_pe. 8-bit pages
// (fp8 e4m3, int8: 1-byte codes) end with two float32 scales, the latent's then the RoPE key's
// (MlaPageScaleCount), from byte ScalesOffset() on.
struct MlaPagedKv {
  void* pool = nullptr;                   // Device page pool base.
  const int64_t* page_offsets = nullptr;  // [pages of all sequences] bytes from `pool`, or -1.
  int page_size = 0;                      // Tokens per page.
  int latent_dim = 0;                     // kv_lora_rank: the value width.
  int rope_dim = 0;                       // qk_rope_head_dim.

  ATTNSERVE_HD int row_width() const { return latent_dim + rope_dim; }  // The key width.
  ATTNSERVE_HD int64_t RowElement(int slot) const {
    return MlaPageRowElement(row_width(), slot);
  }
  // 8-bit pages: bytes from a page's start to its latent scale; the RoPE key's follows.
  ATTNSERVE_HD int64_t ScalesOffset() const {
    return QuantizedPageScaleOffset(int64_t{page_size} * row_width());
  }
};

// One block per row: RMSNorm of the q latent (q_lora_rank > 0) and of c_kv, RoPE of k_pe, and
// the row [c_kv | k_pe] stored into its page slot in the page type (round to nearest even). 8-bit
// pages: the rows stay in `latent` and a second kernel quantizes them into their pages, a block
// per (sequence, scale) walking the sequence's rows in order (MlaQuantizedAppendBlock).
struct MlaAppendParams {
  float* q_latent = nullptr;           // [rows, q_lora], normalised in place; null if q_lora == 0.
  const float* q_norm = nullptr;       // [q_lora] RMSNorm weight.
  int q_lora = 0;
  float* latent = nullptr;             // [rows, latent_dim + rope_dim], normalised/rotated in place.
  const float* kv_norm = nullptr;      // [latent_dim] RMSNorm weight.
  float eps = 1e-6f;
  const int64_t* positions = nullptr;       // [rows] RoPE positions.
  const int* row_sequence = nullptr;        // [rows] index into `sequences`.
  const SequenceDesc* sequences = nullptr;  // [batch]
  RotaryPositions rope;  // The layer's (qk_rope_head_dim wide, or none); inv_freq on the device.
  int rows = 0;
  int batch = 0;  // Sequences: 8-bit pages' grid.
  KvType kv_type = KvType::kF32;
  MlaPagedKv kv;
};

// The absorbed queries: one block per row, every head.
//   q_lat[r, h, 0:latent]           = q[r, h, 0:nope] . W_UK_h   (W_UK_h [nope, latent])
//   q_lat[r, h, latent:latent+rope] = RoPE(q[r, h, nope:nope+rope])   (copied without RoPE)
struct MlaQueryParams {
  const float* q = nullptr;  // [rows, num_heads, nope + rope] (q_proj / q_b_proj output).
  // W_UK of head h, [nope, latent] row-major, at w_uk + h * w_uk_head_stride: kv_b_proj's rows
  // [h (nope + v), h (nope + v) + nope), so the checkpoint layout is read in place.
  const float* w_uk = nullptr;
  int64_t w_uk_head_stride = 0;
  float* q_latent = nullptr;  // [rows, num_heads, latent + rope]
  const int64_t* positions = nullptr;  // [rows]
  RotaryPositions rope;  // The layer's (qk_rope_head_dim wide, or none); inv_freq on the device.
  int rows = 0;
  int num_heads = 0;
  int nope = 0;
  int rope_dim = 0;  // qk_rope_head_dim, rotated or not (rope.rotary_dim is 0 without RoPE).
  int latent = 0;
};

// The attention output up-projected: one block per row, every head.
//   out[r, h, 0:v] = o_lat[r, h, 0:latent] . W_UV_h^T,  W_UV_h^T [latent, v] (transposed once at
//   upload, so consecutive threads read consecutive weights).
struct MlaOutputParams {
  const float* o_latent = nullptr;  // [rows, num_heads, latent], or null when ...
  const void* o_latent_bf16 = nullptr;  // ... it is bf16 (FlashInfer's MLA output).
  const float* w_uv_t = nullptr;    // [num_heads, latent, v]
  float* out = nullptr;             // [rows, num_heads * v]
  int rows = 0;
  int num_heads = 0;
  int latent = 0;
  int v = 0;
};

// The absorbed paged attention (mla_attention.cuh), decode (split-KV) and prefill alike: a block
// owns up to kMlaRowsPerBlock (token, head) rows of one sequence and walks its key range.
struct MlaAttentionParams {
  const float* q = nullptr;  // [rows, num_heads, latent + rope] absorbed queries (q_lat).
  float* out = nullptr;      // [rows, num_heads, latent] normalised output (prefill; decode: the
                             // combine writes it).
  int num_heads = 0;
  float scale = 1.0f;  // Multiplies q_lat . [c | k_pe].
  MaskSpec mask;
  MlaPagedKv kv;
  const SequenceDesc* sequences = nullptr;  // [batch]
  int batch = 0;
  // Prefill: rows flattened as (token, head), row = token * num_heads + h, [row_begin, row_end).
  // Decode: one KV split of one sequence; grid.y picks kMlaRowsPerBlock heads.
  const WorkItem* items = nullptr;  // [num_items]
  int num_items = 0;
  // Decode only: partial softmax states per (item, head), merged by the GQA path's combine
  // (combine.cuh) with head_dim = latent.
  float* partial_max = nullptr;     // [num_items, num_heads]
  float* partial_sum = nullptr;     // [num_items, num_heads]
  float* partial_acc = nullptr;     // [num_items, num_heads, latent]
  const int* item_begin = nullptr;  // [batch + 1]
};

inline constexpr int kMlaThreads = 128;
inline constexpr int kMlaRowsPerBlock = 16;  // Query rows (heads) per block.
inline constexpr int kMlaKeysPerTile = 16;   // Keys per shared-memory tile (<= 32: lane per key).
// sm_80's opt-in shared memory per block is 163 KB: one block's tile must fit it (512 + 64 takes
// 105 KB, MlaTileLayout).
inline constexpr int64_t kMlaMaxSharedBytes = 160 * 1024;
// The kernels around the attention (mla_latent.cuh): threads, and rows per block of the query and
// output kernels (each weight element read once per 16 rows).
inline constexpr int kMlaLatentThreads = 128;
inline constexpr int kMlaProjectionRows = 16;
// The 8-bit latent append: one warp per (sequence, scale), as the GQA path's (kv_append.cuh).
inline constexpr int kMlaQuantizedAppendThreads = 32;

// Where a block's arrays sit in its dynamic shared memory, in 4-byte words.
struct MlaTileLayout {
  int width = 0;   // latent + rope: the key width.
  int latent = 0;  // The value width.
  int q = 0, o = 0, k = 0, s = 0, m = 0, l = 0, corr = 0, lo = 0, hi = 0, out_row = 0, words = 0;

  ATTNSERVE_HD MlaTileLayout(int latent_dim, int rope_dim)
      : width(latent_dim + rope_dim), latent(latent_dim) {
    q = 0;                                      // [rows][width] pre-scaled queries
    o = q + kMlaRowsPerBlock * width;           // [rows][latent] unnormalised outputs
    k = o + kMlaRowsPerBlock * latent;          // [keys][width + 1] (+1: distinct banks)
    s = k + kMlaKeysPerTile * (width + 1);      // [rows][keys] scores, then probabilities
    m = s + kMlaRowsPerBlock * kMlaKeysPerTile;  // [rows] running max
    l = m + kMlaRowsPerBlock;                    // [rows] running sum
    corr = l + kMlaRowsPerBlock;                 // [rows] exp(m_old - m_new) of the tile
    lo = corr + kMlaRowsPerBlock;                // [rows] int: visible keys [lo, hi)
    hi = lo + kMlaRowsPerBlock;                  // [rows] int
    out_row = hi + kMlaRowsPerBlock;             // [rows] int: prefill's (token, head) output row
    words = out_row + kMlaRowsPerBlock;
  }
  ATTNSERVE_HD int64_t bytes() const { return int64_t{words} * 4; }
};

// Launchers (block functions in mla_attention.cuh and mla_latent.cuh; kernels in mla_*.cu). They
// return the launch error; the caller turns it into an absl::Status.
template <KvType kKv>
cudaError_t LaunchMlaPrefill(const MlaAttentionParams& params, cudaStream_t stream);
template <KvType kKv>
cudaError_t LaunchMlaDecode(const MlaAttentionParams& params, cudaStream_t stream);
cudaError_t LaunchMlaAppend(const MlaAppendParams& params, cudaStream_t stream);
cudaError_t LaunchMlaQuery(const MlaQueryParams& params, cudaStream_t stream);
cudaError_t LaunchMlaOutput(const MlaOutputParams& params, cudaStream_t stream);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_MLA_MLA_PARAMS_H_
