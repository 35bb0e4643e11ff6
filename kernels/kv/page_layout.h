// Where a token's cached rows sit inside one KV page: the one definition of the page layouts, used
// by the CPU backend (KvPageLayout, kernels/cpu/host_page_store.h) and by the CUDA kernels
// (PagedKv, kernels/cuda/attention/params.h). nvcc-safe: no absl, no std headers.
//
//   MHA/MQA/GQA page: [K|V][num_kv_heads][page_size][head_dim]  (one KV head's keys contiguous, so
//                     a GQA group reads each page once per KV head)
//   MLA page:         [page_size][kv_lora_rank + qk_rope_head_dim]  (latent, then RoPE key)
//
// Offsets are in elements of the page's storage type, from the page's start.
//
// 8-bit pages (kernels/kv/quantization.h) append float32 scales after the elements, 4-byte
// aligned, so a page's bytes carry everything needed to read it (a fork or an export copies them
// verbatim): MHA/MQA/GQA [K scale per KV head][V scale per KV head]; MLA [latent, RoPE key].
#ifndef ATTNSERVE_KERNELS_KV_PAGE_LAYOUT_H_
#define ATTNSERVE_KERNELS_KV_PAGE_LAYOUT_H_

#include <stdint.h>

#include "kernels/core/host_device.h"

namespace attnserve {

// MHA/MQA/GQA: the key row of (kv_head, slot).
ATTNSERVE_HD inline int64_t GqaPageKeyElement(int page_size, int head_dim, int kv_head, int slot) {
  return (int64_t{kv_head} * page_size + slot) * head_dim;
}

// MHA/MQA/GQA: the value row of (kv_head, slot) is this far after its key row.
ATTNSERVE_HD inline int64_t GqaPageValueOffset(int page_size, int num_kv_heads, int head_dim) {
  return int64_t{num_kv_heads} * page_size * head_dim;
}

// MHA/MQA/GQA: elements of one page (keys, then values).
ATTNSERVE_HD inline int64_t GqaPageElements(int page_size, int num_kv_heads, int head_dim) {
  return 2 * GqaPageValueOffset(page_size, num_kv_heads, head_dim);
}

// MLA: the row of `slot` ([c_kv | k_pe], `row_width` = kv_lora_rank + qk_rope_head_dim wide).
ATTNSERVE_HD inline int64_t MlaPageRowElement(int row_width, int slot) {
  return int64_t{slot} * row_width;
}

// 8-bit pages: scales per page (MHA/MQA/GQA: K and V of each KV head; MLA: latent and RoPE key).
ATTNSERVE_HD inline int GqaPageScaleCount(int num_kv_heads) { return 2 * num_kv_heads; }
ATTNSERVE_HD inline int MlaPageScaleCount() { return 2; }

// 8-bit pages: bytes from the page's start to its first float32 scale (the 1-byte elements
// rounded up to 4 bytes), and the page's whole size.
ATTNSERVE_HD inline int64_t QuantizedPageScaleOffset(int64_t page_elements) {
  return (page_elements + 3) / 4 * 4;
}
ATTNSERVE_HD inline int64_t QuantizedPageBytes(int64_t page_elements, int scale_count) {
  return QuantizedPageScaleOffset(page_elements) + int64_t{scale_count} * 4;
}

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_PAGE_LAYOUT_H_
