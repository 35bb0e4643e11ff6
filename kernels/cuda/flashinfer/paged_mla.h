// FlashInfer 0.5.3's MLA kernel (mla::BatchMLAPagedAttention, the FA2-style kernel with its own
// split-KV merge) over our latent pages, for bf16 pages at DeepSeek's widths (kv_lora_rank 512,
// qk_rope_head_dim 64), causal. One instance (paged_mla_bf16_512_64.cu) compiled for sm_80 and
// sm_90 as the rest of FlashInfer's instances; the schedule comes from mla_plan.h on the host.
//
// Our page [page_size][512 + 64] is FlashInfer's ckv/kpe pair with both in one row: ckv at the
// row's start and kpe 512 elements on, token stride 576 for both, page stride the unit pages are
// named in (paged_kv_view.h). FlashInfer computes these indices in 32 bits (index * stride_page
// as uint32), so the layer uses it only when every page's element offset fits 2^32.
//
// NOT RUN ON A DEVICE YET: compiled, wired behind --cuda_attention=flashinfer and its host plan
// CPU-tested; no GPU has executed it.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_MLA_H_
#define ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_MLA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/flashinfer/mla_plan.h"

namespace attnserve::cuda {

inline constexpr int kFlashInferMlaLatent = 512;
inline constexpr int kFlashInferMlaRope = 64;

struct FlashInferMlaArgs {
  // Absorbed queries in bf16, [rows, num_heads, 512 + 64]: q_nope is each head's first 512
  // elements, q_pe the last 64.
  const void* q = nullptr;
  int num_heads = 0;
  void* pool = nullptr;               // Page pool base (bf16 elements).
  int64_t page_stride_elements = 0;   // Elements per page index unit (fits uint32).
  int page_size = 0;                  // Tokens per page.
  const int32_t* page_indices = nullptr;  // [pages of the batch] FlashInferPageTable order.
  const int32_t* words = nullptr;     // FlashInferMlaPlan::packed on the device.
  const FlashInferMlaPlan* plan = nullptr;  // Host: offsets into `words`, grid.
  void* partial_o = nullptr;          // plan->partial_o_bytes, 16-byte aligned.
  float* partial_lse = nullptr;       // plan->partial_lse_bytes, 16-byte aligned.
  void* out = nullptr;                // [rows, num_heads, 512] bf16.
  float sm_scale = 1.0f;
};

// Launches the kernel on `stream` (defined only where FlashInfer's headers were found).
cudaError_t LaunchFlashInferMla(const FlashInferMlaArgs& args, cudaStream_t stream);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_MLA_H_
