// The host schedule of FlashInfer's MLA kernel (mla::BatchMLAPagedAttention, FlashInfer 0.5.3)
// over our latent pages: FlashInfer's own MLAPlan (attention/scheduler.cuh) ported to plain C++,
// because MLAPlan queries the device and copies its result itself, where the layer wants one
// int32 array packed into the upload it already makes (plan once, then run).
//
// MLAPlan packs each sequence's (token, head) pairs into rows, row = token * num_heads + h, cuts
// them into cluster tiles of 64 rows (128, two CTAs per cluster, when the average packed query
// length exceeds 64), and balances (tile, KV chunk) works over num_sm / cluster_size clusters with
// a min-heap on cost 2 * tile + keys; a tile whose causal key range exceeds the chunk limit is
// split, and its partial outputs merged by the kernel's own merge phase (merge_* arrays).
//
// Plain C++17 without absl or CUDA, so it has a CPU unit test (tests/gpu/flashinfer_mla_plan_
// test.cc) and the layer's host code can include it.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASHINFER_MLA_PLAN_H_
#define ATTNSERVE_KERNELS_CUDA_FLASHINFER_MLA_PLAN_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace attnserve::cuda {

// One sequence of an MLA call.
struct FlashInferMlaSequence {
  int qo_len = 0;  // New tokens (query rows), >= 0.
  int kv_len = 0;  // Keys the kernel sees, the new ones last: kv_len >= qo_len.
};

struct FlashInferMlaPlan {
  int num_blks_x = 0;  // CTAs per cluster: 1 or 2.
  int num_blks_y = 0;  // Clusters: num_sm / num_blks_x.
  int total_works = 0;
  int merge_ctas = 0;     // Tiles whose key range was split (merged in the kernel).
  int partial_rows = 0;   // Rows of partial output the split works write (partial_o_nnz).
  // Scratch the kernel's split-KV partials need, as MLAPlan sizes them: partial_o in bf16 and
  // partial_lse in float, each 2 * clusters * cluster tile rows, 16-byte aligned.
  int64_t partial_o_bytes = 0;
  int64_t partial_lse_bytes = 0;

  // The int arrays of FlashInfer's MLAParams, each starting on a 16-byte boundary: per work
  // (total_works each) q_indptr, kv_indptr, partial_indptr, q_len, kv_len, q_start, kv_start,
  // kv_end; per SM (num_sm each) merge_packed_offset_start/end, merge_partial_packed_offset_
  // start/end, merge_partial_stride; work_indptr (clusters + 1). Offsets in int32 elements.
  std::vector<int32_t> packed;
  int q_indptr = 0, kv_indptr = 0, partial_indptr = 0, merge_packed_offset_start = 0,
      merge_packed_offset_end = 0, merge_partial_packed_offset_start = 0,
      merge_partial_packed_offset_end = 0, merge_partial_stride = 0, q_len = 0, kv_len = 0,
      q_start = 0, kv_start = 0, kv_end = 0, work_indptr = 0;
};

// The schedule of one call. `q_indptr`: [batch + 1] first query row of each sequence (rows of
// the batch, not packed); `kv_indptr`: [batch + 1] bounds of each sequence's pages in the page
// index array. nullopt for input MLAPlan would refuse: an empty batch, num_heads or num_sm < 1,
// qo_len < 0, kv_len < qo_len, mismatched array sizes, or more merge CTAs than SMs.
std::optional<FlashInferMlaPlan> PlanFlashInferMla(
    const std::vector<FlashInferMlaSequence>& sequences, const std::vector<int32_t>& q_indptr,
    const std::vector<int32_t>& kv_indptr, int num_heads, int head_dim_o, bool causal,
    int num_sm);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASHINFER_MLA_PLAN_H_
