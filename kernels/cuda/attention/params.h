// Plain parameter structs of the CUDA attention kernels, shared by the host planner (C++20) and
// the kernels (nvcc, C++17). Nothing here includes absl or allocates: the host fills these once per
// call from its plan (kernels/cuda/layer/cuda_layer.cc) and the launchers take them by value.
//
// Conventions: every pointer is device memory; shapes are in elements of the pointee type; a
// "row" is one token of the batch; head h of a row belongs to KV head h / group.
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_PARAMS_H_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_PARAMS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/spec/attention_variation.h"
#include "kernels/core/host_device.h"
#include "kernels/kv/page_layout.h"

namespace attnserve::cuda {

// Element type of KV pages (mirrors attnserve::DType and KvStorageFormat without pulling their absl
// headers into nvcc). kFp8/kInt8: 1-byte codes with per-page, per-KV-head float32 scales
// (kernels/kv/quantization.h, arithmetic in kernels/kv/kv_codes.h).
enum class KvType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kFp8 = 3, kInt8 = 4 };

ATTNSERVE_HD inline bool IsQuantized(KvType type) {
  return type == KvType::kFp8 || type == KvType::kInt8;
}

// Which keys a query may see: VisibleKeyRange, the mask rule of kernels/spec/attention_variation.h
// (shared with the CPU's KeyWindow) with 32-bit indices, as the kernels take it (Mistral window:
// i - W < j <= i).
struct MaskSpec {
  int causal = 1;
  int window = 0;  // Tokens; 0 = unlimited.

  // Half-open [*begin, *end) of keys visible to query index `query` of a `length`-token sequence.
  ATTNSERVE_HD void VisibleKeys(int query, int length, int* begin, int* end) const {
    VisibleKeyRange<int>(causal != 0, window, query, length, begin, end);
  }
};

// The device page table of a batch (FlashInfer's paged_kv_t idea): the pages of every sequence of
// the batch flattened into one array, each entry the page's byte offset from the pool base, or -1
// for a page a sliding window evicted (never read: it lies outside every query's window).
// Page layout (kernels/kv/page_layout.h, shared with the CPU):
// [K|V][num_kv_heads][page_size][head_dim].
struct PagedKv {
  void* pool = nullptr;                   // Device page pool base.
  const int64_t* page_offsets = nullptr;  // [pages of all sequences] bytes from `pool`, or -1.
  int page_size = 0;                      // Tokens per page.
  int num_kv_heads = 0;
  int head_dim = 0;
  // 8-bit pages: bytes from a page's start to its float32 scales, [K scale per KV head][V scale
  // per KV head] (kernels/kv/page_layout.h); unused otherwise.
  int64_t scales_offset = 0;

  // Element index within a page of (kv_head, slot)'s key row; the value row is ValueOffset() on.
  ATTNSERVE_HD int64_t KeyElement(int kv_head, int slot) const {
    return GqaPageKeyElement(page_size, head_dim, kv_head, slot);
  }
  ATTNSERVE_HD int64_t ValueOffset() const {
    return GqaPageValueOffset(page_size, num_kv_heads, head_dim);
  }
};

// One sequence of the batch.
struct SequenceDesc {
  int first_row = 0;    // Batch row of its first new token.
  int num_new = 0;      // New tokens (rows) in this call.
  int first_index = 0;  // Index within the sequence of the first new token.
  int length = 0;       // Tokens cached including the new ones.
  int first_page = 0;   // Index of its page 0 in PagedKv::page_offsets.
};

// RMSNorm of every q and k head before RoPE (Qwen3, Gemma 3), hooks in variant_hooks.cuh.
struct QkNormParams {
  const float* q_scale = nullptr;  // [head_dim] w (Qwen3) or 1 + w (Gemma 3, folded on the host);
                                   //   null = no q/k norm.
  const float* k_scale = nullptr;  // [head_dim]
  double eps = 1e-6;
};

// The variations of the attention itself (Gemma 2's soft-cap, BLOOM's and MPT's ALiBi, gpt-oss's
// sinks); the kernels call the hooks of variant_hooks.cuh on it and never branch on its fields
// themselves.
struct AttentionVariantParams {
  float softcap = 0.0f;          // > 0: scaled logits s become softcap * tanh(s / softcap).
  AlibiBias alibi;               // active(): slope(head) * (key - query) added after the soft-cap;
                                 //   the CPU's own policy (spec/attention_variation.h), by value.
  const float* sinks = nullptr;  // [num_heads] a learned logit per query head, one more column of
                                 //   each row's softmax denominator (never of the output); null
                                 //   = none.
};

// RoPE on q and k, then K/V written to the pages (both RoPE layouts; none when rotary_dim == 0).
// Only the first rotary_dim dims of each head rotate (partial rotary, Phi-3).
struct RopeAppendParams {
  float* qkv = nullptr;    // [rows, qkv_stride]: q heads, k heads, v heads (bias included).
  int64_t qkv_stride = 0;  // num_heads * head_dim + 2 * num_kv_heads * head_dim.
  const int64_t* positions = nullptr;       // [rows] RoPE positions.
  const int* row_sequence = nullptr;        // [rows] index into `sequences` of each row.
  const SequenceDesc* sequences = nullptr;  // [batch]
  // The layer's RoPE (AttentionVariation::rope), inv_freq in device memory; rotary_dim 0: none.
  RotaryPositions rope;
  int rows = 0;
  int num_heads = 0;
  QkNormParams qk_norm;  // Before RoPE.
  KvType kv_type = KvType::kF32;
  int batch = 0;  // Sequences; 8-bit pages append per sequence (kv_append.cuh).
  PagedKv kv;
};

