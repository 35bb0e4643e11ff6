// How FlashInfer's paged_kv_t sees attnserve's device page pool: one description shared by the
// decode and prefill adapters (paged_decode.h, paged_prefill.h) and filled by CudaGqaLayer.
//
// Our page layout is [K|V][num_kv_heads][page_size][head_dim] (kernels/kv/page_layout.h), which
// is FlashInfer's HND layout with K and V of one page side by side: K of page index i at
// pool + i * page_stride_elements, V value_offset() elements later, head stride page_size *
// head_dim, token stride head_dim.
//
// Page indices are not page ids. A layer's pages sit in slabs of the device pool at byte offsets
// that are multiples of the page size only within a slab, so the layer names a page by its byte
// offset divided by a unit that divides every such offset (the gcd of page and slab bytes), and
// page_stride_elements is that unit in elements.
//
// Plain C++17 without absl, as params.h: the .cu files include this header.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_KV_VIEW_H_
#define ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_KV_VIEW_H_

#include <cstdint>

#include "kernels/cuda/attention/params.h"

namespace attnserve::cuda {

struct FlashInferPages {
  KvType kv_type = KvType::kBF16;  // kF16 or kBF16 (FlashInfer's kernels read 16-bit pages).
  int head_dim = 0;
  int num_kv_heads = 0;
  int page_size = 0;  // Tokens per page.
  void* pool = nullptr;
  int64_t page_stride_elements = 0;  // Elements between page index i and i + 1 (fits uint32).
  // Device arrays of the batch: [batch + 1] bounds into page_indices; the pages of each sequence
  // in order, leading pages a sliding window evicted left out (FlashInfer's masks count back from
  // the last key, so dropping whole pages in front changes nothing); [batch] tokens in each
  // sequence's last page, 1..page_size.
  const int32_t* indptr = nullptr;
  const int32_t* page_indices = nullptr;
  const int32_t* last_page_len = nullptr;

  int64_t value_offset() const { return int64_t{num_kv_heads} * page_size * head_dim; }
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_KV_VIEW_H_
