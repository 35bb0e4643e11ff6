// The FlashInfer MLA instance: bf16 queries, pages and output, 512 + 64, causal (paged_mla.h).
#include <cuda_bf16.h>

#include <flashinfer/attention/mla.cuh>
#include <flashinfer/attention/mla_params.cuh>

#include "kernels/cuda/flashinfer/paged_mla.h"

namespace attnserve::cuda {

cudaError_t LaunchFlashInferMla(const FlashInferMlaArgs& a, cudaStream_t stream) {
  using Params = flashinfer::MLAParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int32_t>;
  constexpr int kWidth = kFlashInferMlaLatent + kFlashInferMlaRope;
  const FlashInferMlaPlan& plan = *a.plan;
  int32_t* words = const_cast<int32_t*>(a.words);
  auto* q = static_cast<__nv_bfloat16*>(const_cast<void*>(a.q));
  auto* pool = static_cast<__nv_bfloat16*>(a.pool);
  Params p{};
  p.q_nope = q;
  p.q_pe = q + kFlashInferMlaLatent;
  p.ckv = pool;
  p.kpe = pool + kFlashInferMlaLatent;
  p.partial_o = static_cast<__nv_bfloat16*>(a.partial_o);
  p.partial_lse = a.partial_lse;
  p.final_o = static_cast<__nv_bfloat16*>(a.out);
  p.final_lse = nullptr;
  p.q_indptr = words + plan.q_indptr;
  p.kv_indptr = words + plan.kv_indptr;
  p.partial_indptr = words + plan.partial_indptr;
  p.merge_packed_offset_start = words + plan.merge_packed_offset_start;
  p.merge_packed_offset_end = words + plan.merge_packed_offset_end;
  p.merge_partial_packed_offset_start = words + plan.merge_partial_packed_offset_start;
  p.merge_partial_packed_offset_end = words + plan.merge_partial_packed_offset_end;
  p.merge_partial_stride = words + plan.merge_partial_stride;
  p.kv_indices = const_cast<int32_t*>(a.page_indices);
  p.q_len = words + plan.q_len;
  p.kv_len = words + plan.kv_len;
  p.q_start = words + plan.q_start;
  p.kv_start = words + plan.kv_start;
  p.kv_end = words + plan.kv_end;
  p.work_indptr = words + plan.work_indptr;
  p.block_size = flashinfer::uint_fastdiv(static_cast<uint32_t>(a.page_size));
  p.num_heads = flashinfer::uint_fastdiv(static_cast<uint32_t>(a.num_heads));
  p.q_nope_stride_n = static_cast<uint32_t>(a.num_heads * kWidth);
  p.q_nope_stride_h = kWidth;
  p.q_pe_stride_n = p.q_nope_stride_n;
  p.q_pe_stride_h = kWidth;
  p.ckv_stride_page = static_cast<uint32_t>(a.page_stride_elements);
  p.ckv_stride_n = kWidth;
  p.kpe_stride_page = p.ckv_stride_page;
  p.kpe_stride_n = kWidth;
  p.o_stride_n = static_cast<uint32_t>(a.num_heads * kFlashInferMlaLatent);
  p.o_stride_h = kFlashInferMlaLatent;
  p.sm_scale = a.sm_scale;
  p.return_lse_base_on_e = false;
  return flashinfer::mla::BatchMLAPagedAttention<flashinfer::MaskMode::kCausal,
                                                 kFlashInferMlaLatent, kFlashInferMlaRope>(
      p, plan.num_blks_x, plan.num_blks_y, stream);
}

}  // namespace attnserve::cuda