// A block's share of an attention call: query rows of one sequence and KV head, and a key range.
struct WorkItem {
  int sequence = 0;   // Index into `sequences`.
  int row_begin = 0;  // Prefill: flattened (token, group head) rows [row_begin, row_end) of the
  int row_end = 0;    //   sequence's new tokens, row = token * group + g. Decode: unused (0).
  int key_begin = 0;  // Keys [key_begin, key_end) this block reads (decode: one KV split).
  int key_end = 0;
};

struct AttentionParams {
  const float* q = nullptr;  // [rows, q_stride]; head h at q + row * q_stride + h * head_dim.
  int64_t q_stride = 0;
  float* out = nullptr;  // [rows, num_heads * head_dim], normalised attention output.
  int num_heads = 0;
  int group = 0;       // Query heads per KV head.
  float scale = 1.0f;  // Multiplies q.k.
  MaskSpec mask;
  AttentionVariantParams variant;
  PagedKv kv;
  const SequenceDesc* sequences = nullptr;  // [batch]
  int batch = 0;
  const WorkItem* items = nullptr;  // [num_items]; grid.x = num_items.
  int num_items = 0;
  // Split-KV decode only: each item writes unnormalised partial softmax states, and the combine
  // kernel merges the items of one sequence (items of sequence b are [item_begin[b],
  // item_begin[b + 1])).
  float* partial_max = nullptr;     // [num_items, num_heads]
  float* partial_sum = nullptr;     // [num_items, num_heads]
  float* partial_acc = nullptr;     // [num_items, num_heads, head_dim]
  const int* item_begin = nullptr;  // [batch + 1]
};

// Query rows per block and the launch shape of the attention kernels.
inline constexpr int kAttentionRowsPerBlock = 16;
inline constexpr int kAttentionThreads = 128;
// The tensor-core prefill (prefill_mma.cuh): 4 warps of 16 query rows, 64-key tiles.
inline constexpr int kMmaPrefillWarps = 4;
inline constexpr int kMmaPrefillThreads = 32 * kMmaPrefillWarps;
inline constexpr int kMmaPrefillRows = 16 * kMmaPrefillWarps;
inline constexpr int kMmaPrefillKeys = 64;

// Launchers (helpers -> kernel -> launcher live in attention/*.cuh; one .cu per KV type holds the
// instantiations). They return the launch error; the caller turns it into an absl::Status.
template <KvType kKv, int kHeadDim>
cudaError_t LaunchPagedDecode(const AttentionParams& params, int row_blocks, cudaStream_t stream);
// CUDA-core prefill (f32 and 8-bit pages, and every page type at head dim 256; items of
// kAttentionRowsPerBlock rows).
template <KvType kKv, int kHeadDim>
cudaError_t LaunchPrefill(const AttentionParams& params, cudaStream_t stream);
// Tensor-core prefill (f16/bf16 pages; items of kMmaPrefillRows rows), prefill_mma.cuh.
template <KvType kKv, int kHeadDim>
cudaError_t LaunchMmaPrefill(const AttentionParams& params, cudaStream_t stream);
cudaError_t LaunchCombineSplits(const AttentionParams& params, cudaStream_t stream);
// q/k norm and RoPE, then the K/V append: in the same kernel for f32/f16/bf16 pages, by
// QuantizedAppendBlock (kv_append.cuh) after it for 8-bit pages.
cudaError_t LaunchRopeAppend(const RopeAppendParams& params, cudaStream_t stream);
// dst[e] = src[e] rounded (RNE) to f16/bf16, e < count (kernels/cuda/layer/convert.cu).
cudaError_t LaunchConvertFloats(const float* src, KvType dst_type, void* dst, int64_t count,
                                cudaStream_t stream);
// dst[e] = src[e] converted from src_type to dst_type (f32/f16/bf16 each way; narrowing rounds to
// nearest even, widening is exact), e < count: the uploaded input from its wire dtype to the
// activation dtype (kernels/cuda/layer/convert.cu).
cudaError_t LaunchConvertActivations(const void* src, KvType src_type, void* dst,
                                     KvType dst_type, int64_t count, cudaStream_t stream);
// *first_bad = min(*first_bad, e) for every e < count whose data[e] is not finite or has
// |data[e]| >= limit (the magnitude that rounds to infinity in the output's dtype). The caller
// sets *first_bad to ~0 first (kernels/cuda/layer/convert.cu).
cudaError_t LaunchFindNonFinite(const float* data, int64_t count, float limit,
                                unsigned long long* first_bad, cudaStream_t stream);
// dst[r, :] = bias for r < rows (before a GEMM with beta = 1).
cudaError_t LaunchBroadcastRows(float* dst, const float* bias, int rows, int cols,
                                cudaStream_t stream);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_PARAMS_H_
