#include "kernels/cuda/flashinfer/decode_plan.h"

#include <algorithm>

namespace attnserve::cuda {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Work items when every sequence is cut into chunks of `chunk_pages` pages.
int64_t ItemsForChunk(const std::vector<int32_t>& pages, int64_t chunk_pages) {
  int64_t items = 0;
  for (int32_t p : pages) items += CeilDiv(p, chunk_pages);
  return items;
}

// FlashInfer's PartitionPagedKVCacheBinarySearchMinNumPagePerBatch: the smallest chunk, not below
// `min_chunk_pages`, whose items times kv_heads stay within the budget (or the longest sequence,
// which leaves every sequence whole).
int64_t SmallestChunkWithinBudget(const std::vector<int32_t>& pages, int64_t min_chunk_pages,
                                  int64_t kv_heads, int64_t budget) {
  int64_t low = min_chunk_pages;
  int64_t high = *std::max_element(pages.begin(), pages.end());
  while (low < high) {
    const int64_t mid = (low + high) / 2;
    if (ItemsForChunk(pages, mid) * kv_heads > budget) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return low;
}

// Rounds an int32 offset up to 16 bytes, as FlashInfer's AlignedAllocator places each array.
int Align4(int offset) { return (offset + 3) / 4 * 4; }

}  // namespace

bool PlanFlashInferDecode(const std::vector<int32_t>& visible_pages,
                          const FlashInferDecodeShape& shape, FlashInferDecodePlan* plan) {
  if (visible_pages.empty() || shape.page_size <= 0 || shape.num_heads <= 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0 || shape.grid_budget <= 0) {
    return false;
  }
  for (int32_t p : visible_pages) {
    if (p < 1) return false;
  }
  const int batch = static_cast<int>(visible_pages.size());
  const int64_t kv_heads = shape.num_kv_heads;
  int64_t chunk_pages;
  bool split_kv;
  if (int64_t{batch} * kv_heads >= shape.grid_budget) {
    // The unsplit grid fills the device already.
    split_kv = false;
    chunk_pages = *std::max_element(visible_pages.begin(), visible_pages.end());
  } else {
    // Chunks under 128 tokens would spend more on the merge than they win in parallelism.
    chunk_pages = SmallestChunkWithinBudget(visible_pages, std::max(128 / shape.page_size, 1),
                                            kv_heads, shape.grid_budget);
    split_kv = ItemsForChunk(visible_pages, chunk_pages) != batch;
  }

  // DecodeSplitKVIndptr: the chunks of sequence 0, then of sequence 1, ...
  std::vector<int32_t> request_indices, kv_tile_indices, o_indptr = {0};
  for (int b = 0; b < batch; ++b) {
    const int tiles = static_cast<int>(CeilDiv(visible_pages[b], chunk_pages));
    for (int t = 0; t < tiles; ++t) {
      request_indices.push_back(b);
      kv_tile_indices.push_back(t);
    }
    o_indptr.push_back(o_indptr.back() + tiles);
  }

  FlashInferDecodePlanInfo info;
  info.batch = batch;
  info.split_kv = split_kv;
  info.kv_chunk_pages = static_cast<int>(chunk_pages);
  info.padded_batch_size = static_cast<int>(request_indices.size());
  info.request_indices_offset = 0;
  info.kv_tile_indices_offset = Align4(info.request_indices_offset + info.padded_batch_size);
  info.o_indptr_offset = Align4(info.kv_tile_indices_offset + info.padded_batch_size);
  info.kv_chunk_size_offset = Align4(info.o_indptr_offset + batch + 1);
  if (split_kv) {
    const int64_t rows = int64_t{info.padded_batch_size} * shape.num_heads;
    info.tmp_v_elements = rows * shape.head_dim;
    info.tmp_s_elements = rows;
  }

  plan->packed.assign(static_cast<size_t>(info.kv_chunk_size_offset + 1), 0);
  std::copy(request_indices.begin(), request_indices.end(),
            plan->packed.begin() + info.request_indices_offset);
  std::copy(kv_tile_indices.begin(), kv_tile_indices.end(),
            plan->packed.begin() + info.kv_tile_indices_offset);
  std::copy(o_indptr.begin(), o_indptr.end(), plan->packed.begin() + info.o_indptr_offset);
  plan->packed[info.kv_chunk_size_offset] = static_cast<int32_t>(chunk_pages * shape.page_size);
  plan->info = info;
  return true;
}

}  // namespace attnserve::cuda
