// The split-KV schedule of FlashInfer's batch decode kernel (paged_decode.h), computed on the host
// with the semantics of FlashInfer 0.5.3's DecodePlan (attention/scheduler.cuh: the work
// estimation of BatchDecodeWithPagedKVCacheWorkEstimationDispatched,
// PartitionPagedKVCacheBinarySearchMinNumPagePerBatch and DecodeSplitKVIndptr), without CUDA
// graphs. DecodePlan itself is not called: it needs the device, a work-estimation callback and
// FlashInfer's own workspace buffers; here the launch budget is measured once by the .cu
// (FlashInferDecodeGridBudget) and passed in, and the arrays come back as one int32 vector the
// layer uploads as one section.
//
// The rule: a grid of batch x kv_heads blocks that already fills the device (batch * kv_heads >=
// budget) is not split. Otherwise the KV of each sequence is cut into chunks of kv_chunk_pages
// pages, the smallest chunk (at least 128 tokens' worth of pages) that keeps the split grid
// within the budget; if no sequence is cut, nothing is split either.
//
// Plain C++17 without absl or CUDA, as params.h: the .cu includes this header.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASHINFER_DECODE_PLAN_H_
#define ATTNSERVE_KERNELS_CUDA_FLASHINFER_DECODE_PLAN_H_

#include <cstdint>
#include <vector>

namespace attnserve::cuda {

struct FlashInferDecodeShape {
  int page_size = 0;  // Tokens per page.
  int num_heads = 0;  // Query heads (sizes the scratch).
  int num_kv_heads = 0;
  int head_dim = 0;
  // Blocks the device runs at once for the chosen instance: multiprocessors x blocks per SM
  // (FlashInferDecodeGridBudget).
  int grid_budget = 0;
};

// The host scalars the launch needs besides the packed arrays.
struct FlashInferDecodePlanInfo {
  int batch = 0;
  bool split_kv = false;
  int kv_chunk_pages = 0;     // Pages per KV chunk (every chunk but a sequence's last is full).
  int padded_batch_size = 0;  // Work items = grid.x: the chunks of all sequences.
  // Offsets in int32 elements into the packed vector, each 16-byte aligned as FlashInfer's own
  // workspace: [padded_batch_size] request_indices (the sequence of item i), [padded_batch_size]
  // kv_tile_indices (its chunk within the sequence), [batch + 1] o_indptr (first item of each
  // sequence), [1] kv_chunk_size in tokens.
  int request_indices_offset = 0;
  int kv_tile_indices_offset = 0;
  int o_indptr_offset = 0;
  int kv_chunk_size_offset = 0;
  // Split-KV scratch, zero without split: partial outputs [padded_batch_size, num_heads,
  // head_dim] in the output's 16-bit type (FlashInfer's tmp_v is of the output type) and their
  // log-sum-exps [padded_batch_size, num_heads] float.
  int64_t tmp_v_elements = 0;
  int64_t tmp_s_elements = 0;
};

struct FlashInferDecodePlan {
  FlashInferDecodePlanInfo info;
  std::vector<int32_t> packed;  // Upload as one int32 section; offsets in `info`.
};

// The schedule for sequences whose visible KV spans visible_pages[b] pages each (leading evicted
// pages not counted; at least 1: the new token's own). False, leaving *plan untouched, for an
// empty batch, a sequence of no page or a non-positive shape field.
bool PlanFlashInferDecode(const std::vector<int32_t>& visible_pages,
                          const FlashInferDecodeShape& shape, FlashInferDecodePlan* plan);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASHINFER_DECODE_PLAN_H_
