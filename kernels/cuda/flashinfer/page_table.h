// The batch's page table as FlashInfer reads it (paged_kv_view.h), built on the host from the
// layer's BatchPlan: per sequence its pages as indices in a unit that divides every page offset,
// leading pages a sliding window evicted left out, the tokens in its last page, and the query-row
// bounds of its new tokens. Plain C++ (no CUDA calls), so it is unit-tested on the CPU.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGE_TABLE_H_
#define ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGE_TABLE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cuda/attention/params.h"

namespace attnserve::cuda {

struct FlashInferPageTable {
  std::vector<int32_t> indptr;         // [batch + 1] bounds into page_indices.
  std::vector<int32_t> page_indices;   // Page byte offset / unit, in sequence order.
  std::vector<int32_t> last_page_len;  // [batch] 1..page_size.
  std::vector<int32_t> q_indptr;       // [batch + 1] bounds of each sequence's new rows.
  std::vector<int32_t> kv_len;         // [batch] keys FlashInfer sees (evicted pages left out).
  std::vector<int32_t> kv_pages;       // [batch] pages FlashInfer sees (indptr's differences).
};

// The unit pages are named in: the gcd of the page and slab sizes, so every page offset (a slab
// offset plus a whole number of pages) is a multiple of it.
int64_t FlashInferPageUnitBytes(int64_t page_bytes, int64_t slab_bytes);

// `sequences` and `page_offsets` as PlanBatch made them (offset -1: evicted). INTERNAL when an
// evicted page follows a kept one or an offset is not a multiple of `unit_bytes` (the layer's own
// invariants); INVALID_ARGUMENT when a page index does not fit FlashInfer's int32 indices.
absl::StatusOr<FlashInferPageTable> BuildFlashInferPageTable(
    absl::Span<const SequenceDesc> sequences, absl::Span<const int64_t> page_offsets,
    int page_size, int64_t unit_bytes);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGE_TABLE_H_
